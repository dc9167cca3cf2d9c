#include "loom/nn/lm_head.h"

#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/nn/buffers.h"
#include "loom/nn/weight_ops.h"
#include "loom/util/error.h"

namespace loom::nn {

const Tensor& LMHead::forward(const Tensor& h) {
  const int64_t V = w_->shape[0], C = w_->shape[1], N = h.numel() / C;
  LOOM_CHECK(h.dim(-1) == C, w_->name + ": head input " + shape_str(h.shape()));
  Shape out = h.shape();
  out.back() = V;
  ensure(logits_, out);
  h_ = h;
  weight_forward(logits_.f32(), h.f32(), *w_, nullptr, N);
  return logits_;
}

double LMHead::backward(const Tensor& targets, float grad_scale, const Tensor& dh) {
  const int64_t V = w_->shape[0], N = logits_.numel() / V;
  LOOM_CHECK(targets.numel() == N, "targets " + shape_str(targets.shape()) +
                                       " do not match logits " + shape_str(logits_.shape()));
  const double loss_sum =
      kernels::cross_entropy_backward(logits_.f32(), targets.i32(), N, V, grad_scale);
  weight_backward(dh.f32(), logits_.f32(), h_.f32(), *w_, nullptr, N);
  return loss_sum;
}

}  // namespace loom::nn
