// Byte-level BPE tokenizer (GPT-2, Llama-3, Qwen2, SmolLM2), id for id the same as
// Hugging Face `tokenizers` on valid UTF-8:
//   text -> added/special tokens matched first and kept whole (leftmost-longest, as HF's
//           AddedVocabulary: non-normalized tokens first, then normalized ones)
//        -> each remaining span pre-tokenized (the model's regex, written by hand)
//        -> each piece's bytes mapped to byte-level symbols and merged by rank (BPE)
// Loaded from an HF tokenizer.json (`from_hf_json`) or from a token list + merges as GGUF
// stores them (`from_vocab`, for the GGUF reader).
//
// Contract details:
// - encode() never adds BOS/EOS: callers (templates, datasets) prepend bos_id() when
//   add_bos() says the model expects one.
// - allow_special = false: special added tokens are not matched (their text is tokenized
//   as ordinary text, HF's encode_special_tokens); non-special added tokens still are.
// - Invalid UTF-8 in the input is kept: each invalid byte is one "other" character (not
//   a letter, digit or space) and becomes its byte token, so decode(encode(x)) == x
//   whenever the vocabulary holds every byte. (HF cannot take invalid UTF-8 at all.)
//   A byte with no token in the vocabulary is dropped, as HF's BPE does without unk.
// - decode() returns raw bytes (no U+FFFD substitution, so a token that ends mid
//   character can be streamed); added tokens decode to their text. (HF runs added tokens
//   through the ByteLevel decoder too, which garbles one made only of byte-level
//   characters with a Latin-1 letter in it, e.g. "abé" -> "ab\uFFFD"; ours gives "abé".)
// - Character classes (\p{L}, \p{N}, \s, Digits' is_numeric) come from unicode_tables.h,
//   reconciled with the engine HF tokenizers 0.23.3 uses (Unicode 16 letters and digits).
// - Thread-safe: encode() may be called concurrently (the word cache has a lock).
//   Copies share the same immutable tables and cache.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

// How text is cut into pieces before BPE.
//   GPT2   : ByteLevel(use_regex) — 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
//            ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+                     (GGUF pre "gpt-2")
//   LLAMA3 : Split((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+) + ByteLevel(no regex)
//                                                                  (GGUF pre "llama-bpe")
//   QWEN2  : LLAMA3's pattern with \p{N} (single digits)           (GGUF pre "qwen2")
//   SMOLLM : Digits(individual_digits) then GPT2's regex on the text between digits
//                                                                  (GGUF pre "smollm")
enum class PreTokenizer { GPT2, LLAMA3, QWEN2, SMOLLM };

const char* pretokenizer_name(PreTokenizer p);  // "gpt2", "llama3", "qwen2", "smollm"
// The kind's regex, as HF writes it: Split's pattern (LLAMA3, QWEN2) or the one ByteLevel's
// use_regex applies (GPT2, SMOLLM).
const char* pretokenizer_regex(PreTokenizer p);
// GGUF tokenizer.ggml.pre -> kind; throws loom::Error naming an unknown value.
PreTokenizer pretokenizer_from_gguf_name(const std::string& name);

// GGUF tokenizer.ggml.token_type values.
enum TokenType : int32_t {
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,      // special: matched whole when allow_special, decoded to its text
  kTokenUserDefined = 4,  // added, not special: always matched whole, decoded to its text
  kTokenUnused = 5,
  kTokenByte = 6,
};

// A vocabulary as GGUF stores it (tokenizer.ggml.*).
struct TokenizerSpec {
  std::vector<std::string> tokens;   // id -> token, byte-level encoded ("Ġthe")
  std::vector<std::string> merges;   // rank -> "left right"
  std::vector<int32_t> token_types;  // empty: every token normal
  PreTokenizer pre_tokenizer = PreTokenizer::GPT2;
  int32_t bos_id = -1, eos_id = -1, pad_id = -1;  // -1: none
  bool add_bos = false;
  // BPE's ignore_merges (a piece that is a whole vocabulary token is not merged):
  // nullopt = true for LLAMA3 (as Llama-3's tokenizer.json and llama.cpp), else false.
  std::optional<bool> ignore_merges;
  std::string source = "tokenizer";  // names the input in error messages (e.g. a path)
};

class Tokenizer {
 public:
  // Reads an HF tokenizer.json (BPE model, byte-level pre-tokenizer of a kind above, null
  // normalizer). bos/eos/pad: from a TemplateProcessing post-processor (a leading special
  // token is BOS and sets add_bos), and, when the file is named tokenizer.json, from the
  // tokenizer_config.json beside it. Throws loom::Error naming the file and the problem.
  static Tokenizer from_hf_json(const std::filesystem::path& tokenizer_json);
  static Tokenizer from_vocab(const TokenizerSpec& spec);

  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;
  // Appends to out.
  void encode_into(std::string_view text, std::vector<int32_t>& out,
                   bool allow_special = true) const;
  std::string decode(std::span<const int32_t> ids) const;  // throws on an id out of range

  int32_t token_id(std::string_view token) const;  // vocabulary or added token; -1 absent
  std::string_view token(int32_t id) const;        // as stored ("Ġthe"); "" for holes
  int32_t vocab_size() const;                      // max id + 1
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  bool add_bos() const;
  bool is_special(int32_t id) const;  // special added token (HF) / control token (GGUF)
  PreTokenizer pre_tokenizer() const;
  bool ignore_merges() const;
  // FNV-1a 64 over everything that decides the ids (tokens, merges, added tokens,
  // pre-tokenizer, ignore_merges): a cache key for tokenized data.
  uint64_t fingerprint() const;

  // The pieces BPE sees for text with no added tokens in it (for tests and debugging).
  std::vector<std::string_view> pre_tokenize(std::string_view text) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace loom::data
