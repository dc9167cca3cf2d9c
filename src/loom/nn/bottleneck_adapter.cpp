#include "loom/nn/bottleneck_adapter.h"

#include "loom/kernels/cpu/activations.h"
#include "loom/kernels/cpu/elementwise.h"
#include "loom/util/error.h"

namespace loom::nn {

BottleneckAdapter::BottleneckAdapter(ParamStore& ps, const std::string& name, int64_t C,
                                     const AdapterSpec& s)
    : spec_(s),
      down_(ps, name + ".down", C, s.bottleneck, /*bias=*/true, s.init_std),
      up_(ps, name + ".up", s.bottleneck, C, /*bias=*/true, 0.0f) {
  LOOM_CHECK(s.bottleneck > 0, name + ": adapter bottleneck size must be positive");
  LOOM_CHECK(s.activation == "gelu" || s.activation == "relu",
             name + ": adapter activation '" + s.activation + "' is not one of gelu, relu");
}

const Tensor& BottleneckAdapter::forward(const Tensor& h) {
  const Tensor& d = down_.forward(h);
  ensure(act_, d.shape());
  if (spec_.activation == "gelu")
    kernels::gelu_forward(act_.f32(), d.f32(), d.numel());
  else
    kernels::relu_forward(act_.f32(), d.f32(), d.numel());
  const Tensor& u = up_.forward(act_);
  ensure(y_, h.shape());
  kernels::add(y_.f32(), h.f32(), u.f32(), h.numel());
  return y_;
}

void BottleneckAdapter::backward(const Tensor& dy, const Tensor& dh, Scratch& scratch) {
  Tensor dact = scratch.zeros("adapter.dact", act_.shape());
  up_.backward(dy, dact);
  Tensor dd = scratch.take("adapter.dd", act_.shape());  // written whole below
  if (spec_.activation == "gelu")
    kernels::gelu_backward(dd.f32(), down_.output().f32(), dact.f32(), dd.numel());
  else
    kernels::relu_backward(dd.f32(), down_.output().f32(), dact.f32(), dd.numel());
  down_.backward(dd, dh);
  kernels::add_inplace(dh.f32(), dy.f32(), dh.numel());  // the identity path
}

}  // namespace loom::nn
