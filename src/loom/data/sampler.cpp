#include "loom/data/sampler.h"

#include <numeric>

#include "loom/tensor/rng.h"

namespace loom::data {

Sampler::Sampler(const Dataset& ds, uint64_t seed, bool shuffle, int64_t micro_batch,
                 int64_t grad_accum, int64_t dp_size, int64_t dp_rank)
    : ds_(ds),
      seed_(seed),
      shuffle_(shuffle),
      mbs_(micro_batch),
      accum_(grad_accum),
      dp_(dp_size),
      rank_(dp_rank) {}

int64_t Sampler::sample_at(int64_t k) const {
  const int64_t n = ds_.size();
  const int64_t epoch = k / n;
  if (!shuffle_) return k % n;
  if (epoch != perm_epoch_) {
    // Fisher-Yates driven by the counter RNG keyed by (seed, epoch): reproducible anywhere.
    perm_.resize(n);
    std::iota(perm_.begin(), perm_.end(), 0);
    const uint64_t stream = stream_id("sampler.epoch") + static_cast<uint64_t>(epoch);
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng_u64(seed_, stream, i) % (i + 1));
      std::swap(perm_[i], perm_[j]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[k % n];
}

MicroBatch Sampler::micro_batch(int64_t step, int64_t micro) const {
  const int64_t T = ds_.seq_len();
  MicroBatch mb{Tensor::zeros({mbs_, T}, DType::I32), Tensor::zeros({mbs_, T}, DType::I32),
                Tensor(), (micro * dp_ + rank_) * mbs_};
  const int64_t first = step * global_batch() + mb.batch_row;
  if (ds_.packed()) mb.pos = Tensor::zeros({mbs_, T}, DType::I32);
  for (int64_t i = 0; i < mbs_; ++i) {
    const int64_t idx = sample_at(first + i);
    ds_.get(idx, mb.ids.i32() + i * T, mb.targets.i32() + i * T);
    if (ds_.packed()) ds_.get_positions(idx, mb.pos.i32() + i * T);
  }
  return mb;
}

}  // namespace loom::data
