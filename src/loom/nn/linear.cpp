#include "loom/nn/linear.h"

#include "loom/kernels/cpu/matmul.h"
#include "loom/nn/buffers.h"
#include "loom/util/error.h"

namespace loom::nn {

Linear::Linear(ParamStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
               float init_std)
    : in_(in), out_(out) {
  w_ = ps.add(name + ".weight", {out, in}, ParamKind::Weight, init_std);
  if (bias) b_ = ps.add(name + ".bias", {out}, ParamKind::Bias, 0.0f, 0.0f);
}

const Tensor& Linear::forward(const Tensor& x) {
  LOOM_CHECK(x.dim(-1) == in_, w_->name + ": input " + shape_str(x.shape()) + " does not end in " +
                                   std::to_string(in_));
  Shape ys = x.shape();
  ys.back() = out_;
  ensure(y_, ys);
  x_ = x;
  const int64_t N = x.numel() / in_;
  kernels::matmul_forward(y_.f32(), x.f32(), w_->value.f32(), b_ ? b_->value.f32() : nullptr, N,
                          in_, out_);
  return y_;
}

void Linear::backward(const Tensor& dy, const Tensor& dx) {
  const int64_t N = x_.numel() / in_;
  float* dw = w_->trainable ? w_->grad.f32() : nullptr;
  float* db = (b_ && b_->trainable) ? b_->grad.f32() : nullptr;
  kernels::matmul_backward(dx.defined() ? dx.f32() : nullptr, dw, db, dy.f32(), x_.f32(),
                           w_->value.f32(), N, in_, out_);
}

}  // namespace loom::nn
