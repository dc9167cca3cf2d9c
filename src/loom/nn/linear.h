// Linear layer y = x W^T + b with W [out, in] (nn.Linear's layout; GPT-2's Conv1D
// checkpoints are transposed on load/save in io/).
//   forward : x [..., in] -> y [..., out]   (saves x)
//   backward: dy [..., out] -> dx += ...    (dW, db accumulate when trainable)
#pragma once

#include <string>

#include "loom/nn/parameter.h"

namespace loom::nn {

class Linear {
 public:
  Linear(ParamStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
         float init_std);
  const Tensor& forward(const Tensor& x);
  void backward(const Tensor& dy, const Tensor& dx);  // dx may be undefined (not needed)

  Parameter* weight() const { return w_; }
  Parameter* bias() const { return b_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  const Tensor& output() const { return y_; }  // last forward's y

 private:
  Parameter* w_;
  Parameter* b_ = nullptr;
  int64_t in_, out_;
  Tensor x_, y_;
};

}  // namespace loom::nn
