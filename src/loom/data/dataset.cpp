#include "loom/data/dataset.h"

#include <algorithm>
#include <fstream>

#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/tensor/rng.h"
#include "loom/util/error.h"

namespace loom::data {

TokenWindowDataset::TokenWindowDataset(const std::vector<std::string>& documents,
                                       const EncodeFn& encode, const std::string& separator,
                                       int64_t seq_len, bool pack, const std::string& what)
    : T_(seq_len), pack_(pack) {
  LOOM_CHECK(seq_len > 0, "data.seq_len must be positive");
  const std::vector<int32_t> sep = encode(separator);
  for (const std::string& doc : documents) {
    starts_.push_back(static_cast<int64_t>(tokens_.size()));
    const std::vector<int32_t> t = encode(doc);
    tokens_.insert(tokens_.end(), t.begin(), t.end());
    tokens_.insert(tokens_.end(), sep.begin(), sep.end());
  }
  n_windows_ = tokens_.empty() ? 0 : (static_cast<int64_t>(tokens_.size()) - 1) / T_;
  LOOM_CHECK(n_windows_ > 0, what + ": " + std::to_string(tokens_.size()) +
                                 " tokens is too short for one sample of seq_len " +
                                 std::to_string(T_) + " + 1");
}

bool TokenWindowDataset::starts_document(int64_t offset) const {
  return std::binary_search(starts_.begin(), starts_.end(), offset);
}

void TokenWindowDataset::get(int64_t index, int32_t* ids, int32_t* targets) const {
  LOOM_CHECK(index >= 0 && index < n_windows_, "sample index out of range");
  const int64_t base = index * T_;
  const int32_t* w = tokens_.data() + base;
  std::copy(w, w + T_, ids);
  std::copy(w + 1, w + T_ + 1, targets);
  if (!pack_) return;
  for (int64_t t = 0; t < T_; ++t)
    if (starts_document(base + t + 1)) targets[t] = kernels::kIgnoreIndex;
}

void TokenWindowDataset::get_positions(int64_t index, int32_t* pos) const {
  LOOM_CHECK(index >= 0 && index < n_windows_, "sample index out of range");
  if (!pack_) return Dataset::get_positions(index, pos);
  int32_t p = 0;
  for (int64_t t = 0; t < T_; ++t) {
    if (t > 0 && starts_document(index * T_ + t)) p = 0;
    pos[t] = p++;
  }
}

void Dataset::get_positions(int64_t, int32_t* pos) const {
  for (int64_t t = 0; t < seq_len(); ++t) pos[t] = static_cast<int32_t>(t);
}

TensorDataset::TensorDataset(std::vector<int32_t> ids, std::vector<int32_t> targets,
                             int64_t seq_len)
    : ids_(std::move(ids)), targets_(std::move(targets)), T_(seq_len) {
  LOOM_CHECK(
      seq_len > 0 && !ids_.empty() && ids_.size() % seq_len == 0 && ids_.size() == targets_.size(),
      "TensorDataset: ids and targets must both be [N, seq_len]");
}

void TensorDataset::get(int64_t index, int32_t* ids, int32_t* targets) const {
  LOOM_CHECK(index >= 0 && index < size(), "sample index out of range");
  std::copy(ids_.begin() + index * T_, ids_.begin() + (index + 1) * T_, ids);
  std::copy(targets_.begin() + index * T_, targets_.begin() + (index + 1) * T_, targets);
}

void RandomTokenDataset::get(int64_t index, int32_t* ids, int32_t* targets) const {
  // T + 1 tokens per sample so targets are the next tokens, as in text.
  const uint64_t base = static_cast<uint64_t>(index) * (T_ + 1);
  for (int64_t t = 0; t < T_; ++t) {
    ids[t] = static_cast<int32_t>(rng_u64(seed_, 0, base + t) % V_);
    targets[t] = static_cast<int32_t>(rng_u64(seed_, 0, base + t + 1) % V_);
  }
}

}  // namespace loom::data
