// Byte-level BPE: see tokenizer.h for the contract. Layout of this file:
//   byte-level alphabet, hashing and two flat hash maps (merge ranks; byte strings)
//   UTF-8 decoding into classed characters
//   the pre-tokenizers (hand-written equivalents of the regexes in tokenizer.h)
//   BPE merges, the word cache, added-token matching, encode/decode
//   loading: from_vocab, from_hf_json
#include "loom/data/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "loom/data/unicode_tables.h"
#include "loom/util/error.h"

namespace loom::data {

using json = nlohmann::json;

namespace {

// ---- byte-level alphabet (GPT-2's bytes_to_unicode) ---------------------------------------
// Printable Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves; the other
// 68 bytes get U+0100.. in byte order. So every byte is one visible character.

struct ByteAlphabet {
  std::array<uint32_t, 256> cp{};      // byte -> code point
  std::array<std::string, 256> utf8;   // byte -> its character, UTF-8 encoded
  std::array<int16_t, 324> byte_of{};  // code point (< 324) -> byte, -1 if none
  ByteAlphabet() {
    byte_of.fill(-1);
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      cp[b] = printable ? static_cast<uint32_t>(b) : extra++;
      byte_of[cp[b]] = static_cast<int16_t>(b);
      const uint32_t c = cp[b];
      if (c < 0x80) {
        utf8[b] = std::string(1, static_cast<char>(c));
      } else {
        utf8[b] = {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
      }
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// A byte-level token string ("Ġthe") -> the bytes it stands for; false if a character is
// not in the alphabet (such a token can never come out of BPE on bytes).
bool bytelevel_to_bytes(std::string_view s, std::string* out) {
  const ByteAlphabet& a = alphabet();
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    uint32_t c;
    if (b0 < 0x80) {
      c = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < s.size()) {
      c = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    if (c >= a.byte_of.size() || a.byte_of[c] < 0) return false;
    out->push_back(static_cast<char>(a.byte_of[c]));
  }
  return true;
}

// ---- hashing ------------------------------------------------------------------------------

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0x100000001B3ULL);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ mix64(w)) * 0x9FB21C651E98DF25ULL;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ mix64(w ^ (n << 56))) * 0x9FB21C651E98DF25ULL;
  }
  return mix64(h);
}

struct Fnv {
  uint64_t h = 0xcbf29ce484222325ULL;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
  }
  void add_str(std::string_view s) {
    const uint64_t n = s.size();
    add(&n, sizeof n);
    add(s.data(), s.size());
  }
  void add_i32(int32_t v) { add(&v, sizeof v); }
};

// Merge ranks keyed by the pair of token ids (open addressing, linear probing).
class PairMap {
 public:
  struct Value {
    int32_t rank, id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Value{0, 0});
    mask_ = cap - 1;
  }
  // Later inserts of the same pair win (HF collects merges into a HashMap in rank order).
  void insert_or_assign(int32_t a, int32_t b, Value v) {
    const uint64_t k = key(a, b);
    for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == kEmpty || keys_[i] == k) {
        keys_[i] = k;
        vals_[i] = v;
        return;
      }
    }
  }
  const Value* find(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ULL;
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> vals_;
  size_t mask_ = 0;
};

// Byte string -> two int32 values; keys live in one arena. Used for the vocabulary (bytes
// -> id) and the word cache (bytes -> offset, count into an id arena).
class BytesMap {
 public:
  struct Slot {
    uint64_t hash;
    uint32_t off, len;
    int32_t v0, v1;
  };
  BytesMap() { rehash(64); }
  size_t size() const { return size_; }
  void clear() {
    arena_.clear();
    size_ = 0;
    slots_.assign(64, Slot{0, 0, kEmpty, 0, 0});
    mask_ = 63;
  }
  const Slot* find(std::string_view k) const {
    const uint64_t h = hash_bytes(k.data(), k.size());
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return nullptr;
      if (s.hash == h && s.len == k.size() &&
          std::memcmp(arena_.data() + s.off, k.data(), s.len) == 0)
        return &s;
    }
  }
  // Inserts k if absent (keeps the first value).
  void insert(std::string_view k, int32_t v0, int32_t v1) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    const uint64_t h = hash_bytes(k.data(), k.size());
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s = Slot{h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(k.size()), v0, v1};
        arena_.append(k.data(), k.size());
        ++size_;
        return;
      }
      if (s.hash == h && s.len == k.size() &&
          std::memcmp(arena_.data() + s.off, k.data(), s.len) == 0)
        return;
    }
  }
  size_t arena_bytes() const { return arena_.size(); }

 private:
  static constexpr uint32_t kEmpty = ~0u;
  void rehash(size_t cap) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{0, 0, kEmpty, 0, 0});
    mask_ = cap - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      for (size_t i = s.hash & mask_;; i = (i + 1) & mask_) {
        if (slots_[i].len == kEmpty) {
          slots_[i] = s;
          break;
        }
      }
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0, mask_ = 0;
};

// ---- UTF-8 -> classed characters ------------------------------------------------------------

enum : uint8_t { kL = 1, kN = 2, kS = 4, kD = 8 };  // \p{L}, \p{N}, \s, char::is_numeric
constexpr uint32_t kInvalidCp = 0xFFFFFF;           // an invalid byte: class "other"

uint8_t class_of_slow(uint32_t cp) {
  uint8_t c = 0;
  if (unicode::is_letter(cp)) c |= kL;
  if (unicode::is_number(cp)) c |= kN;
  if (unicode::is_whitespace(cp)) c |= kS;
  if (unicode::is_numeric(cp)) c |= kD;
  return c;
}

const std::array<uint8_t, 65536>& bmp_classes() {
  static const std::array<uint8_t, 65536> t = [] {
    std::array<uint8_t, 65536> a{};
    for (uint32_t cp = 0; cp < 65536; ++cp) a[cp] = class_of_slow(cp);
    return a;
  }();
  return t;
}

inline uint8_t class_of(uint32_t cp) {
  return cp < 65536 ? bmp_classes()[cp] : (cp == kInvalidCp ? 0 : class_of_slow(cp));
}

// One character of the text: its byte offset, code point and class.
struct Ch {
  uint32_t off;
  uint32_t cp : 24;
  uint32_t cls : 8;
};

// Decodes text[b, e) (e <= text size) into out, plus a sentinel with off = e. Strict
// UTF-8 (no overlongs, surrogates or values above U+10FFFF); a byte that does not start a
// valid sequence is one character of its own.
void decode_chars(const char* text, size_t b, size_t e, std::vector<Ch>& out) {
  out.clear();
  const auto* s = reinterpret_cast<const uint8_t*>(text);
  const auto& bmp = bmp_classes();
  size_t i = b;
  while (i < e) {
    const uint8_t b0 = s[i];
    if (b0 < 0x80) {
      out.push_back(Ch{static_cast<uint32_t>(i), b0, bmp[b0]});
      ++i;
      continue;
    }
    uint32_t cp = kInvalidCp;
    size_t n = 1;
    auto cont = [&](size_t k) { return i + k < e && (s[i + k] & 0xC0) == 0x80; };
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      if (cont(1)) {
        cp = ((b0 & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
        n = 2;
      }
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      if (cont(1) && cont(2)) {
        const uint8_t b1 = s[i + 1];
        const bool ok = (b0 == 0xE0) ? b1 >= 0xA0 : (b0 == 0xED) ? b1 <= 0x9F : true;
        if (ok) {
          cp = ((b0 & 0x0Fu) << 12) | ((b1 & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu);
          n = 3;
        }
      }
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      if (cont(1) && cont(2) && cont(3)) {
        const uint8_t b1 = s[i + 1];
        const bool ok = (b0 == 0xF0) ? b1 >= 0x90 : (b0 == 0xF4) ? b1 <= 0x8F : true;
        if (ok) {
          cp = ((b0 & 0x07u) << 18) | ((b1 & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) |
               (s[i + 3] & 0x3Fu);
          n = 4;
        }
      }
    }
    out.push_back(Ch{static_cast<uint32_t>(i), cp, class_of(cp)});
    i += n;
  }
  out.push_back(Ch{static_cast<uint32_t>(e), 0, 0});
}

// ---- pre-tokenizers ---------------------------------------------------------------------------
// Each works on characters c[b, e) (a span between added tokens, or SmolLM2's text between
// digits) and appends pieces as character index ranges [start, end). A regex alternation
// tries its alternatives in order at each position and takes the first that matches; every
// character is a letter, a number, a space or "other", so some alternative always matches.

using Pieces = std::vector<std::pair<uint32_t, uint32_t>>;

inline bool is_other(const Ch& c) { return (c.cls & (kL | kN | kS)) == 0; }
inline bool is_crlf(const Ch& c) { return c.cp == '\r' || c.cp == '\n'; }

// 's|'t|'re|'ve|'m|'ll|'d at i, case-sensitive or (?i) (which also folds U+017F to s).
size_t match_contraction(const Ch* c, size_t i, size_t e, bool fold) {
  if (c[i].cp != '\'' || i + 1 >= e) return 0;
  auto low = [&](size_t k) -> uint32_t {
    const uint32_t x = c[k].cp;
    if (!fold) return x;
    if (x >= 'A' && x <= 'Z') return x + 32;
    return x == 0x17F ? 's' : x;
  };
  switch (low(i + 1)) {
    case 's':
    case 't':
    case 'm':
    case 'd':
      return 2;
    case 'r':
    case 'v':
      return (i + 2 < e && low(i + 2) == 'e') ? 3 : 0;
    case 'l':
      return (i + 2 < e && low(i + 2) == 'l') ? 3 : 0;
    default:
      return 0;
  }
}

inline size_t run(const Ch* c, size_t i, size_t e, uint8_t cls) {
  size_t j = i;
  while (j < e && (c[j].cls & cls)) ++j;
  return j - i;
}

inline size_t run_other(const Ch* c, size_t i, size_t e) {
  size_t j = i;
  while (j < e && is_other(c[j])) ++j;
  return j - i;
}

// \s+(?!\S)|\s+ at a space: the whole run at the end of the span or when it is one
// character, else all but its last (which then leads the next piece).
inline size_t match_spaces(const Ch* c, size_t i, size_t e) {
  const size_t r = run(c, i, e, kS);
  return (i + r == e || r == 1) ? r : r - 1;
}

// ' ?X+' where X is a class test: optional literal space, then one or more X.
template <typename Pred>
inline size_t match_opt_space_run(const Ch* c, size_t i, size_t e, Pred is_x) {
  size_t j = i;
  if (c[j].cp == ' ' && j + 1 < e && is_x(c[j + 1])) ++j;
  if (!is_x(c[j])) return 0;
  while (j < e && is_x(c[j])) ++j;
  return j - i;
}

void split_gpt2(const Ch* c, size_t b, size_t e, Pieces& out) {
  auto is_l = [](const Ch& x) { return (x.cls & kL) != 0; };
  auto is_n = [](const Ch& x) { return (x.cls & kN) != 0; };
  size_t i = b;
  while (i < e) {
    size_t n = match_contraction(c, i, e, false);
    if (!n) n = match_opt_space_run(c, i, e, is_l);
    if (!n) n = match_opt_space_run(c, i, e, is_n);
    if (!n) n = match_opt_space_run(c, i, e, is_other);
    if (!n) n = match_spaces(c, i, e);
    if (!n) n = 1;  // unreachable: every character is L, N, S or other
    out.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(i + n));
    i += n;
  }
}

void split_llama3(const Ch* c, size_t b, size_t e, size_t max_digits, Pieces& out) {
  size_t i = b;
  while (i < e) {
    size_t n = match_contraction(c, i, e, true);
    if (!n) {  // [^\r\n\p{L}\p{N}]?\p{L}+
      if (!is_crlf(c[i]) && !(c[i].cls & (kL | kN)) && i + 1 < e && (c[i + 1].cls & kL)) {
        n = 1 + run(c, i + 1, e, kL);
      } else if (c[i].cls & kL) {
        n = run(c, i, e, kL);
      }
    }
    if (!n && (c[i].cls & kN)) n = std::min(run(c, i, e, kN), max_digits);  // \p{N}{1,3}
    if (!n) {  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
      size_t j = i;
      if (c[j].cp == ' ' && j + 1 < e && is_other(c[j + 1])) ++j;
      if (is_other(c[j])) {
        j += run_other(c, j, e);
        while (j < e && is_crlf(c[j])) ++j;
        n = j - i;
      }
    }
    if (!n && (c[i].cls & kS)) {  // \s*[\r\n]+ : through the run's last CR/LF
      const size_t r = run(c, i, e, kS);
      for (size_t k = i + r; k > i; --k) {
        if (is_crlf(c[k - 1])) {
          n = k - i;
          break;
        }
      }
      if (!n) n = match_spaces(c, i, e);
    }
    if (!n) n = 1;
    out.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(i + n));
    i += n;
  }
}

void split_smollm(const Ch* c, size_t b, size_t e, Pieces& out) {
  size_t i = b;
  while (i < e) {
    if (c[i].cls & kD) {
      out.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1));
      ++i;
      continue;
    }
    size_t j = i;
    while (j < e && !(c[j].cls & kD)) ++j;
    split_gpt2(c, i, j, out);
    i = j;
  }
}

void pre_tokenize_chars(PreTokenizer kind, const Ch* c, size_t n, Pieces& out) {
  switch (kind) {
    case PreTokenizer::GPT2:
      split_gpt2(c, 0, n, out);
      break;
    case PreTokenizer::LLAMA3:
      split_llama3(c, 0, n, 3, out);
      break;
    case PreTokenizer::QWEN2:
      split_llama3(c, 0, n, 1, out);
      break;
    case PreTokenizer::SMOLLM:
      split_smollm(c, 0, n, out);
      break;
  }
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  LOOM_CHECK(f.good(), p.string() + ": cannot open file");
  std::ostringstream ss;
  ss << f.rdbuf();
  LOOM_CHECK(!f.bad(), p.string() + ": read error");
  return ss.str();
}

}  // namespace

// ---- the tokenizer ----------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, normalized = false;
};

struct Tokenizer::Impl {
  // Vocabulary.
  std::vector<std::string> tokens;                     // id -> stored form ("" for holes)
  std::vector<std::string> decoded;                    // id -> bytes decode() emits
  std::vector<uint8_t> special;                        // id -> special added token
  std::unordered_map<std::string, int32_t> token_ids;  // stored form -> id (added first)
  BytesMap vocab_bytes;                                // model token bytes -> id
  std::array<int32_t, 256> byte_id{};                  // byte -> its one-byte token, -1
  int32_t unk_id = -1;
  bool fuse_unk = false;
  PairMap merges;
  uint64_t merges_fp = 0;  // FNV-1a of the merges in rank order
  PreTokenizer pre = PreTokenizer::GPT2;
  bool ignore_merges = false;
  int32_t bos = -1, eos = -1, pad = -1;
  bool add_bos = false;

  // Added tokens, in two matching phases as HF: non-normalized first, then normalized.
  std::vector<AddedToken> added;
  struct Matcher {
    std::array<bool, 256> first{};
    std::array<std::vector<int32_t>, 256> by_first;  // indices into `added`, longest first
    bool empty = true;
  };
  Matcher phase[2];

  // Word cache: piece bytes -> ids.
  mutable std::mutex cache_mu;
  mutable BytesMap cache;
  mutable std::vector<int32_t> cache_ids;

  void build_matchers() {
    for (auto& m : phase) m = Matcher{};
    for (size_t k = 0; k < added.size(); ++k) {
      const AddedToken& t = added[k];
      if (t.content.empty()) continue;
      Matcher& m = phase[t.normalized ? 1 : 0];
      const auto f = static_cast<uint8_t>(t.content[0]);
      m.first[f] = true;
      m.by_first[f].push_back(static_cast<int32_t>(k));
      m.empty = false;
    }
    for (auto& m : phase) {
      for (auto& v : m.by_first) {
        std::stable_sort(v.begin(), v.end(), [&](int32_t a, int32_t b) {
          return added[a].content.size() > added[b].content.size();
        });
      }
    }
  }

  // Leftmost-longest added token in text[p, e), skipping special ones when !allow_special
  // (those are passed over as text, like HF's encode_special_tokens).
  bool find_added(const Matcher& m, std::string_view text, size_t p, size_t e, bool allow_special,
                  size_t* start, size_t* len, int32_t* which) const {
    const auto* s = reinterpret_cast<const uint8_t*>(text.data());
    for (size_t q = p; q < e; ++q) {
      if (!m.first[s[q]]) continue;
      for (int32_t k : m.by_first[s[q]]) {
        const std::string& c = added[k].content;
        if (c.size() <= e - q && std::memcmp(text.data() + q, c.data(), c.size()) == 0) {
          if (added[k].special && !allow_special) {
            q += c.size() - 1;  // HF's matcher does not look inside a skipped match
            goto next;
          }
          *start = q;
          *len = c.size();
          *which = k;
          return true;
        }
      }
    next:;
    }
    return false;
  }

  // A span of text: either an added token (id >= 0) or text to pre-tokenize (id = -1).
  struct Span {
    size_t b, e;
    int32_t id;
  };

  void split_added(const Matcher& m, std::string_view text, size_t b, size_t e, bool allow_special,
                   std::vector<Span>& out) const {
    size_t p = b;     // search position
    size_t done = b;  // text before this is already in out
    while (p < e) {
      size_t start, len;
      int32_t k;
      if (!find_added(m, text, p, e, allow_special, &start, &len, &k)) break;
      size_t stop = start + len;
      const AddedToken& t = added[k];
      if (t.lstrip) {  // take the spaces before it (not those already taken)
        std::vector<Ch> chars;
        decode_chars(text.data(), done, start, chars);
        size_t j = chars.size() - 1;
        while (j > 0 && (chars[j - 1].cls & kS)) --j;
        start = chars[j].off;
      }
      if (t.rstrip) {  // and the spaces after it
        std::vector<Ch> chars;
        decode_chars(text.data(), stop, e, chars);
        size_t j = 0;
        while (j + 1 < chars.size() && (chars[j].cls & kS)) ++j;
        stop = chars[j].off;
      }
      if (done < start) out.push_back(Span{done, start, -1});
      out.push_back(Span{start, stop, t.id});
      done = p = stop;
    }
    if (done < e) out.push_back(Span{done, e, -1});
  }

  void bpe_piece(std::string_view piece, std::vector<int32_t>& out) const {
    const auto* s = reinterpret_cast<const uint8_t*>(piece.data());
    const size_t n = piece.size();
    if (n == 0) return;
    if (n == 1 && unk_id < 0) {
      if (byte_id[s[0]] >= 0) out.push_back(byte_id[s[0]]);
      return;
    }
    if (ignore_merges) {
      if (const BytesMap::Slot* hit = vocab_bytes.find(piece)) {
        out.push_back(hit->v0);
        return;
      }
    }
    constexpr size_t kMaxCached = 256;
    if (n <= kMaxCached) {
      std::lock_guard<std::mutex> lock(cache_mu);
      if (const BytesMap::Slot* hit = cache.find(piece)) {
        out.insert(out.end(), cache_ids.begin() + hit->v0, cache_ids.begin() + hit->v0 + hit->v1);
        return;
      }
    }
    const size_t first = out.size();
    merge_word(s, n, out);
    if (n <= kMaxCached) {
      std::lock_guard<std::mutex> lock(cache_mu);
      if (cache.size() >= (1u << 17) || cache_ids.size() >= (1u << 22)) {
        cache.clear();
        cache_ids.clear();
      }
      cache.insert(piece, static_cast<int32_t>(cache_ids.size()),
                   static_cast<int32_t>(out.size() - first));
      cache_ids.insert(cache_ids.end(), out.begin() + first, out.end());
    }
  }

  // Bytes -> symbols (a byte without a token becomes unk, or is dropped when there is no
  // unk, as HF's BPE::merge_word), then merges: always the pair of lowest rank, leftmost
  // first (what HF's heap of (rank, position) does).
  void merge_word(const uint8_t* s, size_t n, std::vector<int32_t>& out) const {
    std::vector<int32_t> sym;
    sym.reserve(n);
    bool last_unk = false;
    for (size_t i = 0; i < n; ++i) {
      const int32_t id = byte_id[s[i]];
      if (id >= 0) {
        sym.push_back(id);
        last_unk = false;
      } else if (unk_id >= 0) {
        if (!(fuse_unk && last_unk)) sym.push_back(unk_id);
        last_unk = true;
      }
    }
    const size_t m = sym.size();
    if (m <= 1) {
      out.insert(out.end(), sym.begin(), sym.end());
      return;
    }
    constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
    if (m <= 64) {  // small: rescan for the minimum each step
      std::array<int32_t, 64> rank, nid;
      auto pair_at = [&](size_t i) {  // rank and result of merging sym[i], sym[i + 1]
        const PairMap::Value* v = merges.find(sym[i], sym[i + 1]);
        rank[i] = v ? v->rank : kNone;
        nid[i] = v ? v->id : -1;
      };
      size_t len = m;
      for (size_t i = 0; i + 1 < len; ++i) pair_at(i);
      while (len > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < len; ++i) {
          if (rank[i] < rank[best]) best = i;
        }
        if (rank[best] == kNone) break;
        sym[best] = nid[best];
        for (size_t i = best + 1; i + 1 < len; ++i) {
          sym[i] = sym[i + 1];
          rank[i] = rank[i + 1];
          nid[i] = nid[i + 1];
        }
        --len;
        if (best > 0) pair_at(best - 1);
        if (best + 1 < len) pair_at(best);
      }
      out.insert(out.end(), sym.begin(), sym.begin() + len);
      return;
    }
    // Large: a linked list and a min-heap of (rank, position), stale entries skipped.
    struct Node {
      int32_t id, prev, next;
      bool alive;
    };
    std::vector<Node> nodes(m);
    for (size_t i = 0; i < m; ++i) {
      nodes[i] = Node{sym[i], static_cast<int32_t>(i) - 1,
                      i + 1 < m ? static_cast<int32_t>(i + 1) : -1, true};
    }
    struct Cand {
      int32_t rank, pos, id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int32_t pos) {
      if (pos < 0 || nodes[pos].next < 0) return;
      if (const PairMap::Value* v = merges.find(nodes[pos].id, nodes[nodes[pos].next].id))
        heap.push(Cand{v->rank, pos, v->id});
    };
    for (size_t i = 0; i + 1 < m; ++i) push(static_cast<int32_t>(i));
    while (!heap.empty()) {
      const Cand top = heap.top();
      heap.pop();
      Node& left = nodes[top.pos];
      if (!left.alive || left.next < 0) continue;
      Node& right = nodes[left.next];
      const PairMap::Value* v = merges.find(left.id, right.id);
      if (!v || v->id != top.id || v->rank != top.rank) continue;  // stale
      left.id = top.id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) nodes[right.next].prev = top.pos;
      push(left.prev);
      push(top.pos);
    }
    for (int32_t i = 0; i >= 0; i = nodes[i].next) out.push_back(nodes[i].id);
  }

  void encode_text(std::string_view text, size_t b, size_t e, std::vector<Ch>& chars,
                   Pieces& pieces, std::vector<int32_t>& out) const {
    decode_chars(text.data(), b, e, chars);
    pieces.clear();
    pre_tokenize_chars(pre, chars.data(), chars.size() - 1, pieces);
    for (const auto& [ps, pe] : pieces) {
      const size_t ob = chars[ps].off, oe = chars[pe].off;
      bpe_piece(text.substr(ob, oe - ob), out);
    }
  }

  void encode(std::string_view text, bool allow_special, std::vector<int32_t>& out) const {
    LOOM_CHECK(text.size() < (1ULL << 32) - 1,
               "encode: text of " + std::to_string(text.size()) + " bytes is over the 4 GiB limit");
    std::vector<Ch> chars;
    Pieces pieces;
    if (phase[0].empty && phase[1].empty) {
      encode_text(text, 0, text.size(), chars, pieces, out);
      return;
    }
    std::vector<Span> spans, spans2;
    split_added(phase[0], text, 0, text.size(), allow_special, spans);
    for (const Span& sp : spans) {
      if (sp.id >= 0 || phase[1].empty) {
        spans2.push_back(sp);
      } else {
        split_added(phase[1], text, sp.b, sp.e, allow_special, spans2);
      }
    }
    for (const Span& sp : spans2) {
      if (sp.id >= 0) {
        out.push_back(sp.id);
      } else {
        encode_text(text, sp.b, sp.e, chars, pieces, out);
      }
    }
  }

  // ---- building ----

  // Fills everything derived from tokens/added/merges once those are set.
  void finish(const std::string& where) {
    const int32_t V = static_cast<int32_t>(tokens.size());
    decoded.assign(V, "");
    special.assign(V, 0);
    std::string bytes;
    for (int32_t id = 0; id < V; ++id) {
      if (tokens[id].empty()) continue;
      if (bytelevel_to_bytes(tokens[id], &bytes)) {
        decoded[id] = bytes;
      } else {
        decoded[id] = tokens[id];  // not byte-level (HF's decoder also passes it through)
      }
    }
    for (const AddedToken& t : added) {
      decoded[t.id] = t.content;
      special[t.id] = t.special;
    }
    byte_id.fill(-1);
    const ByteAlphabet& a = alphabet();
    for (int b = 0; b < 256; ++b) {
      auto it = model_ids.find(a.utf8[b]);
      if (it != model_ids.end()) byte_id[b] = it->second;
    }
    for (const auto& [tok, id] : model_ids) {
      if (bytelevel_to_bytes(tok, &bytes)) vocab_bytes.insert(bytes, id, 0);
    }
    token_ids = model_ids;
    for (const AddedToken& t : added) token_ids[t.content] = t.id;  // added tokens win
    for (int32_t* p : {&bos, &eos, &pad}) {
      LOOM_CHECK(*p >= -1 && *p < V, where + ": special token id " + std::to_string(*p) +
                                         " is outside the vocabulary (size " + std::to_string(V) +
                                         ")");
    }
    build_matchers();
    model_ids.clear();
  }

  void set_merges(const std::vector<std::pair<std::string, std::string>>& pairs,
                  const std::string& where, const std::string& key) {
    merges.reserve(pairs.size());
    Fnv fp;
    for (size_t r = 0; r < pairs.size(); ++r) {
      // Plain references, not a structured binding: clang 14 cannot capture those.
      const std::string& l = pairs[r].first;
      const std::string& rt = pairs[r].second;
      auto name = [&] {
        return where + ": " + key + "[" + std::to_string(r) + "] '" + l + " " + rt + "'";
      };
      auto il = model_ids.find(l), ir = model_ids.find(rt), im = model_ids.find(l + rt);
      LOOM_CHECK(il != model_ids.end(), name() + ": '" + l + "' is not in the vocabulary");
      LOOM_CHECK(ir != model_ids.end(), name() + ": '" + rt + "' is not in the vocabulary");
      LOOM_CHECK(im != model_ids.end(),
                 name() + ": the merged token '" + l + rt + "' is not in the vocabulary");
      merges.insert_or_assign(il->second, ir->second,
                              PairMap::Value{static_cast<int32_t>(r), im->second});
      fp.add_i32(il->second);
      fp.add_i32(ir->second);
    }
    merges_fp = fp.h;
  }

  std::unordered_map<std::string, int32_t> model_ids;  // model vocabulary while building
};

// ---- public API ----------------------------------------------------------------------------

namespace {

const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

const char* pretokenizer_regex(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::LLAMA3:
      return kLlama3Regex;
    case PreTokenizer::QWEN2:
      return kQwen2Regex;
    case PreTokenizer::GPT2:
    case PreTokenizer::SMOLLM:
      break;
  }
  return kGpt2Regex;
}

const char* pretokenizer_name(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::GPT2:
      return "gpt2";
    case PreTokenizer::LLAMA3:
      return "llama3";
    case PreTokenizer::QWEN2:
      return "qwen2";
    case PreTokenizer::SMOLLM:
      return "smollm";
  }
  return "?";
}

PreTokenizer pretokenizer_from_gguf_name(const std::string& name) {
  // llama.cpp's names (tokenizer.ggml.pre); the aliases are the ones llama.cpp gives the
  // same regexes.
  if (name == "gpt-2" || name == "gpt2") return PreTokenizer::GPT2;
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") return PreTokenizer::LLAMA3;
  if (name == "qwen2") return PreTokenizer::QWEN2;
  if (name == "smollm" || name == "starcoder") return PreTokenizer::SMOLLM;
  throw Error("tokenizer.ggml.pre '" + name +
              "' is not supported (gpt-2, llama-bpe, qwen2, smollm, starcoder)");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode(text, allow_special, out);
  return out;
}

void Tokenizer::encode_into(std::string_view text, std::vector<int32_t>& out,
                            bool allow_special) const {
  impl_->encode(text, allow_special, out);
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  const int32_t V = vocab_size();
  for (int32_t id : ids) {
    LOOM_CHECK(id >= 0 && id < V, "decode: token id " + std::to_string(id) +
                                      " is outside the vocabulary (size " + std::to_string(V) +
                                      ")");
    out += impl_->decoded[id];
  }
  return out;
}

int32_t Tokenizer::token_id(std::string_view token) const {
  auto it = impl_->token_ids.find(std::string(token));
  return it == impl_->token_ids.end() ? -1 : it->second;
}

std::string_view Tokenizer::token(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->tokens[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->tokens.size()); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}
PreTokenizer Tokenizer::pre_tokenizer() const { return impl_->pre; }
bool Tokenizer::ignore_merges() const { return impl_->ignore_merges; }

uint64_t Tokenizer::fingerprint() const {
  const Impl& m = *impl_;
  Fnv f;
  f.add_str(pretokenizer_name(m.pre));
  f.add_i32(m.ignore_merges);
  f.add_i32(m.unk_id);
  f.add_i32(m.fuse_unk);
  for (const std::string& t : m.tokens) f.add_str(t);
  f.add(&m.merges_fp, sizeof m.merges_fp);
  std::vector<const AddedToken*> added;  // in id order: the file's order does not matter
  for (const AddedToken& t : m.added) added.push_back(&t);
  std::sort(added.begin(), added.end(),
            [](const AddedToken* x, const AddedToken* y) { return x->id < y->id; });
  for (const AddedToken* t : added) {
    f.add_str(t->content);
    f.add_i32(t->id);
    f.add_i32(t->special | (t->lstrip << 1) | (t->rstrip << 2) | (t->normalized << 3));
  }
  return f.h;
}

std::vector<std::string_view> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<Ch> chars;
  decode_chars(text.data(), 0, text.size(), chars);
  Pieces pieces;
  pre_tokenize_chars(impl_->pre, chars.data(), chars.size() - 1, pieces);
  std::vector<std::string_view> out;
  for (const auto& [b, e] : pieces)
    out.push_back(text.substr(chars[b].off, chars[e].off - chars[b].off));
  return out;
}

// ---- loading -----------------------------------------------------------------------------------

Tokenizer Tokenizer::from_vocab(const TokenizerSpec& spec) {
  auto m = std::make_shared<Impl>();
  const std::string& where = spec.source;
  const size_t V = spec.tokens.size();
  LOOM_CHECK(V > 0, where + ": the token list is empty");
  LOOM_CHECK(V < (1u << 30), where + ": too many tokens");
  LOOM_CHECK(spec.token_types.empty() || spec.token_types.size() == V,
             where + ": " + std::to_string(spec.token_types.size()) + " token types for " +
                 std::to_string(V) + " tokens");
  m->tokens = spec.tokens;
  for (size_t id = 0; id < V; ++id) m->model_ids.emplace(spec.tokens[id], static_cast<int32_t>(id));
  for (size_t id = 0; id < spec.token_types.size(); ++id) {
    const int32_t t = spec.token_types[id];
    if (t == kTokenControl || t == kTokenUnknown || t == kTokenUserDefined) {
      AddedToken a;
      a.content = spec.tokens[id];
      a.id = static_cast<int32_t>(id);
      a.special = t != kTokenUserDefined;
      m->added.push_back(std::move(a));
    }
  }
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(spec.merges.size());
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const std::string& line = spec.merges[r];
    const size_t sp = line.size() > 1 ? line.find(' ', 1) : std::string::npos;
    LOOM_CHECK(sp != std::string::npos && sp + 1 < line.size(),
               where + ": merges[" + std::to_string(r) + "] '" + line +
                   "' is not two tokens separated by a space");
    pairs.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  m->set_merges(pairs, where, "merges");
  m->pre = spec.pre_tokenizer;
  m->ignore_merges = spec.ignore_merges.value_or(spec.pre_tokenizer == PreTokenizer::LLAMA3);
  m->bos = spec.bos_id;
  m->eos = spec.eos_id;
  m->pad = spec.pad_id;
  m->add_bos = spec.add_bos;
  m->finish(where);
  LOOM_CHECK(!m->add_bos || m->bos >= 0, where + ": add_bos is set but there is no bos id");
  return Tokenizer(std::move(m));
}

namespace {

std::string brief(const json& j) {
  std::string s = j.dump();
  return s.size() > 300 ? s.substr(0, 300) + "..." : s;
}

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : "";
}

bool flag(const json& j, const char* key, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  return j[key].is_boolean() ? j[key].get<bool>() : !dflt;  // a non-bool: treat as unexpected
}

// ByteLevel with the given use_regex and no prefix space.
bool is_byte_level(const json& p, bool use_regex) {
  return type_of(p) == "ByteLevel" && !flag(p, "add_prefix_space", false) &&
         flag(p, "use_regex", true) == use_regex;
}

std::optional<PreTokenizer> classify_pre(const json& p) {
  if (is_byte_level(p, true)) return PreTokenizer::GPT2;
  if (type_of(p) != "Sequence" || !p.contains("pretokenizers") || !p["pretokenizers"].is_array())
    return std::nullopt;
  const json& seq = p["pretokenizers"];
  if (seq.size() == 1) return classify_pre(seq[0]);
  if (seq.size() != 2) return std::nullopt;
  const json &a = seq[0], &b = seq[1];
  if (type_of(a) == "Digits" && flag(a, "individual_digits", false) && is_byte_level(b, true))
    return PreTokenizer::SMOLLM;
  if (type_of(a) == "Split" && is_byte_level(b, false) && !flag(a, "invert", false) &&
      a.value("behavior", json()).is_string() && a["behavior"] == "Isolated" &&
      a.contains("pattern") && a["pattern"].is_object() && a["pattern"].contains("Regex") &&
      a["pattern"]["Regex"].is_string()) {
    const std::string re = a["pattern"]["Regex"].get<std::string>();
    if (re == kLlama3Regex) return PreTokenizer::LLAMA3;
    if (re == kQwen2Regex) return PreTokenizer::QWEN2;
    if (re == kGpt2Regex) return PreTokenizer::GPT2;
  }
  return std::nullopt;
}

bool has_byte_level_decoder(const json& d) {
  if (type_of(d) == "ByteLevel") return true;
  if (type_of(d) == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
    for (const json& x : d["decoders"]) {
      if (has_byte_level_decoder(x)) return true;
    }
  }
  return false;
}

// TemplateProcessing's "single": a leading special token is BOS (added by HF's encode with
// add_special_tokens), a trailing one EOS. Looks inside Sequence processors too.
void read_post_processor(const json& p, const std::unordered_map<std::string, int32_t>& ids,
                         int32_t* bos, int32_t* eos, bool* add_bos) {
  if (type_of(p) == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (const json& x : p["processors"]) read_post_processor(x, ids, bos, eos, add_bos);
    return;
  }
  if (type_of(p) != "TemplateProcessing" || !p.contains("single") || !p["single"].is_array() ||
      p["single"].empty())
    return;
  auto special_id = [&](const json& item) -> int32_t {
    if (!item.is_object() || !item.contains("SpecialToken")) return -1;
    const json& st = item["SpecialToken"];
    if (!st.contains("id") || !st["id"].is_string()) return -1;
    auto it = ids.find(st["id"].get<std::string>());
    return it == ids.end() ? -1 : it->second;
  };
  const json& single = p["single"];
  if (const int32_t b = special_id(single.front()); b >= 0) {
    *bos = b;
    *add_bos = true;
  }
  if (single.size() > 1) {
    if (const int32_t e = special_id(single.back()); e >= 0) *eos = e;
  }
}

json parse_json_file(const std::filesystem::path& path, const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    const size_t at = std::min<size_t>(e.byte, text.size());
    const size_t line = 1 + std::count(text.begin(), text.begin() + at, '\n');
    throw Error(path.string() + ":" + std::to_string(line) + ": not valid JSON (" + e.what() + ")");
  } catch (const json::exception& e) {  // e.g. out_of_range: a number too large for a double
    throw Error(path.string() + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

Tokenizer Tokenizer::from_hf_json(const std::filesystem::path& path) {
  const std::string where = path.string();
  const json j = parse_json_file(path, read_file(path));
  LOOM_CHECK(j.is_object(), where + ": expected a JSON object (a Hugging Face tokenizer.json)");
  LOOM_CHECK(j.contains("model") && j["model"].is_object(),
             where + ": no 'model' object (not a Hugging Face tokenizer.json?)");
  const json& model = j["model"];
  const std::string mtype = type_of(model);
  LOOM_CHECK(mtype == "BPE" || (mtype.empty() && model.contains("merges")),
             where + ": model.type is '" + mtype + "'; only byte-level BPE models are supported");
  LOOM_CHECK(model.contains("vocab") && model["vocab"].is_object(),
             where + ": model.vocab must be an object of token -> id");
  LOOM_CHECK(model.contains("merges") && model["merges"].is_array(),
             where + ": model.merges must be an array");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    LOOM_CHECK(!model.contains(k) || model[k].is_null() ||
                   (model[k].is_string() && model[k].get<std::string>().empty()),
               where + ": model." + k + " is set; byte-level BPE does not use it");
  }
  LOOM_CHECK(!model.contains("dropout") || model["dropout"].is_null(),
             where + ": model.dropout is set (BPE-dropout is for training, not supported)");
  LOOM_CHECK(!flag(model, "byte_fallback", false),
             where + ": model.byte_fallback is true (SentencePiece-style BPE is not supported)");

  auto m = std::make_shared<Impl>();
  int64_t max_id = -1;
  for (const auto& [tok, idj] : model["vocab"].items()) {
    LOOM_CHECK(idj.is_number_integer() && idj.get<int64_t>() >= 0 && idj.get<int64_t>() < (1 << 30),
               where + ": model.vocab['" + tok + "'] must be a non-negative integer id");
    const auto id = static_cast<int32_t>(idj.get<int64_t>());
    m->model_ids[tok] = id;
    max_id = std::max<int64_t>(max_id, id);
  }
  LOOM_CHECK(max_id >= 0, where + ": model.vocab is empty");

  // Added tokens get their ids the way HF's AddedVocabulary assigns them on load (the
  // file's "id" is only what HF expects): the id of the same content if it is already in
  // the model vocabulary or added, else model size (or the largest added id + 1).
  std::vector<AddedToken> added;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    LOOM_CHECK(j["added_tokens"].is_array(), where + ": added_tokens must be an array");
    const auto model_size = static_cast<int64_t>(m->model_ids.size());
    std::unordered_map<std::string, size_t> index;  // content -> position in `added`
    int64_t max_added = -1;
    size_t k = 0;
    for (const json& a : j["added_tokens"]) {
      const std::string key = where + ": added_tokens[" + std::to_string(k++) + "]";
      LOOM_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() &&
                     a["id"].get<int64_t>() >= 0 && a["id"].get<int64_t>() < (1 << 30) &&
                     a.contains("content") && a["content"].is_string(),
                 key + " must be an object with an integer 'id' and a string 'content'");
      AddedToken t;
      t.content = a["content"].get<std::string>();
      t.special = flag(a, "special", false);
      t.lstrip = flag(a, "lstrip", false);
      t.rstrip = flag(a, "rstrip", false);
      t.normalized = flag(a, "normalized", !t.special);
      LOOM_CHECK(!flag(a, "single_word", false),
                 key + " '" + t.content + "': single_word tokens are not supported");
      if (t.content.empty()) continue;
      if (auto it = index.find(t.content); it != index.end()) {  // same content: new flags
        t.id = added[it->second].id;
        added[it->second] = std::move(t);
        continue;
      }
      if (auto it = m->model_ids.find(t.content); it != m->model_ids.end()) {
        t.id = it->second;
      } else {
        t.id = static_cast<int32_t>(max_added >= model_size ? max_added + 1 : model_size);
      }
      LOOM_CHECK(t.id < (1 << 30), key + ": too many added tokens");
      max_added = std::max<int64_t>(max_added, t.id);
      max_id = std::max<int64_t>(max_id, t.id);
      index.emplace(t.content, added.size());
      added.push_back(std::move(t));
    }
  }
  m->tokens.assign(static_cast<size_t>(max_id) + 1, "");
  for (const auto& [tok, id] : m->model_ids) m->tokens[id] = tok;
  for (const AddedToken& t : added) m->tokens[t.id] = t.content;
  m->added = std::move(added);

  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(model["merges"].size());
  size_t r = 0;
  for (const json& mj : model["merges"]) {
    const std::string key = where + ": model.merges[" + std::to_string(r++) + "]";
    if (mj.is_string()) {
      const std::string line = mj.get<std::string>();
      const size_t sp = line.find(' ');
      LOOM_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos,
                 key + " '" + line + "' is not two tokens separated by one space");
      pairs.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    } else {
      LOOM_CHECK(mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string(),
                 key + " must be \"left right\" or [left, right]");
      pairs.emplace_back(mj[0].get<std::string>(), mj[1].get<std::string>());
    }
  }
  m->set_merges(pairs, where, "model.merges");

  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    LOOM_CHECK(model["unk_token"].is_string(), where + ": model.unk_token must be a string");
    auto it = m->model_ids.find(model["unk_token"].get<std::string>());
    LOOM_CHECK(it != m->model_ids.end(), where + ": model.unk_token '" +
                                             model["unk_token"].get<std::string>() +
                                             "' is not in model.vocab");
    m->unk_id = it->second;
    m->fuse_unk = flag(model, "fuse_unk", false);
  }
  m->ignore_merges = flag(model, "ignore_merges", false);

  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    const bool empty_seq = type_of(n) == "Sequence" && n.contains("normalizers") &&
                           n["normalizers"].is_array() && n["normalizers"].empty();
    LOOM_CHECK(empty_seq, where + ": normalizer " + brief(n) +
                              " is not supported (byte-level BPE tokenizers have none)");
  }
  LOOM_CHECK(j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null(),
             where + ": no pre_tokenizer (byte-level BPE needs ByteLevel)");
  const std::optional<PreTokenizer> pre = classify_pre(j["pre_tokenizer"]);
  LOOM_CHECK(pre.has_value(),
             where + ": pre_tokenizer " + brief(j["pre_tokenizer"]) +
                 " is not one Loom implements: ByteLevel(use_regex) (GPT-2), Split(Llama-3 or "
                 "Qwen2 regex, Isolated) + ByteLevel(use_regex=false), Digits(individual_digits) "
                 "+ ByteLevel (SmolLM2), all without add_prefix_space");
  m->pre = *pre;
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    LOOM_CHECK(has_byte_level_decoder(j["decoder"]),
               where + ": decoder " + brief(j["decoder"]) + " is not ByteLevel");
  }

  std::unordered_map<std::string, int32_t> all_ids = m->model_ids;
  for (const AddedToken& t : m->added) all_ids[t.content] = t.id;
  if (j.contains("post_processor") && !j["post_processor"].is_null())
    read_post_processor(j["post_processor"], all_ids, &m->bos, &m->eos, &m->add_bos);

  // An HF folder: tokenizer_config.json names bos/eos/pad and whether BOS is added.
  if (path.filename() == "tokenizer.json") {
    const std::filesystem::path cfg = path.parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(cfg)) {
      const json c = parse_json_file(cfg, read_file(cfg));
      auto id_of = [&](const char* key, int32_t* out) {
        if (!c.is_object() || !c.contains(key)) return;
        const json& v = c[key];
        std::string s;
        if (v.is_string()) {
          s = v.get<std::string>();
        } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
          s = v["content"].get<std::string>();
        } else {
          return;
        }
        auto it = all_ids.find(s);
        if (it != all_ids.end()) *out = it->second;
      };
      id_of("bos_token", &m->bos);
      id_of("eos_token", &m->eos);
      id_of("pad_token", &m->pad);
      if (c.is_object() && c.contains("add_bos_token") && c["add_bos_token"].is_boolean())
        m->add_bos = c["add_bos_token"].get<bool>() && m->bos >= 0;
    }
  }
  m->finish(where);
  return Tokenizer(std::move(m));
}

}  // namespace loom::data
