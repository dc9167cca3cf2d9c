#include "loom/data/sampler.h"

#include <algorithm>
#include <numeric>

#include "loom/tensor/rng.h"

namespace loom::data {

Sampler::Sampler(const Dataset& ds, uint64_t seed, bool shuffle, int64_t micro_batch,
                 int64_t grad_accum, int64_t dp_size, int64_t dp_rank)
    : ds_(ds),
      parts_(ds.parts()),
      seed_(seed),
      shuffle_(shuffle),
      mbs_(micro_batch),
      accum_(grad_accum),
      dp_(dp_size),
      rank_(dp_rank),
      perm_epoch_(parts_.size(), -1),
      perm_(parts_.size()),
      taken_(parts_.size(), 0) {}

int64_t Sampler::index_in(int part, int64_t c) const {
  const int64_t n = parts_[part].dataset->size();
  const int64_t epoch = c / n;
  if (!shuffle_) return c % n;
  std::vector<int64_t>& perm = perm_[part];
  if (epoch != perm_epoch_[part]) {
    // Fisher-Yates driven by the counter RNG keyed by (seed, part, epoch): reproducible
    // anywhere. Part 0's streams are a plain dataset's.
    perm.resize(n);
    std::iota(perm.begin(), perm.end(), 0);
    const uint64_t stream = stream_id("sampler.epoch") + static_cast<uint64_t>(epoch) +
                            (static_cast<uint64_t>(part) << 40);
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng_u64(seed_, stream, i) % (i + 1));
      std::swap(perm[i], perm[j]);
    }
    perm_epoch_[part] = epoch;
  }
  return perm[c % n];
}

std::pair<int, int64_t> Sampler::sample_at(int64_t k) const {
  if (parts_.size() == 1) return {0, index_in(0, k)};
  if (k < blend_start_) {  // behind the kept window: blend again from the run's start
    blend_.clear();
    blend_start_ = 0;
    std::fill(taken_.begin(), taken_.end(), 0);
  }
  // A long run's blend is not kept whole: entries more than a window behind k are dropped
  // (each entry holds its own count, so nothing else changes).
  const int64_t window = std::max<int64_t>(1 << 16, 2 * global_batch());
  while (k - blend_start_ > 2 * window && !blend_.empty()) {
    blend_.pop_front();
    ++blend_start_;
  }
  while (blend_start_ + static_cast<int64_t>(blend_.size()) <= k) {
    const double next = static_cast<double>(blend_start_ + blend_.size() + 1);
    int best = 0;
    for (int p = 1; p < static_cast<int>(parts_.size()); ++p)
      if (parts_[p].weight * next - taken_[p] > parts_[best].weight * next - taken_[best]) best = p;
    blend_.emplace_back(best, taken_[best]++);
  }
  const auto [part, c] = blend_[k - blend_start_];
  return {part, index_in(part, c)};
}

MicroBatch Sampler::micro_batch(int64_t step, int64_t micro) const {
  const int64_t T = ds_.seq_len();
  MicroBatch mb{Tensor::zeros({mbs_, T}, DType::I32), Tensor::zeros({mbs_, T}, DType::I32),
                Tensor(), (micro * dp_ + rank_) * mbs_};
  const int64_t first = step * global_batch() + mb.batch_row;
  if (ds_.packed()) mb.pos = Tensor::zeros({mbs_, T}, DType::I32);
  for (int64_t i = 0; i < mbs_; ++i) {
    const auto [part, idx] = sample_at(first + i);
    const Dataset& d = *parts_[part].dataset;
    d.get(idx, mb.ids.i32() + i * T, mb.targets.i32() + i * T);
    if (ds_.packed()) d.get_positions(idx, mb.pos.i32() + i * T);
  }
  return mb;
}

}  // namespace loom::data
