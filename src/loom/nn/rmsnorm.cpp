#include "loom/nn/rmsnorm.h"

#include "loom/kernels/cpu/rmsnorm.h"
#include "loom/nn/buffers.h"
#include "loom/util/error.h"

namespace loom::nn {

RMSNorm::RMSNorm(ParamStore& ps, const std::string& name, int64_t C, float eps) : C_(C), eps_(eps) {
  w_ = ps.add(name + ".weight", {C}, ParamKind::Norm, 0.0f, 1.0f);
}

const Tensor& RMSNorm::forward(const Tensor& x) {
  LOOM_CHECK(x.dim(-1) == C_, w_->name + ": input " + shape_str(x.shape()));
  const int64_t N = x.numel() / C_;
  ensure(y_, x.shape());
  ensure(rstd_, {N});
  x_ = x;
  kernels::rmsnorm_forward(y_.f32(), rstd_.f32(), x.f32(), w_->value.f32(), N, C_, eps_);
  return y_;
}

void RMSNorm::backward(const Tensor& dy, const Tensor& dx) {
  kernels::rmsnorm_backward(dx.f32(), w_->trainable ? w_->grad.f32() : nullptr, dy.f32(), x_.f32(),
                            w_->value.f32(), rstd_.f32(), x_.numel() / C_, C_);
}

}  // namespace loom::nn
