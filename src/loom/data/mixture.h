// Several datasets trained on together (data.path as a list of {path, format, weight}).
// The sampler blends the parts by weight (data/sampler.h), each through its own epochs and
// shuffles; read as one Dataset, index i runs through the parts one after another (what
// evaluation iterates). All parts have one seq_len; the mixture is packed when any part is
// (the others then give positions 0..T-1).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/data/dataset.h"

namespace loom::data {

class MixtureDataset : public Dataset {
 public:
  // weights > 0, one per part (normalised here).
  MixtureDataset(std::vector<std::unique_ptr<Dataset>> parts, std::vector<double> weights);
  int64_t size() const override { return size_; }
  int64_t seq_len() const override { return parts_.at(0)->seq_len(); }
  void get(int64_t index, int32_t* ids, int32_t* targets) const override;
  bool packed() const override { return packed_; }
  void get_positions(int64_t index, int32_t* pos) const override;
  std::vector<Part> parts() const override;

 private:
  // The part holding concatenated index i, and i's index within it.
  std::pair<const Dataset*, int64_t> locate(int64_t index) const;
  std::vector<std::unique_ptr<Dataset>> parts_;
  std::vector<double> weights_;
  int64_t size_ = 0;
  bool packed_ = false;
};

}  // namespace loom::data
