// The interface every architecture implements, and what the trainer, the checkpoint I/O
// and generation see of a model.
//   forward : ids [B, T] (i32), optional pos [B, T] -> logits [B, T, V]
//   backward: targets [B, T] (i32, -100 = ignore) -> fused cross-entropy, then gradients of
//             every trainable parameter accumulate, scaled by grad_scale. Consumes the
//             logits buffer (it becomes dlogits). Returns the SUM of token losses.
// Inference: forward_cached runs ids [1, n] at positions cache.len.. and appends their keys
// and values to the cache (prefill with the prompt, then one token at a time); it returns
// logits [1, n, V]. Its logits equal forward()'s on the whole sequence.
// Parameter names are the Hugging Face names; hf_transposed() says which tensors HF stores
// transposed relative to our [out, in] (GPT-2's Conv1D).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/nn/bottleneck_adapter.h"
#include "loom/nn/dropout.h"
#include "loom/nn/kv_prefix.h"
#include "loom/nn/linear.h"
#include "loom/nn/parameter.h"
#include "loom/tensor/tensor.h"

namespace loom::models {

// Per-layer keys and values of the tokens seen so far (batch 1), [capacity, NKV * HD] each.
struct KVCache {
  std::vector<Tensor> k, v;
  int64_t len = 0;       // tokens cached
  int64_t capacity = 0;  // max tokens (the model's positions)
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual nn::ParamStore& params() = 0;
  // pos: optional position ids [B, T] (i32) for packed rows: positions restart at 0 where a
  // packed sample starts, and attention stays inside each sample. Undefined: 0..T-1.
  virtual const Tensor& forward(const Tensor& ids, const Tensor& pos = Tensor()) = 0;
  virtual double backward(const Tensor& targets, float grad_scale) = 0;
  // A cache for one conversation; with a KV prefix its first P rows hold the prefix.
  virtual KVCache new_cache() = 0;
  virtual const Tensor& forward_cached(const Tensor& ids, KVCache& cache) = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_positions() const = 0;
  virtual std::string arch() const = 0;          // "gpt2"
  virtual nlohmann::json hf_config() const = 0;  // config.json for save_pretrained
  virtual bool hf_transposed(const nn::Parameter& p) const = 0;
  // Names HF may store that we do not hold (e.g. tied lm_head, causal-mask buffers).
  virtual bool hf_ignorable(const std::string& name) const = 0;

  // PEFT attachment points (peft/apply.h). linears(): every Linear of the blocks in
  // parameter order (not the LM head: PEFT leaves it out of all-linear too).
  virtual std::vector<nn::Linear*> linears() = 0;
  // Houlsby adapters after each block's attention and MLP, declared in params(); the
  // caller materializes the store again.
  virtual void add_bottleneck_adapters(const nn::AdapterSpec& spec) = 0;
  // Prefix tuning: P virtual key/value rows for every layer, declared in params() (the
  // caller materializes). Real tokens then take positions P, P+1, ... as in transformers.
  virtual void add_kv_prefix(const nn::PrefixSpec& spec) = 0;
  nn::KVPrefix* kv_prefix() { return prefix_.get(); }
  virtual int64_t kv_heads() const = 0;  // key/value heads per layer
  // State of the dropout in PEFT modules; the trainer sets it before each micro-batch.
  nn::DropoutContext& dropout() { return dropout_; }

 protected:
  // ---- shared by the implementations
  int64_t prefix_length() const { return prefix_ ? prefix_->length() : 0; }
  // Writes the prefix into the first P rows of a fresh cache.
  void prefill_prefix(KVCache& c);

  nn::DropoutContext dropout_;
  std::unique_ptr<nn::KVPrefix> prefix_;
};

}  // namespace loom::models
