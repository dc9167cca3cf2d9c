// Linear layer y = x W^T + b with W [out, in] (nn.Linear's layout; GPT-2's Conv1D
// checkpoints are transposed on load/save in io/). W may be f32 or a frozen quantized
// weight (nn/weight_ops.h); a LoRA branch may be attached (PEFT), adding scale * B A x.
//   forward : x [..., in] -> y [..., out]   (saves x)
//   backward: dy [..., out] -> dx += ...    (dW, db accumulate when trainable)
#pragma once

#include <memory>
#include <string>

#include "loom/nn/lora.h"
#include "loom/nn/parameter.h"

namespace loom::nn {

class Linear {
 public:
  Linear(ParamStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
         float init_std);
  const Tensor& forward(const Tensor& x);
  void backward(const Tensor& dy, const Tensor& dx);  // dx may be undefined (not needed)

  // Adds a LoRA branch (declares lora_A/lora_B in ps; materialize ps again afterwards).
  LoRA& attach_lora(ParamStore& ps, const LoraSpec& spec, const DropoutContext* ctx);
  LoRA* lora() const { return lora_.get(); }

  const std::string& name() const { return name_; }  // module name, e.g. "...self_attn.q_proj"
  Parameter* weight() const { return w_; }
  Parameter* bias() const { return b_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  const Tensor& output() const { return y_; }  // last forward's y

 private:
  std::string name_;
  Parameter* w_;
  Parameter* b_ = nullptr;
  int64_t in_, out_;
  std::unique_ptr<LoRA> lora_;
  Tensor x_, y_;
};

}  // namespace loom::nn
