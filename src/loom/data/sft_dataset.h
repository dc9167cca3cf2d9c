// Supervised fine-tuning samples from conversations: each conversation is rendered by a
// chat template, tokenized segment by segment, and turned into next-token targets that
// are -100 except where the template marks the text trainable (assistant turns).
//   unpacked: one conversation per row, padded with pad_id (targets -100 there)
//   packed  : conversations concatenated greedily into rows, positions restarting at each
//             (the model then keeps attention inside each conversation)
// A conversation longer than seq_len + 1 tokens is truncated (counted); one with no
// trainable token left is dropped (counted).
// The tokenized rows can be cached in a file keyed by everything they depend on, so a
// second run does not tokenize again.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/data/chat_template.h"
#include "loom/data/conversation.h"
#include "loom/data/dataset.h"

namespace loom::data {

struct SftOptions {
  int64_t seq_len = 256;
  bool pack = false;
  ChatTemplate chat_template = ChatTemplate::Plain;
  TemplateOptions template_options;
  int32_t pad_id = 0;
  std::string progress_label = "tokenizing";  // util/progress.h, on a terminal
};

struct SftStats {
  int64_t conversations = 0, rows = 0, truncated = 0, dropped = 0;
  int64_t tokens = 0, target_tokens = 0;
  bool from_cache = false;
};

class SftDataset : public Dataset {
 public:
  // cache_file empty: no cache. cache_key: a string naming everything the rows depend on
  // (data file hash, tokenizer, template, options); a cache file with another key is
  // rebuilt.
  static std::unique_ptr<SftDataset> build(const std::vector<Conversation>& convs,
                                           const EncodeFn& encode, const SftOptions& opt,
                                           const std::filesystem::path& cache_file,
                                           const std::string& cache_key, SftStats* stats);
  int64_t size() const override { return rows_; }
  int64_t seq_len() const override { return T_; }
  void get(int64_t index, int32_t* ids, int32_t* targets) const override;
  bool packed() const override { return packed_; }
  void get_positions(int64_t index, int32_t* pos) const override;

 private:
  SftDataset() = default;
  bool load_cache(const std::filesystem::path& f, uint64_t key, SftStats* st);
  void save_cache(const std::filesystem::path& f, uint64_t key, const SftStats& st) const;

  int64_t T_ = 0, rows_ = 0;
  bool packed_ = false;
  std::vector<int32_t> ids_, targets_, pos_;  // [rows, T] each
};

// Deterministically splits off about `fraction` of the conversations (by a hash of the
// index and seed) as a validation set.
void split_validation(std::vector<Conversation>& train, std::vector<Conversation>& valid,
                      double fraction, uint64_t seed);

// FNV-1a 64 of a file's bytes (for cache keys).
uint64_t file_hash(const std::filesystem::path& p);

}  // namespace loom::data
