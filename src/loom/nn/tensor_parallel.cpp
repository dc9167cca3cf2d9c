#include "loom/nn/tensor_parallel.h"

#include <algorithm>
#include <string>
#include <vector>

#include "loom/util/error.h"
#include "loom/util/profile.h"

namespace loom::nn {

void copy_to_region_backward(const TensorParallel& tp, const Tensor& dx) {
  if (tp.active()) {
    prof::ScopedPhase ph(prof::Phase::Comm);
    tp.comm->all_reduce_sum(dx.f32(), dx.numel());
  }
}

void reduce_from_region_forward(const TensorParallel& tp, const Tensor& y) {
  if (tp.active()) {
    prof::ScopedPhase ph(prof::Phase::Comm);
    tp.comm->all_reduce_sum(y.f32(), y.numel());
  }
}

void sum_over_replicas(const TensorParallel& tp, int replicas, float* g, int64_t n) {
  if (!tp.active() || replicas <= 1) return;
  // Each rank writes its part at its slice's place in a zeroed [slices, n] buffer, so one
  // all-reduce over the whole group sums each slice over exactly its replicas.
  const int slices = tp.size() / replicas, slice = tp.rank() / replicas;
  std::vector<float> buf(static_cast<size_t>(slices * n), 0.0f);
  std::copy_n(g, n, buf.begin() + slice * n);
  {
    prof::ScopedPhase ph(prof::Phase::Comm);
    tp.comm->all_reduce_sum(buf.data(), static_cast<int64_t>(buf.size()));
  }
  std::copy_n(buf.begin() + slice * n, n, g);
}

ShardSpec vocab_shard(int64_t V, const TensorParallel& tp, const std::string& name) {
  const int64_t per = (V + tp.size() - 1) / tp.size(), first = tp.rank() * per;
  LOOM_CHECK(first < V, name + ": a vocabulary of " + std::to_string(V) +
                            " is too small to split over " + std::to_string(tp.size()) +
                            " tensor-parallel ranks");
  return ShardSpec{0, 1, first, std::min(per, V - first)};
}

namespace {
void check_split(const TensorParallel& tp, const Tensor& local, const Tensor& full,
                 const char* what) {
  LOOM_CHECK(local.numel() * tp.size() == full.numel(),
             std::string(what) + ": rows " + shape_str(local.shape()) + " x " +
                 std::to_string(tp.size()) + " ranks do not make " + shape_str(full.shape()));
}
}  // namespace

void gather_from_sequence_forward(const TensorParallel& tp, const Tensor& local,
                                  const Tensor& full) {
  check_split(tp, local, full, "gather_from_sequence");
  if (tp.active()) {
    prof::ScopedPhase ph(prof::Phase::Comm);
    tp.comm->all_gather(local.f32(), full.f32(), local.numel());
  } else {
    std::copy_n(local.f32(), local.numel(), full.f32());
  }
}

void gather_from_sequence_backward(const TensorParallel& tp, const Tensor& dfull,
                                   const Tensor& dlocal) {
  check_split(tp, dlocal, dfull, "gather_from_sequence backward");
  if (tp.active()) {
    prof::ScopedPhase ph(prof::Phase::Comm);
    tp.comm->reduce_scatter_sum(dfull.f32(), dlocal.f32(), dlocal.numel());
  } else {
    std::copy_n(dfull.f32(), dfull.numel(), dlocal.f32());
  }
}

void reduce_scatter_to_sequence_forward(const TensorParallel& tp, const Tensor& full,
                                        const Tensor& local) {
  gather_from_sequence_backward(tp, full, local);
}

void reduce_scatter_to_sequence_backward(const TensorParallel& tp, const Tensor& dlocal,
                                         const Tensor& dfull) {
  gather_from_sequence_forward(tp, dlocal, dfull);
}

SequencePartialGrads::SequencePartialGrads(const TensorParallel& tp,
                                           const std::vector<Parameter*>& params, int64_t leading)
    : tp_(tp) {
  if (!tp.sequence_split()) return;
  for (Parameter* p : params) {
    if (!p || !p->trainable) continue;
    params_.push_back(p);
    const int64_t n = p->grad.numel();
    count_.push_back(leading < 0 ? n : std::min(leading, n));
    before_.insert(before_.end(), p->grad.f32(), p->grad.f32() + count_.back());
  }
}

void SequencePartialGrads::sum_over_sequence() {
  if (params_.empty()) return;
  // This backward's contribution, summed over the ranks' rows.
  std::vector<float> delta(before_.size());
  size_t at = 0;
  for (size_t k = 0; k < params_.size(); ++k)
    for (int64_t i = 0; i < count_[k]; ++i, ++at)
      delta[at] = params_[k]->grad.f32()[i] - before_[at];
  {
    prof::ScopedPhase ph(prof::Phase::Comm);
    tp_.comm->all_reduce_sum(delta.data(), static_cast<int64_t>(delta.size()));
  }
  at = 0;
  for (size_t k = 0; k < params_.size(); ++k)
    for (int64_t i = 0; i < count_[k]; ++i, ++at)
      params_[k]->grad.f32()[i] = before_[at] + delta[at];
}

}  // namespace loom::nn
