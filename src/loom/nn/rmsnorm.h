// RMSNorm with a learned scale (Llama, Qwen2, SmolLM2).
//   forward : x [..., C] -> y [..., C]   (saves x, rstd)
//   backward: dy -> dx += ...
#pragma once

#include <string>
#include <vector>

#include "loom/nn/norm.h"
#include "loom/nn/parameter.h"

namespace loom::nn {

class RMSNorm final : public Norm {
 public:
  RMSNorm(ParamStore& ps, const std::string& name, int64_t C, float eps);
  const Tensor& forward(const Tensor& x) override;
  void backward(const Tensor& dy, const Tensor& dx) override;
  const Tensor& output() const override { return y_; }
  std::vector<Parameter*> params() const override { return {w_}; }
  void release_activations() override { x_ = y_ = rstd_ = Tensor(); }
  Parameter* weight() const { return w_; }

 private:
  Parameter* w_;
  int64_t C_;
  float eps_;
  Tensor x_, y_, rstd_;
};

}  // namespace loom::nn
