// One global sample order, independent of the number of ranks: sample k of the run is
// epoch k / N, position perm_epoch[k % N] (a seeded shuffle of the N samples per epoch).
// Step s consumes global samples [s * G, (s + 1) * G) with G = train_batch_size; within
// the step, micro-batch m of data-parallel rank r takes the slice
// [((m * dp) + r) * mbs, ... + mbs). Every layout therefore sees the same global batch.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/data/dataset.h"
#include "loom/tensor/tensor.h"

namespace loom::data {

struct MicroBatch {
  Tensor ids;             // [mbs, T] i32
  Tensor targets;         // [mbs, T] i32
  Tensor pos;             // [mbs, T] i32 position ids; undefined unless the dataset is packed
  int64_t batch_row = 0;  // index of its first sample within the step's global batch
};

class Sampler {
 public:
  Sampler(const Dataset& ds, uint64_t seed, bool shuffle, int64_t micro_batch, int64_t grad_accum,
          int64_t dp_size, int64_t dp_rank);
  MicroBatch micro_batch(int64_t step, int64_t micro) const;
  int64_t global_batch() const { return mbs_ * accum_ * dp_; }
  int64_t epoch_of(int64_t step) const { return step * global_batch() / ds_.size(); }

 private:
  int64_t sample_at(int64_t k) const;  // dataset index of global sample k
  const Dataset& ds_;
  uint64_t seed_;
  bool shuffle_;
  int64_t mbs_, accum_, dp_, rank_;
  mutable int64_t perm_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

}  // namespace loom::data
