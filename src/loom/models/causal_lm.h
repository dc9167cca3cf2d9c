// The interface every architecture implements, and what the trainer, the checkpoint I/O
// and generation see of a model.
//   forward : ids [B, T] (i32) -> logits [B, T, V]
//   backward: targets [B, T] (i32, -100 = ignore) -> fused cross-entropy, then gradients of
//             every trainable parameter accumulate, scaled by grad_scale. Consumes the
//             logits buffer (it becomes dlogits). Returns the SUM of token losses.
// Parameter names are the Hugging Face names; hf_transposed() says which tensors HF stores
// transposed relative to our [out, in] (GPT-2's Conv1D).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "loom/nn/parameter.h"
#include "loom/tensor/tensor.h"

namespace loom::models {

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual nn::ParamStore& params() = 0;
  virtual const Tensor& forward(const Tensor& ids) = 0;
  virtual double backward(const Tensor& targets, float grad_scale) = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_positions() const = 0;
  virtual std::string arch() const = 0;          // "gpt2"
  virtual nlohmann::json hf_config() const = 0;  // config.json for save_pretrained
  virtual bool hf_transposed(const nn::Parameter& p) const = 0;
  // Names HF may store that we do not hold (e.g. tied lm_head, causal-mask buffers).
  virtual bool hf_ignorable(const std::string& name) const = 0;
};

}  // namespace loom::models
