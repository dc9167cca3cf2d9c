#include "loom/nn/swiglu_mlp.h"

#include "loom/kernels/cpu/activations.h"

namespace loom::nn {

SwiGluMLP::SwiGluMLP(ParamStore& ps, const std::string& name, int64_t C, int64_t inter,
                     float init_std, const TensorParallel& tp)
    : gate_(ps, name + ".gate_proj", C, inter, false, init_std, tp),
      up_(ps, name + ".up_proj", C, inter, false, init_std, tp),
      down_(ps, name + ".down_proj", inter, C, false, init_std, tp) {}

const Tensor& SwiGluMLP::forward(const Tensor& x) {
  const Tensor& g = gate_.forward(x);
  const Tensor& u = up_.forward(x);
  ensure(h_, g.shape());
  kernels::swiglu_forward(h_.f32(), g.f32(), u.f32(), g.numel());
  return down_.forward(h_);
}

void SwiGluMLP::backward(const Tensor& dy, const Tensor& dx, Scratch& scratch) {
  Tensor dh = scratch.zeros("swiglu.dh", h_.shape());
  down_.backward(dy, dh);
  Tensor dg = scratch.take("swiglu.dg", h_.shape());  // written whole by swiglu_backward
  Tensor du = scratch.take("swiglu.du", h_.shape());
  kernels::swiglu_backward(dg.f32(), du.f32(), dh.f32(), gate_.output().f32(), up_.output().f32(),
                           h_.numel());
  gate_.backward(dg, dx);
  up_.backward(du, dx);
}

}  // namespace loom::nn
