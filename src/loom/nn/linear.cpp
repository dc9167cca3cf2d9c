#include "loom/nn/linear.h"

#include <algorithm>
#include <vector>

#include "loom/kernels/cpu/elementwise.h"
#include "loom/nn/buffers.h"
#include "loom/nn/weight_ops.h"
#include "loom/util/error.h"

namespace loom::nn {

Linear::Linear(ParamStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
               float init_std)
    : Linear(ps, name, in, out, bias, init_std, Split::none, TensorParallel{}, 1, 1) {}

Linear::Linear(ParamStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
               float init_std, Split split, const TensorParallel& tp, int parts, int replicas)
    : name_(name), in_(in), out_(out), split_(tp.active() ? split : Split::none), tp_(tp) {
  ShardSpec ws, bs;
  if (split_ == Split::column) {
    LOOM_CHECK(replicas >= 1 && tp.size() % replicas == 0,
               name + ": " + std::to_string(replicas) + " replicas do not divide the " +
                   std::to_string(tp.size()) + " tensor-parallel ranks");
    const int slices = tp.size() / replicas;
    const int64_t block = out / parts;
    LOOM_CHECK(out % parts == 0 && block % slices == 0,
               name + ": " + std::to_string(out) + " outputs (" + std::to_string(parts) +
                   " blocks) do not split over " + std::to_string(slices) + " ranks");
    const int64_t size = block / slices;
    ws = bs = ShardSpec{0, parts, (tp.rank() / replicas) * size, size, tp.rank() % replicas};
    out_ = parts * size;
    replicas_ = replicas;
  } else if (split_ == Split::row) {
    LOOM_CHECK(in % tp.size() == 0, name + ": " + std::to_string(in) +
                                        " inputs do not split over " + std::to_string(tp.size()) +
                                        " ranks");
    ws = ShardSpec{1, 1, tp.first(in), tp.share(in)};
    in_ = tp.share(in);
  }
  w_ = ps.add(name + ".weight", {out, in}, ParamKind::Weight, init_std, 0.0f, ws);
  if (bias) b_ = ps.add(name + ".bias", {out}, ParamKind::Bias, 0.0f, 0.0f, bs);
}

LoRA& Linear::attach_lora(ParamStore& ps, const LoraSpec& spec, const DropoutContext* ctx) {
  LOOM_CHECK(!lora_, name_ + ": LoRA attached twice");
  // Full sizes and W's shard: the branch splits with the layer (nn/lora.h).
  lora_ = std::make_unique<LoRA>(ps, name_, w_->full_shape[1], w_->full_shape[0], spec, ctx, tp_,
                                 w_->shard, replicas_);
  lora_->A()->expert = lora_->B()->expert = w_->expert;  // held where the weight is
  return *lora_;
}

const Tensor& Linear::forward(const Tensor& x) {
  LOOM_CHECK(x.dim(-1) == in_, w_->name + ": input " + shape_str(x.shape()) + " does not end in " +
                                   std::to_string(in_));
  if (split_ == Split::row && tp_.sequence_split()) return forward_to_sequence(x);
  Shape ys = x.shape();
  ys.back() = out_;
  ensure(y_, ys);
  x_ = x;
  const int64_t N = x.numel() / in_;
  if (split_ != Split::row) {
    if (lora_) lora_->forward_add(x, y_, 0, /*accumulate=*/false);  // the base adds onto it
    weight_forward(y_.f32(), x.f32(), *w_, b_, N, /*accumulate=*/lora_ != nullptr);
    return y_;
  }
  // Row-parallel: partial sums over this rank's inputs, reduced, then the bias once.
  weight_forward(y_.f32(), x.f32(), *w_, nullptr, N);
  reduce_from_region_forward(tp_, y_);
  if (b_) kernels::add_rows(y_.f32(), b_->value.f32(), N, out_);
  if (lora_) lora_->forward_add(x, y_);  // after the reduction: it reduces its own u
  return y_;
}

// Row-parallel under sequence parallel: x [N, in/tp] -> partial sums [N, out],
// reduce-scattered to this rank's rows y [N/tp, out], then the bias on those rows.
const Tensor& Linear::forward_to_sequence(const Tensor& x) {
  const int64_t N = x.numel() / in_;
  ensure(full_, {N, out_});
  ensure(y_, {tp_.share(N), out_});
  x_ = x;
  weight_forward(full_.f32(), x.f32(), *w_, nullptr, N);
  reduce_scatter_to_sequence_forward(tp_, full_, y_);
  if (b_) kernels::add_rows(y_.f32(), b_->value.f32(), y_.dim(0), out_);
  if (lora_) lora_->forward_add(x, y_, tp_.first(N));  // this rank's rows of the branch
  return y_;
}

namespace {
// Parameter p's gradient of this backward alone, summed over the ranks holding the same
// slice (nn/tensor_parallel.h). `before` is p's gradient as it was before this backward.
void sum_grad_over_replicas(const TensorParallel& tp, int replicas, Parameter& p,
                            const std::vector<float>& before) {
  const int64_t n = p.grad.numel();
  float* g = p.grad.f32();
  std::vector<float> part(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) part[i] = g[i] - before[i];
  sum_over_replicas(tp, replicas, part.data(), n);
  for (int64_t i = 0; i < n; ++i) g[i] = before[i] + part[i];
}
}  // namespace

void Linear::release_activations() {
  x_ = y_ = full_ = Tensor();
  if (lora_) lora_->release_activations();
}

void Linear::backward(const Tensor& dy, const Tensor& dx) {
  float* dxp = dx.defined() ? dx.f32() : nullptr;
  const int64_t N = x_.numel() / in_;
  if (replicas_ > 1) {
    // Replicated slice: the gradient is a partial sum (this rank's heads only).
    std::vector<float> wb, bb;
    if (w_->trainable) wb.assign(w_->grad.f32(), w_->grad.f32() + w_->grad.numel());
    if (b_ && b_->trainable) bb.assign(b_->grad.f32(), b_->grad.f32() + b_->grad.numel());
    weight_backward(dxp, dy.f32(), x_.f32(), *w_, b_, N);
    if (w_->trainable) sum_grad_over_replicas(tp_, replicas_, *w_, wb);
    if (b_ && b_->trainable) sum_grad_over_replicas(tp_, replicas_, *b_, bb);
    if (lora_) lora_->backward(dy, dx);  // sums its B's gradient over the replicas itself
    return;
  }
  // Row-parallel: dy is replicated (g's backward is the identity); the bias gradient is
  // the same on every rank. Under sequence parallel dy holds this rank's rows [N/tp, out]:
  // all-gathered to [N, out] (the reduce-scatter's backward) first.
  if (split_ == Split::row && tp_.sequence_split()) {
    reduce_scatter_to_sequence_backward(tp_, dy, full_);
    weight_backward(dxp, full_.f32(), x_.f32(), *w_, b_, N);
    if (lora_) lora_->backward(full_, dx);  // dy of all N rows, as without sequence parallel
    return;
  }
  weight_backward(dxp, dy.f32(), x_.f32(), *w_, b_, N);
  if (lora_) lora_->backward(dy, dx);
}

}  // namespace loom::nn
