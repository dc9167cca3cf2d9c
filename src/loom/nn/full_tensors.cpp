#include "loom/nn/full_tensors.h"

#include <utility>

namespace loom::nn {

FullTensors::FullTensors(ParamStore& ps, const TensorParallel& tp, int root) {
  if (!tp.active()) return;
  for (auto& p : ps.all()) {
    if (!p->shard.sharded() || !p->has_f32() || !p->value.defined()) continue;
    Tensor full = Tensor::zeros(p->full_shape);
    if (primary_copy(*p, tp.rank())) shard_to_full(*p, p->value.f32(), full.f32());
    tp.comm->all_reduce_sum(full.f32(), full.numel());
    if (tp.rank() != root) continue;
    held_.push_back({p.get(), p->value, p->shape, p->shard});
    p->value = std::move(full);
    p->shape = p->full_shape;
    p->shard = ShardSpec{};
  }
}

FullTensors::~FullTensors() {
  for (Held& h : held_) {
    h.p->value = std::move(h.value);
    h.p->shape = std::move(h.shape);
    h.p->shard = h.shard;
  }
}

}  // namespace loom::nn
