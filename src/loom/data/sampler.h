// One global sample order, independent of the number of ranks: sample k of the run is
// epoch k / N, position perm_epoch[k % N] (a seeded shuffle of the N samples per epoch).
// Step s consumes global samples [s * G, (s + 1) * G) with G = train_batch_size; within
// the step, micro-batch m of data-parallel rank r takes the slice
// [((m * dp) + r) * mbs, ... + mbs). Every layout therefore sees the same global batch,
// and with the same mbs one process's micro-batch m * dp + r is rank r's m-th (ZeRO-2/3's
// pairwise gradient sum relies on this interleaving, parallel/zero.h).
// A dataset of weighted parts (a mixture) is blended as Megatron's BlendedDataset does:
// sample k comes from the part furthest below its share w_p * (k + 1), so every prefix of
// the run holds each part's share to within one sample; it is that part's c-th sample (c
// counted from the run's start), taken through the part's own epochs and shuffles as above.
// A plain dataset is one part, so there c = k.
#pragma once

#include <cstdint>
#include <deque>
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
  // Global sample k: which part it comes from and its index there.
  std::pair<int, int64_t> sample_at(int64_t k) const;

 private:
  int64_t index_in(int part, int64_t c) const;  // a part's c-th sample, through its epochs
  const Dataset& ds_;
  std::vector<Dataset::Part> parts_;
  uint64_t seed_;
  bool shuffle_;
  int64_t mbs_, accum_, dp_, rank_;
  // Per part: the epoch whose shuffle perm holds.
  mutable std::vector<int64_t> perm_epoch_;
  mutable std::vector<std::vector<int64_t>> perm_;
  // The blend (mixtures only): samples [blend_start_, + size) as (part, that part's count
  // c before it), and how many samples each part has given up to the end.
  mutable std::deque<std::pair<int, int64_t>> blend_;
  mutable int64_t blend_start_ = 0;
  mutable std::vector<int64_t> taken_;
};

}  // namespace loom::data
