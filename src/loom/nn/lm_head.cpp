#include "loom/nn/lm_head.h"

#include <cmath>
#include <vector>

#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/nn/buffers.h"
#include "loom/nn/weight_ops.h"
#include "loom/util/error.h"

namespace loom::nn {

LMHead::LMHead(Parameter* weight, int64_t vocab, const TensorParallel& tp)
    : w_(weight), V_(vocab), v0_(weight->shard.sharded() ? weight->shard.offset : 0), tp_(tp) {}

const Tensor& LMHead::forward(const Tensor& h) {
  const int64_t Vl = w_->shape[0], C = w_->shape[1], N = h.numel() / C;
  LOOM_CHECK(h.dim(-1) == C, w_->name + ": head input " + shape_str(h.shape()));
  Shape out = h.shape();
  out.back() = Vl;
  ensure(logits_, out);
  h_ = h;
  weight_forward(logits_.f32(), h.f32(), *w_, nullptr, N);
  return logits_;
}

double LMHead::backward(const Tensor& targets, float grad_scale, const Tensor& dh) {
  const int64_t Vl = w_->shape[0], N = logits_.numel() / Vl;
  LOOM_CHECK(targets.numel() == N, "targets " + shape_str(targets.shape()) +
                                       " do not match logits " + shape_str(logits_.shape()));
  const int32_t* t = targets.i32();
  float* x = logits_.f32();
  double loss_sum = 0.0;
  if (!tp_.active()) {
    loss_sum = kernels::cross_entropy_backward(x, t, N, Vl, grad_scale);
  } else {
    std::vector<double> mx(N), stats(2 * N);  // stats: sums of exponentials, target logits
    kernels::vp_row_max(x, N, Vl, mx.data());
    tp_.comm->all_reduce_max(mx.data(), N);
    kernels::vp_row_partials(x, t, N, Vl, v0_, V_, mx.data(), stats.data(), stats.data() + N);
    tp_.comm->all_reduce_sum(stats.data(), 2 * N);
    for (int64_t n = 0; n < N; ++n)
      if (t[n] != kernels::kIgnoreIndex) loss_sum += std::log(stats[n]) - stats[N + n];
    kernels::vp_backward(x, t, N, Vl, v0_, mx.data(), stats.data(), grad_scale);
  }
  weight_backward(dh.f32(), x, h_.f32(), *w_, nullptr, N);
  if (!tp_.sequence_split()) copy_to_region_backward(tp_, dh);
  return loss_sum;
}

void LMHead::loss_sums(const Tensor& targets, double* per_row) const {
  const int64_t Vl = w_->shape[0], N = logits_.numel() / Vl;
  LOOM_CHECK(targets.ndim() == 2 && targets.numel() == N, "targets " + shape_str(targets.shape()) +
                                                              " do not match logits " +
                                                              shape_str(logits_.shape()));
  const int64_t B = targets.dim(0), T = targets.dim(1);
  const int32_t* t = targets.i32();
  const float* x = logits_.f32();
  if (!tp_.active()) {
    for (int64_t b = 0; b < B; ++b)
      per_row[b] = kernels::cross_entropy_loss(x + b * T * Vl, t + b * T, T, Vl);
    return;
  }
  std::vector<double> mx(N), stats(2 * N);  // as in backward
  kernels::vp_row_max(x, N, Vl, mx.data());
  tp_.comm->all_reduce_max(mx.data(), N);
  kernels::vp_row_partials(x, t, N, Vl, v0_, V_, mx.data(), stats.data(), stats.data() + N);
  tp_.comm->all_reduce_sum(stats.data(), 2 * N);
  for (int64_t b = 0; b < B; ++b) {
    per_row[b] = 0.0;
    for (int64_t n = b * T; n < (b + 1) * T; ++n)
      if (t[n] != kernels::kIgnoreIndex) per_row[b] += std::log(stats[n]) - stats[N + n];
  }
}

}  // namespace loom::nn
