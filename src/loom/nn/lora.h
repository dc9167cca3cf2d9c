// LoRA (Hu et al. 2021) on one Linear, as PEFT defines it:
//   y = x W^T + b + scale * B(A(dropout(x)))
//   A [r, in]  Kaiming-uniform (bound 1/sqrt(in), PEFT's kaiming_uniform_(a=sqrt(5)))
//   B [out, r] zero, so training starts from the base model exactly
//   scale = lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA
// Parameter names are the Linear's plus ".lora_A.weight" / ".lora_B.weight" (PEFT's names
// without the adapter name), so `base_model.model.` + name is PEFT's saved key.
//   forward_add: x [N, in], y [N, out] += ...  (saves x and u = A xd [N, r]; the dropout
//                mask is recomputed in backward, not stored)
//   backward   : dy [N, out] -> dA, dB accumulate; dx [N, in] += (dropout') scale (dy B) A
#pragma once

#include <string>

#include "loom/nn/dropout.h"
#include "loom/nn/parameter.h"

namespace loom::nn {

struct LoraSpec {
  int64_t r = 8;
  float alpha = 8.0f;
  bool rslora = false;
  float dropout = 0.0f;
  float scale() const;
};

class LoRA {
 public:
  LoRA(ParamStore& ps, const std::string& linear_name, int64_t in, int64_t out,
       const LoraSpec& spec, const DropoutContext* ctx);
  void forward_add(const Tensor& x, const Tensor& y);
  void backward(const Tensor& dy, const Tensor& dx);  // dx may be undefined
  // W [out, in] += scale * B @ A: the merged weight (export, or inference without the branch).
  void merge_into(float* W) const;

  Parameter* A() const { return a_; }
  Parameter* B() const { return b_; }
  const LoraSpec& spec() const { return spec_; }

 private:
  Parameter *a_, *b_;
  LoraSpec spec_;
  int64_t in_, out_;
  const DropoutContext* ctx_;
  uint64_t stream_;
  const float* dropped_input() const;  // dropout(x_) in a shared workspace

  bool dropped_ = false;  // the last forward applied dropout
  Tensor x_, u_;
};

}  // namespace loom::nn
