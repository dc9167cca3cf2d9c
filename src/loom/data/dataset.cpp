#include "loom/data/dataset.h"

#include <algorithm>
#include <fstream>

#include "loom/tensor/rng.h"
#include "loom/util/error.h"

namespace loom::data {

ByteTextDataset::ByteTextDataset(const std::filesystem::path& path, int64_t seq_len) : T_(seq_len) {
  LOOM_CHECK(seq_len > 0, "data.seq_len must be positive");
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), path.string() + ": cannot open data file");
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  n_windows_ = bytes_.empty() ? 0 : (static_cast<int64_t>(bytes_.size()) - 1) / T_;
  LOOM_CHECK(n_windows_ > 0, path.string() + ": " + std::to_string(bytes_.size()) +
                                 " bytes is too short for one sample of seq_len " +
                                 std::to_string(T_) + " + 1");
}

void ByteTextDataset::get(int64_t index, int32_t* ids, int32_t* targets) const {
  LOOM_CHECK(index >= 0 && index < n_windows_, "sample index out of range");
  const uint8_t* w = bytes_.data() + index * T_;
  for (int64_t t = 0; t < T_; ++t) {
    ids[t] = w[t];
    targets[t] = w[t + 1];
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
