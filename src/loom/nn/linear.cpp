#include "loom/nn/linear.h"

#include "loom/nn/buffers.h"
#include "loom/nn/weight_ops.h"
#include "loom/util/error.h"

namespace loom::nn {

Linear::Linear(ParamStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
               float init_std)
    : name_(name), in_(in), out_(out) {
  w_ = ps.add(name + ".weight", {out, in}, ParamKind::Weight, init_std);
  if (bias) b_ = ps.add(name + ".bias", {out}, ParamKind::Bias, 0.0f, 0.0f);
}

LoRA& Linear::attach_lora(ParamStore& ps, const LoraSpec& spec, const DropoutContext* ctx) {
  LOOM_CHECK(!lora_, name_ + ": LoRA attached twice");
  lora_ = std::make_unique<LoRA>(ps, name_, in_, out_, spec, ctx);
  return *lora_;
}

const Tensor& Linear::forward(const Tensor& x) {
  LOOM_CHECK(x.dim(-1) == in_, w_->name + ": input " + shape_str(x.shape()) + " does not end in " +
                                   std::to_string(in_));
  Shape ys = x.shape();
  ys.back() = out_;
  ensure(y_, ys);
  x_ = x;
  weight_forward(y_.f32(), x.f32(), *w_, b_, x.numel() / in_);
  if (lora_) lora_->forward_add(x, y_);
  return y_;
}

void Linear::backward(const Tensor& dy, const Tensor& dx) {
  weight_backward(dx.defined() ? dx.f32() : nullptr, dy.f32(), x_.f32(), *w_, b_, x_.numel() / in_);
  if (lora_) lora_->backward(dy, dx);
}

}  // namespace loom::nn
