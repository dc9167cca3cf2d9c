// The LM head and its loss as one module: logits = h W^T with W [V, C] (the model's own
// lm_head.weight, or the token embedding's table when tied), then softmax cross-entropy
// fused into backward (kernels/cpu/cross_entropy.h).
//   forward : h [B, T, C] -> logits [B, T, V]   (owned; saves h)
//   backward: targets [B, T] (i32, -100 = ignore), grad_scale -> the SUM of token losses;
//             the logits buffer becomes dlogits, dh += dlogits W, dW += dlogits^T h when W
//             trains. grad_scale is 1 / (target tokens of the whole step).
#pragma once

#include "loom/nn/parameter.h"

namespace loom::nn {

class LMHead {
 public:
  explicit LMHead(Parameter* weight) : w_(weight) {}
  const Tensor& forward(const Tensor& h);
  double backward(const Tensor& targets, float grad_scale, const Tensor& dh);
  Parameter* weight() const { return w_; }
  const Tensor& logits() const { return logits_; }

 private:
  Parameter* w_;
  Tensor h_, logits_;
};

}  // namespace loom::nn
