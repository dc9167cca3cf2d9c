// LayerNorm over the last dimension with affine weight and bias.
//   forward : x [..., C] -> y [..., C]   (saves x, mean, rstd)
//   backward: dy -> dx += ...
#pragma once

#include <string>
#include <vector>

#include "loom/nn/norm.h"
#include "loom/nn/parameter.h"

namespace loom::nn {

class LayerNorm final : public Norm {
 public:
  LayerNorm(ParamStore& ps, const std::string& name, int64_t C, float eps);
  const Tensor& forward(const Tensor& x) override;
  void backward(const Tensor& dy, const Tensor& dx) override;
  const Tensor& output() const override { return y_; }
  std::vector<Parameter*> params() const override { return {w_, b_}; }
  void release_activations() override { x_ = y_ = mean_ = rstd_ = Tensor(); }

 private:
  Parameter *w_, *b_;
  int64_t C_;
  float eps_;
  Tensor x_, y_, mean_, rstd_;
};

}  // namespace loom::nn
