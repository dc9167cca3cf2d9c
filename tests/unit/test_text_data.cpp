// Pre-training text as users keep it: {"text"} records (JSON array or JSONL, with other keys
// beside "text") give exactly the windows of the same documents in a .txt file separated by
// the tokenizer's EOS; packing restarts positions at each document and predicts nothing
// across a boundary; bad records are named by file:line or record index.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/train/data_setup.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string> kDocs = {
    "The first document.\nIt has two lines.",
    "  第二个文档：你好，世界！ ",
    "",  // an empty document is just its EOS
    "Third one, with {braces} and \"quotes\" and a tab\there.",
    "短",
};

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// The GPT-2-style fixture tokenizer as an HF folder whose tokenizer_config.json names EOS.
train::TextCodec gpt2_codec() {
  test::TempDir dir;
  fs::copy_file(test::fixture_dir() / "tokenizers" / "gpt2_style.json",
                dir.path / "tokenizer.json");
  write(dir.path / "tokenizer_config.json", R"({"eos_token": "<|endoftext|>"})");
  return train::codec_for(io::load_tokenizer(dir.path));
}

train::DataConfig config(const fs::path& path, const std::string& format, int64_t T, bool pack) {
  train::DataConfig c;
  c.sources = {{path.string(), format, 1.0}};
  c.seq_len = T;
  c.pack = pack;
  return c;
}

struct Rows {
  std::vector<int32_t> ids, targets, pos;
};

Rows rows(const data::Dataset& ds) {
  const int64_t T = ds.seq_len();
  Rows r;
  r.ids.resize(ds.size() * T);
  r.targets.resize(ds.size() * T);
  r.pos.resize(ds.size() * T);
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.get(i, r.ids.data() + i * T, r.targets.data() + i * T);
    ds.get_positions(i, r.pos.data() + i * T);
  }
  return r;
}

// The three files of the same documents: .txt with EOS after each, a JSON array and JSONL,
// both with keys beside "text".
struct Files {
  test::TempDir dir;
  fs::path txt, array, jsonl;
  explicit Files(const std::string& eos) {
    txt = dir.path / "docs.txt";
    array = dir.path / "docs.json";
    jsonl = dir.path / "docs.jsonl";
    std::string t, l;
    json a = json::array();
    for (size_t i = 0; i < kDocs.size(); ++i) {
      t += kDocs[i] + eos;
      const json rec = {{"meta", {{"source", "test"}, {"n", i}}}, {"text", kDocs[i]}, {"id", i}};
      a.push_back(rec);
      l += rec.dump() + "\n";
    }
    write(txt, t);
    write(array, a.dump(1));
    write(jsonl, l);
  }
};

void expect_same_windows(const train::TextCodec& codec, bool pack) {
  Files f(codec.eos_text);
  const int64_t T = 6;
  const train::TrainData want = train::build_train_data(config(f.txt, "auto", T, pack), codec, 1);
  const Rows w = rows(*want.train);
  ASSERT_GT(want.train->size(), 4);
  EXPECT_EQ(want.train->packed(), pack);
  for (const fs::path& p : {f.array, f.jsonl}) {
    for (const char* format : {"auto", "text"}) {
      SCOPED_TRACE(p.string() + " format " + format);
      const train::TrainData got = train::build_train_data(config(p, format, T, pack), codec, 1);
      EXPECT_NE(got.summary.find(": text, 5 records, 5 documents"), std::string::npos)
          << got.summary;
      const Rows g = rows(*got.train);
      EXPECT_EQ(g.ids, w.ids);
      EXPECT_EQ(g.targets, w.targets);
      EXPECT_EQ(g.pos, w.pos);
    }
  }
  // The windows are the .txt file's own token stream (the EOS text is the EOS token).
  std::ifstream in(f.txt, std::ios::binary);
  const std::string whole((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> stream = codec.encode(whole);
  const int64_t n = want.train->size();
  ASSERT_GE(stream.size(), static_cast<size_t>(n * T + 1));
  for (int64_t i = 0; i < n * T; ++i) ASSERT_EQ(w.ids[i], stream[i]) << "token " << i;
}

TEST(TextRecords, SameWindowsAsTxtWithEosSeparators) {
  const train::TextCodec bpe = gpt2_codec();
  ASSERT_GE(bpe.eos_id, 0);
  ASSERT_EQ(bpe.eos_text, "<|endoftext|>");
  for (bool pack : {false, true}) {
    SCOPED_TRACE(pack ? "packed" : "unpacked");
    expect_same_windows(bpe, pack);
    expect_same_windows(train::bytes_codec(), pack);  // EOS text "\n\n"
  }
}

TEST(TextRecords, PackingKeepsEachDocumentApart) {
  const train::TextCodec codec = gpt2_codec();
  Files f(codec.eos_text);
  const int64_t T = 5;
  const Rows plain =
      rows(*train::build_train_data(config(f.jsonl, "auto", T, false), codec, 1).train);
  const Rows packed =
      rows(*train::build_train_data(config(f.jsonl, "auto", T, true), codec, 1).train);
  ASSERT_EQ(plain.ids, packed.ids);  // the same stream, cut the same way
  int boundaries = 0;
  for (size_t i = 0; i < plain.ids.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) % T;
    EXPECT_EQ(plain.pos[i], t);
    const bool after_eos = t > 0 && plain.ids[i - 1] == codec.eos_id;
    // Positions restart at the token after an EOS and count up otherwise; the window's first
    // token is position 0 either way.
    EXPECT_EQ(packed.pos[i], (t == 0 || after_eos) ? 0 : packed.pos[i - 1] + 1) << i;
    // The EOS that ends a document predicts nothing; every other target is the stream's.
    if (plain.ids[i] == codec.eos_id) {
      EXPECT_EQ(packed.targets[i], kernels::kIgnoreIndex) << i;
      ++boundaries;
    } else {
      EXPECT_EQ(packed.targets[i], plain.targets[i]) << i;
    }
  }
  EXPECT_GE(boundaries, 4);
}

TEST(TextRecords, ValidationSplitsWholeDocuments) {
  const train::TextCodec codec = train::bytes_codec();
  test::TempDir dir;
  std::string l;
  for (int i = 0; i < 200; ++i)
    l += json{{"text", "document number " + std::to_string(i)}}.dump() + "\n";
  write(dir.path / "d.jsonl", l);
  train::DataConfig c = config(dir.path / "d.jsonl", "auto", 16, false);
  c.valid_fraction = 0.1;
  const train::TrainData d = train::build_train_data(c, codec, 7);
  ASSERT_TRUE(d.valid);
  // Each document is wholly in one stream: the streams as text (a window's ids, then the
  // last window's final target), searched for each document between its separators.
  const auto text = [](const data::Dataset& ds) {
    const Rows r = rows(ds);
    std::string s = "\n\n";
    for (int32_t id : r.ids) s.push_back(static_cast<char>(id));
    return s + static_cast<char>(r.targets.back());
  };
  const std::string tt = text(*d.train), vt = text(*d.valid);
  int in_valid = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string doc = "\n\ndocument number " + std::to_string(i) + "\n\n";
    const bool t = tt.find(doc) != std::string::npos, v = vt.find(doc) != std::string::npos;
    EXPECT_FALSE(t && v) << doc;
    in_valid += v;
  }
  EXPECT_GE(in_valid, 8);
  EXPECT_LE(in_valid, 40);
  EXPECT_NE(d.summary.find("validation "), std::string::npos) << d.summary;
}

TEST(TextRecords, BadRecordsAreNamedAndSkippable) {
  const train::TextCodec codec = train::bytes_codec();
  test::TempDir dir;
  write(
      dir.path / "bad.jsonl",
      "{\"text\": \"fine document\"}\n{\"text\": 42, \"meta\": 1}\n{\"text\": \"another one\"}\n");
  write(dir.path / "bad.json", "[{\"text\": \"ok\"}, {\"text\": [\"a\", \"b\"]}]");
  EXPECT_NE(test::error_of([&] {
              train::build_train_data(config(dir.path / "bad.jsonl", "auto", 4, false), codec, 1);
            }).find("bad.jsonl:2: field 'text' must be a string"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              train::build_train_data(config(dir.path / "bad.json", "text", 4, false), codec, 1);
            }).find("bad.json: record 1: field 'text' must be a string"),
            std::string::npos);
  train::DataConfig skip = config(dir.path / "bad.jsonl", "auto", 4, false);
  skip.on_error = "skip";
  const train::TrainData d = train::build_train_data(skip, codec, 1);
  EXPECT_NE(d.summary.find("2 records (1 malformed, skipped), 2 documents"), std::string::npos)
      << d.summary;
  EXPECT_NE(d.summary.find("bad.jsonl:2"), std::string::npos) << d.summary;
  // A record with neither "text" nor a dialogue key names what auto looks for.
  write(dir.path / "other.jsonl", "{\"body\": \"x\"}\n");
  EXPECT_NE(test::error_of([&] {
              train::build_train_data(config(dir.path / "other.jsonl", "auto", 4, false), codec, 1);
            }).find("other.jsonl:1: cannot tell the format from the keys"),
            std::string::npos);
  // A dialogue file named as text says which field it lacks.
  write(dir.path / "dialog.jsonl", "{\"prompt\": \"q\", \"response\": \"a\"}\n");
  EXPECT_NE(test::error_of([&] {
              train::build_train_data(config(dir.path / "dialog.jsonl", "text", 4, false), codec,
                                      1);
            }).find("dialog.jsonl:1: missing string field 'text'"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
