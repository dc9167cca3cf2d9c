// safetensors reader/writer: round trips, half-precision conversion, and that every kind of
// corrupt file (truncated, bad lengths, bad JSON, bad offsets) throws loom::Error naming the
// file and tensor instead of crashing. Sharded folders: lookup across shards and rejection
// of missing or escaping shard names. Writer: atomic, no leftovers on failure.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "loom/io/safetensors.h"
#include "loom/util/error.h"

namespace loom::io {
namespace {

using loom::test::error_of;

namespace fs = std::filesystem;

// A fresh directory per test, removed at the end (self-contained so this file needs only
// loom_core).
struct Scratch {
  fs::path dir;
  Scratch() {
    static int n = 0;
    dir = fs::temp_directory_path() /
          ("loom-st-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

// Writes u64 header length + header + data by hand, for files the writer refuses to make.
void write_raw(const fs::path& p, const std::string& header, const std::string& data = "",
               std::optional<uint64_t> header_len = std::nullopt) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  const uint64_t n = header_len.value_or(header.size());
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

std::string open_error(const fs::path& p) {
  return error_of([&] { SafetensorsFile::open(p); });
}

std::vector<std::byte> bytes_of(const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  return std::vector<std::byte>(b, b + n);
}

std::vector<std::byte> bytes_of(std::span<const std::byte> s) {
  return std::vector<std::byte>(s.begin(), s.end());
}

TEST(Safetensors, DTypeNamesAndSizes) {
  EXPECT_STREQ(st_dtype_name(StDType::BF16), "BF16");
  EXPECT_STREQ(st_dtype_name(StDType::BOOL), "BOOL");
  EXPECT_EQ(st_dtype_size(StDType::F64), 8u);
  EXPECT_EQ(st_dtype_size(StDType::F16), 2u);
  EXPECT_EQ(st_dtype_size(StDType::U8), 1u);
}

TEST(Safetensors, RoundTripSeveralDTypesAndMetadata) {
  Scratch s;
  const fs::path p = s.dir / "rt.safetensors";
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -7.0f};
  const std::vector<double> f64 = {3.141592653589793, -1e300};
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x7C00};
  const std::vector<uint16_t> bf16 = {0x3F80, 0x4049};
  const std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::min(), 42};
  const std::vector<int32_t> i32 = {-1, 2, 3};
  const std::vector<int8_t> i8 = {-128, 127, 0};
  const std::vector<uint8_t> boolean = {1, 0, 1, 1};
  const int16_t scalar = -300;
  const std::vector<StWriteTensor> ts = {
      {"w.f32", StDType::F32, {2, 3}, f32.data(), f32.size() * 4},
      {"w.f64", StDType::F64, {2}, f64.data(), 16},
      {"w.f16", StDType::F16, {3}, f16.data(), 6},
      {"w.bf16", StDType::BF16, {1, 2}, bf16.data(), 4},
      {"ids", StDType::I64, {2}, i64.data(), 16},
      {"i32", StDType::I32, {3, 1}, i32.data(), 12},
      {"i8", StDType::I8, {3}, i8.data(), 3},
      {"mask", StDType::BOOL, {2, 2}, boolean.data(), 4},
      {"scalar", StDType::I16, {}, &scalar, 2},
      {"empty", StDType::F32, {0, 5}, nullptr, 0},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "héllo \"x\""}};
  write_safetensors(p, ts, meta);
  EXPECT_EQ(s.listing(), std::vector<std::string>{"rt.safetensors"});  // no temp left behind

  // Header padded so the data section starts 8-aligned.
  std::ifstream in(p, std::ios::binary);
  uint64_t hlen = 0;
  in.read(reinterpret_cast<char*>(&hlen), 8);
  EXPECT_EQ(hlen % 8, 0u);

  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.path(), p);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.tensors().size(), ts.size());
  // tensors() is in data-offset order, which is the order given to the writer.
  std::vector<std::string> order;
  for (const auto& v : f.tensors()) order.push_back(v.name);
  std::vector<std::string> given;
  for (const auto& t : ts) given.push_back(t.name);
  EXPECT_EQ(order, given);
  for (const auto& t : ts) {
    const StTensorView* v = f.find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->name, t.name);
    EXPECT_EQ(v->dtype, t.dtype) << t.name;
    EXPECT_EQ(v->shape, t.shape) << t.name;
    EXPECT_EQ(v->data.size(), t.nbytes) << t.name;
    EXPECT_EQ(bytes_of(v->data), bytes_of(t.data, t.nbytes)) << t.name;
  }
  EXPECT_EQ(f.find("scalar")->numel(), 1);
  EXPECT_EQ(f.find("empty")->numel(), 0);
  EXPECT_EQ(f.find("w.f32")->numel(), 6);
  EXPECT_EQ(f.find("nope"), nullptr);

  // Moving keeps the views valid (they point into the mapping, not into the object).
  SafetensorsFile moved = std::move(const_cast<SafetensorsFile&>(f));
  EXPECT_EQ(bytes_of(moved.find("ids")->data), bytes_of(i64.data(), 16));

  // Overwriting an existing file replaces it.
  write_safetensors(p, std::span(ts).first(1));
  EXPECT_EQ(SafetensorsFile::open(p).tensors().size(), 1u);
  EXPECT_TRUE(SafetensorsFile::open(p).metadata().empty());
  EXPECT_EQ(s.listing(), std::vector<std::string>{"rt.safetensors"});
}

TEST(Safetensors, EmptyDataSectionWorks) {
  Scratch s;
  const fs::path p = s.dir / "none.safetensors";
  write_safetensors(p, {});
  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_TRUE(f.tensors().empty());
  // Only zero-byte tensors: data section is empty too.
  write_safetensors(p, std::vector<StWriteTensor>{{"z", StDType::F16, {3, 0}, nullptr, 0}});
  const SafetensorsFile g = SafetensorsFile::open(p);
  ASSERT_EQ(g.tensors().size(), 1u);
  EXPECT_TRUE(g.tensors()[0].data.empty());
  const auto ck = SafetensorsCheckpoint::open(p);
  const int64_t shape[] = {3, 0};
  ck.read_f32("z", shape, nullptr);
}

TEST(Safetensors, ReadF32ConvertsF16BF16F64Exactly) {
  Scratch s;
  const fs::path p = s.dir / "half.safetensors";
  const std::vector<uint16_t> f16 = {
      0x3C00,  // 1
      0xC000,  // -2
      0x3555,  // 0.333251953125
      0x7BFF,  // 65504 (largest normal)
      0x0400,  // 2^-14 (smallest normal)
      0x0001,  // 2^-24 (smallest subnormal)
      0x03FF,  // 1023 * 2^-24 (largest subnormal)
      0x8000,  // -0
      0x7C00,  // inf
      0xFC00,  // -inf
      0x7E00,  // nan
      0xFC01,  // nan (signalling pattern, negative)
  };
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC040, 0x4049, 0x7F80, 0x0001, 0x7FC0};
  const std::vector<double> f64 = {0.1, -1e-3};
  const std::vector<int32_t> i32 = {1, 2};
  write_safetensors(p, std::vector<StWriteTensor>{
                           {"h", StDType::F16, {3, 4}, f16.data(), f16.size() * 2},
                           {"b", StDType::BF16, {6}, bf16.data(), bf16.size() * 2},
                           {"d", StDType::F64, {2}, f64.data(), 16},
                           {"i", StDType::I32, {2}, i32.data(), 8},
                       });
  const auto ck = SafetensorsCheckpoint::open(p);

  std::vector<float> out(12);
  const int64_t hs[] = {3, 4};
  ck.read_f32("h", hs, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.333251953125f);
  EXPECT_EQ(out[3], 65504.0f);
  EXPECT_EQ(out[4], std::ldexp(1.0f, -14));
  EXPECT_EQ(out[5], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[6], std::ldexp(1023.0f, -24));
  EXPECT_EQ(out[7], 0.0f);
  EXPECT_TRUE(std::signbit(out[7]));
  EXPECT_EQ(out[8], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[9], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(out[10]));
  EXPECT_TRUE(std::isnan(out[11]));

  const int64_t bs[] = {6};
  ck.read_f32("b", bs, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(out[2], 3.140625f);
  EXPECT_EQ(out[3], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[4], std::ldexp(1.0f, -133));
  EXPECT_TRUE(std::isnan(out[5]));

  const int64_t ds[] = {2};
  ck.read_f32("d", ds, out.data());
  EXPECT_EQ(out[0], 0.1f);
  EXPECT_EQ(out[1], -1e-3f);

  const std::string e = error_of([&] { ck.read_f32("i", ds, out.data()); });
  EXPECT_NE(e.find("'i'"), std::string::npos) << e;
  EXPECT_NE(e.find("I32"), std::string::npos) << e;
  EXPECT_NE(e.find("half.safetensors"), std::string::npos) << e;
}

TEST(Safetensors, UnalignedDataIsReadSafely) {
  // A 3-byte-padded header puts F32/F64 data at odd addresses; the spec allows any header
  // length, and UBSan would flag typed loads.
  Scratch s;
  const fs::path p = s.dir / "odd.safetensors";
  const float vals[2] = {1.25f, -8.5f};
  const double dv = 2.5;
  std::string data(reinterpret_cast<const char*>(vals), 8);
  data.append(reinterpret_cast<const char*>(&dv), 8);
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F64","shape":[],"data_offsets":[8,16]}}   )",
            data);
  const auto ck = SafetensorsCheckpoint::open(p);
  float out[2];
  const int64_t as[] = {2};
  ck.read_f32("a", as, out);
  EXPECT_EQ(out[0], 1.25f);
  EXPECT_EQ(out[1], -8.5f);
  ck.read_f32("b", {}, out);
  EXPECT_EQ(out[0], 2.5f);
}

TEST(Safetensors, ShapeMismatchNamesTensorFileAndBothShapes) {
  Scratch s;
  const fs::path p = s.dir / "shape.safetensors";
  std::vector<float> w(64 * 192, 0.5f);
  write_safetensors(
      p, std::vector<StWriteTensor>{
             {"h.0.attn.c_attn.weight", StDType::F32, {64, 192}, w.data(), w.size() * 4}});
  const auto ck = SafetensorsCheckpoint::open(p);
  const int64_t want[] = {192, 64};
  const std::string e = error_of([&] { ck.read_f32("h.0.attn.c_attn.weight", want, w.data()); });
  EXPECT_NE(e.find("h.0.attn.c_attn.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("shape.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("[64, 192] vs expected [192, 64]"), std::string::npos) << e;
  // Rank mismatch too.
  const int64_t flat[] = {64 * 192};
  EXPECT_THROW(ck.read_f32("h.0.attn.c_attn.weight", flat, w.data()), Error);

  const std::string m = error_of([&] { ck.read_f32("lm_head.weight", want, w.data()); });
  EXPECT_NE(m.find("lm_head.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("shape.safetensors"), std::string::npos) << m;
  EXPECT_EQ(ck.file_of("h.0.attn.c_attn.weight"), p);
  EXPECT_THROW(ck.file_of("lm_head.weight"), Error);
}

TEST(Safetensors, MissingFileErrorNamesPath) {
  Scratch s;
  const fs::path p = s.dir / "does-not-exist.safetensors";
  EXPECT_THROW(SafetensorsFile::open(p), Error);
  EXPECT_NE(open_error(p).find(p.string()), std::string::npos) << open_error(p);
  const std::string e = error_of([&] { SafetensorsCheckpoint::open(p); });
  EXPECT_NE(e.find(p.string()), std::string::npos) << e;
  // A directory is not a safetensors file; an empty folder is not a checkpoint.
  EXPECT_NE(open_error(s.dir).find("not a regular file"), std::string::npos);
  const std::string d = error_of([&] { SafetensorsCheckpoint::open(s.dir); });
  EXPECT_NE(d.find("model.safetensors"), std::string::npos) << d;
}

TEST(Safetensors, TruncatedFileThrowsAtEveryLength) {
  Scratch s;
  const fs::path good = s.dir / "good.safetensors";
  const std::vector<float> a(10, 1.0f);
  const std::vector<uint16_t> b(7, 0x3C00);
  write_safetensors(good,
                    std::vector<StWriteTensor>{{"a", StDType::F32, {2, 5}, a.data(), 40},
                                               {"b", StDType::BF16, {7}, b.data(), 14}},
                    {{"format", "pt"}});
  const auto size = fs::file_size(good);
  const fs::path cut = s.dir / "cut.safetensors";
  for (uintmax_t n = 0; n < size; ++n) {
    fs::copy_file(good, cut, fs::copy_options::overwrite_existing);
    fs::resize_file(cut, n);
    const std::string e = open_error(cut);
    EXPECT_NE(e, "<no error>") << "truncated at " << n;
    EXPECT_NE(e.find("cut.safetensors"), std::string::npos) << n << ": " << e;
  }
  // Appending garbage is also caught: trailing bytes belong to no tensor.
  fs::copy_file(good, cut, fs::copy_options::overwrite_existing);
  std::ofstream(cut, std::ios::app | std::ios::binary) << "xyz";
  EXPECT_NE(open_error(cut).find("belong to no tensor"), std::string::npos) << open_error(cut);
}

TEST(Safetensors, HeaderLengthChecked) {
  Scratch s;
  const fs::path p = s.dir / "hl.safetensors";
  write_raw(p, "{}", "", 1000);  // claims 1000 header bytes, file has 2
  std::string e = open_error(p);
  EXPECT_NE(e.find("exceeds"), std::string::npos) << e;
  EXPECT_NE(e.find("hl.safetensors"), std::string::npos) << e;

  write_raw(p, "{}", "", std::numeric_limits<uint64_t>::max());
  e = open_error(p);
  EXPECT_NE(e.find("absurdly large"), std::string::npos) << e;

  write_raw(p, "{}", "", 0);  // zero-length header is not JSON
  EXPECT_NE(open_error(p).find("not valid JSON"), std::string::npos);

  std::ofstream(p, std::ios::binary | std::ios::trunc) << "abc";  // shorter than 8 bytes
  EXPECT_NE(open_error(p).find("too short"), std::string::npos) << open_error(p);
}

TEST(Safetensors, MalformedHeaderJson) {
  Scratch s;
  const fs::path p = s.dir / "json.safetensors";
  const auto expect = [&](const std::string& header, const std::string& what) {
    write_raw(p, header);
    const std::string e = open_error(p);
    EXPECT_NE(e.find("json.safetensors"), std::string::npos) << header << " -> " << e;
    EXPECT_NE(e.find(what), std::string::npos) << header << " -> " << e;
  };
  expect(R"({"a": {"dtype": "F32")", "not valid JSON");
  expect("{\"a\": \x01}", "not valid JSON");
  expect(std::string("{}\0\0", 4), "not valid JSON");
  expect("[1, 2]", "not an object");
  expect(R"("str")", "not an object");
  expect(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
         R"("a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})",
         "'a' twice");
}

TEST(Safetensors, MalformedEntriesNameTheTensor) {
  Scratch s;
  const fs::path p = s.dir / "entry.safetensors";
  const auto expect = [&](const std::string& entry, const std::string& what,
                          const std::string& data = std::string(8, '\0')) {
    write_raw(p, R"({"layer.w":)" + entry + "}", data);
    const std::string e = open_error(p);
    EXPECT_NE(e.find("entry.safetensors"), std::string::npos) << entry << " -> " << e;
    EXPECT_NE(e.find("'layer.w'"), std::string::npos) << entry << " -> " << e;
    EXPECT_NE(e.find(what), std::string::npos) << entry << " -> " << e;
  };
  expect(R"([1])", "not a JSON object");
  expect(R"({"shape":[2],"data_offsets":[0,8]})", "missing \"dtype\"");
  expect(R"({"dtype":"F32","data_offsets":[0,8]})", "missing \"shape\"");
  expect(R"({"dtype":"F32","shape":[2]})", "missing \"data_offsets\"");
  expect(R"({"dtype":7,"shape":[2],"data_offsets":[0,8]})", "not a string");
  expect(R"({"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]})", "unknown dtype");
  expect(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})", "not an array");
  expect(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})", "not an integer");
  expect(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})", "not an integer");
  expect(R"({"dtype":"F32","shape":[-2, -1],"data_offsets":[0,8]})", "negative dimension");
  expect(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]})", "too large");
  expect(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})", "overflows");
  expect(R"({"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]})", "overflows");
  expect(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})", "[begin, end] pair");
  expect(R"({"dtype":"F32","shape":[2],"data_offsets":{"a":1}})", "[begin, end] pair");
  expect(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})", "non-negative integers");
  expect(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})", "begin > end");
}

TEST(Safetensors, OffsetsOutOfRange) {
  Scratch s;
  const fs::path p = s.dir / "range.safetensors";
  write_raw(p, R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, 'a'));
  std::string e = open_error(p);
  EXPECT_NE(e.find("'x'"), std::string::npos) << e;
  EXPECT_NE(e.find("run past"), std::string::npos) << e;
  write_raw(p, R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[100,100]}})",
            std::string(8, 'a'));
  EXPECT_NE(open_error(p).find("run past"), std::string::npos) << open_error(p);
  write_raw(p,
            R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,)"
            R"(18446744073709551615]}})",
            std::string(8, 'a'));
  EXPECT_NE(open_error(p).find("'x'"), std::string::npos) << open_error(p);
}

TEST(Safetensors, OverlappingTensorsRejected) {
  Scratch s;
  const fs::path p = s.dir / "overlap.safetensors";
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            std::string(12, '\0'));
  const std::string e = open_error(p);
  EXPECT_NE(e.find("overlap"), std::string::npos) << e;
  EXPECT_NE(e.find("'a'"), std::string::npos) << e;
  EXPECT_NE(e.find("'b'"), std::string::npos) << e;
  EXPECT_NE(e.find("overlap.safetensors"), std::string::npos) << e;
  // Two names on the same bytes.
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  EXPECT_NE(open_error(p).find("overlap"), std::string::npos) << open_error(p);
}

TEST(Safetensors, HoleInDataSectionRejected) {
  Scratch s;
  const fs::path p = s.dir / "hole.safetensors";
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            std::string(12, '\0'));
  const std::string e = open_error(p);
  EXPECT_NE(e.find("hole"), std::string::npos) << e;
  EXPECT_NE(e.find("'b'"), std::string::npos) << e;
}

TEST(Safetensors, ByteLengthMismatchRejected) {
  Scratch s;
  const fs::path p = s.dir / "len.safetensors";
  write_raw(p, R"({"emb":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'x'));
  const std::string e = open_error(p);
  EXPECT_NE(e.find("'emb'"), std::string::npos) << e;
  EXPECT_NE(e.find("8 bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("needs 6"), std::string::npos) << e;
}

TEST(Safetensors, MetadataMustBeStrings) {
  Scratch s;
  const fs::path p = s.dir / "meta.safetensors";
  write_raw(p, R"({"__metadata__":{"format":"pt","step":3}})");
  std::string e = open_error(p);
  EXPECT_NE(e.find("'step'"), std::string::npos) << e;
  EXPECT_NE(e.find("meta.safetensors"), std::string::npos) << e;
  write_raw(p, R"({"__metadata__":["pt"]})");
  EXPECT_NE(open_error(p).find("__metadata__"), std::string::npos);
}

// Two shards + index, the layout save_pretrained writes for large models.
struct ShardedFixture {
  Scratch s;
  std::vector<float> a = {1, 2, 3, 4}, c = {9};
  std::vector<uint16_t> b = {0x4000, 0x4040};  // BF16 2, 3
  ShardedFixture() {
    write_safetensors(s.dir / "model-00001-of-00002.safetensors",
                      std::vector<StWriteTensor>{{"a", StDType::F32, {2, 2}, a.data(), 16},
                                                 {"unlisted", StDType::F32, {1}, c.data(), 4}});
    write_safetensors(s.dir / "model-00002-of-00002.safetensors",
                      std::vector<StWriteTensor>{{"b", StDType::BF16, {2}, b.data(), 4},
                                                 {"c", StDType::F32, {1}, c.data(), 4}});
    write_index(R"({"a":"model-00001-of-00002.safetensors",)"
                R"("b":"model-00002-of-00002.safetensors",)"
                R"("c":"model-00002-of-00002.safetensors"})");
  }
  void write_index(const std::string& weight_map) const {
    std::ofstream(s.dir / "model.safetensors.index.json")
        << R"({"metadata":{"total_size":24},"weight_map":)" << weight_map << "}";
  }
};

TEST(Safetensors, ShardedCheckpointFindsAcrossShards) {
  ShardedFixture fx;
  const auto ck = SafetensorsCheckpoint::open(fx.s.dir);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));  // only what the map lists
  EXPECT_EQ(ck.find("unlisted"), nullptr);
  ASSERT_NE(ck.find("a"), nullptr);
  ASSERT_NE(ck.find("b"), nullptr);
  EXPECT_EQ(ck.file_of("a"), fx.s.dir / "model-00001-of-00002.safetensors");
  EXPECT_EQ(ck.file_of("c"), fx.s.dir / "model-00002-of-00002.safetensors");
  float out[4];
  const int64_t as[] = {2, 2}, bs[] = {2};
  ck.read_f32("a", as, out);
  EXPECT_EQ(std::vector<float>(out, out + 4), fx.a);
  ck.read_f32("b", bs, out);
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(out[1], 3.0f);
  // The index file may be named directly, too.
  EXPECT_EQ(SafetensorsCheckpoint::open(fx.s.dir / "model.safetensors.index.json").names(),
            ck.names());
  // A moved checkpoint keeps working.
  SafetensorsCheckpoint moved = std::move(const_cast<SafetensorsCheckpoint&>(ck));
  moved.read_f32("a", as, out);
  EXPECT_EQ(out[3], 4.0f);
}

TEST(Safetensors, ShardedCheckpointErrors) {
  ShardedFixture fx;
  const auto err = [&] { return error_of([&] { SafetensorsCheckpoint::open(fx.s.dir); }); };

  fx.write_index(R"({"a":"model-00001-of-00002.safetensors","b":"model-00003.safetensors"})");
  std::string e = err();
  EXPECT_NE(e.find("model-00003.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;

  for (const std::string bad :
       {"../model-00001-of-00002.safetensors", "sub/model-00001-of-00002.safetensors", "..", ""}) {
    fx.write_index(R"({"a":")" + bad + R"("})");
    e = err();
    EXPECT_NE(e.find("not a plain file name"), std::string::npos) << bad << " -> " << e;
    EXPECT_NE(e.find("model.safetensors.index.json"), std::string::npos) << e;
  }

  fx.write_index(R"({"b":"model-00001-of-00002.safetensors"})");  // b lives in shard 2
  e = err();
  EXPECT_NE(e.find("'b'"), std::string::npos) << e;
  EXPECT_NE(e.find("model-00001-of-00002.safetensors"), std::string::npos) << e;

  fx.write_index(R"({"a":3})");
  EXPECT_NE(err().find("'a'"), std::string::npos) << err();

  std::ofstream(fx.s.dir / "model.safetensors.index.json") << R"({"weights":{}})";
  EXPECT_NE(err().find("weight_map"), std::string::npos) << err();

  std::ofstream(fx.s.dir / "model.safetensors.index.json") << R"({"weight_map":)";
  e = err();
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors.index.json"), std::string::npos) << e;

  // A corrupt shard is reported with the shard's own name.
  fx.write_index(R"({"a":"model-00001-of-00002.safetensors"})");
  fs::resize_file(fx.s.dir / "model-00001-of-00002.safetensors", 20);
  e = err();
  EXPECT_NE(e.find("model-00001-of-00002.safetensors"), std::string::npos) << e;
}

TEST(Safetensors, FolderWithSingleFile) {
  Scratch s;
  const std::vector<float> w = {1, 2};
  write_safetensors(s.dir / "model.safetensors",
                    std::vector<StWriteTensor>{{"w", StDType::F32, {2}, w.data(), 8}});
  const auto ck = SafetensorsCheckpoint::open(s.dir);
  EXPECT_EQ(ck.names(), std::vector<std::string>{"w"});
  EXPECT_EQ(ck.file_of("w"), s.dir / "model.safetensors");
}

TEST(Safetensors, FailedWriteLeavesNoFileAndNoTemp) {
  Scratch s;
  const fs::path p = s.dir / "out.safetensors";
  const std::vector<float> w = {1, 2, 3, 4};
  const auto err = [&](const std::vector<StWriteTensor>& ts) {
    return error_of([&] { write_safetensors(p, ts); });
  };
  std::string e =
      err({{"w", StDType::F32, {2}, w.data(), 8}, {"w", StDType::F32, {2}, w.data(), 8}});
  EXPECT_NE(e.find("'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("twice"), std::string::npos) << e;
  EXPECT_TRUE(s.listing().empty());

  e = err({{"w", StDType::F32, {2, 2}, w.data(), 12}});
  EXPECT_NE(e.find("needs 16"), std::string::npos) << e;
  EXPECT_NE(err({{"w", StDType::F32, {-1}, w.data(), 0}}).find("negative"), std::string::npos);
  EXPECT_NE(err({{"__metadata__", StDType::F32, {1}, w.data(), 4}}).find("reserved"),
            std::string::npos);
  EXPECT_NE(err({{"w", StDType::F32, {1}, nullptr, 4}}).find("null"), std::string::npos);
  EXPECT_NE(err({{"bad\xff", StDType::F32, {1}, w.data(), 4}}).find("encode"), std::string::npos);
  EXPECT_TRUE(s.listing().empty());

  // A failing write over an existing file keeps the old file intact.
  write_safetensors(p, std::vector<StWriteTensor>{{"old", StDType::F32, {4}, w.data(), 16}});
  EXPECT_NE(err({{"w", StDType::F32, {2}, w.data(), 4}}), "<no error>");
  EXPECT_NE(SafetensorsFile::open(p).find("old"), nullptr);
  EXPECT_EQ(s.listing(), std::vector<std::string>{"out.safetensors"});

  // Unwritable target folder: error names the path, nothing created.
  e = error_of([&] {
    write_safetensors(s.dir / "no-such-dir" / "x.safetensors", std::vector<StWriteTensor>{});
  });
  EXPECT_NE(e.find("no-such-dir"), std::string::npos) << e;
  EXPECT_EQ(s.listing(), std::vector<std::string>{"out.safetensors"});
}

}  // namespace
}  // namespace loom::io
