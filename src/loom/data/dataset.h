// Datasets yield fixed-length training samples: ids [T], aligned targets [T]
// (targets[t] is the label for position t; -100 = no loss) and position ids [T] (0..T-1,
// or restarting where a packed row starts its next sample). A dataset is indexable so
// that the sampler, not the dataset, decides which rank sees which sample.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace loom::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;  // number of samples in one epoch
  virtual int64_t seq_len() const = 0;
  virtual void get(int64_t index, int32_t* ids, int32_t* targets) const = 0;
  // Packed datasets override both: the model then gets explicit position ids.
  virtual bool packed() const { return false; }
  virtual void get_positions(int64_t index, int32_t* pos) const;
  // The weighted datasets this one is made of, which the sampler blends (a mixture,
  // data/mixture.h); a plain dataset is its only part, of weight 1.
  struct Part {
    const Dataset* dataset;
    double weight;
  };
  virtual std::vector<Part> parts() const { return {{this, 1.0}}; }
};

using EncodeFn = std::function<std::vector<int32_t>(const std::string&)>;

// Continued pre-training: documents concatenated into one token stream, each followed by
// the separator (the tokenizer's EOS), cut into consecutive windows of seq_len + 1 tokens
// that overlap by one so every token is a target once.
//   unpacked: a window runs across document boundaries as the stream does (GPT-2's way)
//   packed  : positions restart at each document's first token, so the model keeps
//             attention inside each document, and the separator that ends a document has
//             no target: nothing is predicted across a boundary (Megatron's
//             reset_position_ids, reset_attention_mask and eod_mask_loss)
class TokenWindowDataset : public Dataset {
 public:
  // Each document is encoded and followed by encode(separator). `what` names the source
  // in errors.
  TokenWindowDataset(const std::vector<std::string>& documents, const EncodeFn& encode,
                     const std::string& separator, int64_t seq_len, bool pack,
                     const std::string& what);
  int64_t size() const override { return n_windows_; }
  int64_t seq_len() const override { return T_; }
  void get(int64_t index, int32_t* ids, int32_t* targets) const override;
  bool packed() const override { return pack_; }
  void get_positions(int64_t index, int32_t* pos) const override;
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(starts_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  bool starts_document(int64_t offset) const;  // does a document begin at this token?
  std::vector<int32_t> tokens_;
  std::vector<int64_t> starts_;  // sorted offsets of each document's first token
  int64_t T_, n_windows_;
  bool pack_;
};

// Samples given in memory: ids and targets [N, T] (tests, fixtures, small jobs).
class TensorDataset : public Dataset {
 public:
  TensorDataset(std::vector<int32_t> ids, std::vector<int32_t> targets, int64_t seq_len);
  int64_t size() const override { return static_cast<int64_t>(ids_.size()) / T_; }
  int64_t seq_len() const override { return T_; }
  void get(int64_t index, int32_t* ids, int32_t* targets) const override;

 private:
  std::vector<int32_t> ids_, targets_;
  int64_t T_;
};

// Uniformly random tokens in [0, vocab), keyed by (seed, sample, position): for
// benchmarks and tests that need a dataset of a given shape and no file.
class RandomTokenDataset : public Dataset {
 public:
  RandomTokenDataset(int64_t vocab, int64_t seq_len, int64_t n_samples, uint64_t seed)
      : V_(vocab), T_(seq_len), n_(n_samples), seed_(seed) {}
  int64_t size() const override { return n_; }
  int64_t seq_len() const override { return T_; }
  void get(int64_t index, int32_t* ids, int32_t* targets) const override;

 private:
  int64_t V_, T_, n_;
  uint64_t seed_;
};

}  // namespace loom::data
