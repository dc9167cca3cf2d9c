#include "loom/nn/gelu_mlp.h"

#include "loom/kernels/cpu/activations.h"

namespace loom::nn {

GeluMLP::GeluMLP(ParamStore& ps, const std::string& name, int64_t C, int64_t hidden, float init_std,
                 float proj_init_std, const TensorParallel& tp)
    : c_fc_(ps, name + ".c_fc", C, hidden, true, init_std, tp),
      c_proj_(ps, name + ".c_proj", hidden, C, true, proj_init_std, tp) {}

const Tensor& GeluMLP::forward(const Tensor& x) {
  const Tensor& h = c_fc_.forward(x);
  ensure(g_, h.shape());
  kernels::gelu_forward(g_.f32(), h.f32(), h.numel());
  return c_proj_.forward(g_);
}

void GeluMLP::backward(const Tensor& dy, const Tensor& dx, Scratch& scratch) {
  Tensor dg = scratch.zeros("mlp.dg", g_.shape());
  c_proj_.backward(dy, dg);
  Tensor dh = scratch.take("mlp.dh", g_.shape());  // written whole by gelu_backward
  kernels::gelu_backward(dh.f32(), c_fc_.output().f32(), dg.f32(), dh.numel());
  c_fc_.backward(dh, dx);
}

}  // namespace loom::nn
