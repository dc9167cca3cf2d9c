#include "loom/data/mixture.h"

#include <numeric>

#include "loom/util/error.h"

namespace loom::data {

MixtureDataset::MixtureDataset(std::vector<std::unique_ptr<Dataset>> parts,
                               std::vector<double> weights)
    : parts_(std::move(parts)), weights_(std::move(weights)) {
  LOOM_CHECK(!parts_.empty() && parts_.size() == weights_.size(),
             "a mixture needs one weight per dataset");
  const double total = std::accumulate(weights_.begin(), weights_.end(), 0.0);
  for (size_t p = 0; p < parts_.size(); ++p) {
    LOOM_CHECK(weights_[p] > 0.0, "mixture weights must be > 0");
    LOOM_CHECK(parts_[p]->seq_len() == parts_[0]->seq_len(),
               "the datasets of a mixture must have one seq_len");
    weights_[p] /= total;
    size_ += parts_[p]->size();
    packed_ = packed_ || parts_[p]->packed();
  }
}

std::pair<const Dataset*, int64_t> MixtureDataset::locate(int64_t index) const {
  LOOM_CHECK(index >= 0 && index < size_, "sample index out of range");
  for (const auto& p : parts_) {
    if (index < p->size()) return {p.get(), index};
    index -= p->size();
  }
  return {nullptr, 0};  // unreachable: index < size_
}

void MixtureDataset::get(int64_t index, int32_t* ids, int32_t* targets) const {
  const auto [part, i] = locate(index);
  part->get(i, ids, targets);
}

void MixtureDataset::get_positions(int64_t index, int32_t* pos) const {
  const auto [part, i] = locate(index);
  part->get_positions(i, pos);
}

std::vector<Dataset::Part> MixtureDataset::parts() const {
  std::vector<Part> out;
  for (size_t p = 0; p < parts_.size(); ++p) out.push_back({parts_[p].get(), weights_[p]});
  return out;
}

}  // namespace loom::data
