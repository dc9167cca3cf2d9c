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

namespace loom::nn {
class MoE;
}

namespace loom::models {

// A mixture-of-experts layer this rank holds: its decoder layer and the module (nn/moe.h).
struct MoeLayer {
  int64_t layer;
  nn::MoE* moe;
};

// Per-layer keys and values of the tokens seen so far (batch 1), [capacity, NKV * HD] each.
struct KVCache {
  std::vector<Tensor> k, v;
  int64_t len = 0;       // tokens cached
  int64_t capacity = 0;  // max tokens (the model's positions)
};

// A pipeline rank's share of the model (parallel/pipeline.h cuts them): one or more chunks,
// each a run of consecutive layers [first, last), in model order (the interleaved schedule
// gives a rank several). The rank holding layer 0 also holds the embeddings, the one holding
// the last layer the final norm and the head (a tied head: its own copy of the token
// table). No chunks: the whole model.
// Under expert parallelism the rank also holds only its slice of each MoE layer's routed
// experts: experts [ep_rank E / ep_size, (ep_rank + 1) E / ep_size) (nn/moe.h).
struct StageRange {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  int ep_size = 1, ep_rank = 0;
};

// Activation checkpointing (Megatron's recompute_granularity / recompute_method /
// recompute_num_layers): what a training forward keeps for backward.
//   full:      the blocks of each model chunk (a pipeline stage's run of layers, or the
//              whole model) are cut into groups that keep only their input; everything else
//              they save is released after their forward and rebuilt in their backward by
//              running the group's forward again from that input. method uniform: every
//              num_layers consecutive blocks are a group; block: each of the first
//              num_layers blocks is a group of its own, and the rest keep everything.
//   selective: Megatron's recompute of the attention core. Attention here never keeps its
//              [B, H, T, P+T] probabilities (only a [B, H, T] log-sum-exp; backward
//              recomputes them, kernels/cpu/attention.h), so this is what none already does.
// The recompute repeats the forward exactly (dropout masks are keyed by position, nn/
// dropout.h; a tensor-parallel group repeats its collectives in the same order), so the
// gradients are the same bits as without. Evaluation forwards release the same way (no
// backward follows, so nothing is recomputed); generation (forward_cached) does not.
// loss_chunk_rows > 0 (training's default, TrainConfig): forward stops at the head's input
// and returns no logits; the loss (backward, loss_sums) runs the head that many token rows
// at a time (nn/lm_head.h), so the logits are never all live.
struct ActivationCheckpointing {
  enum class Granularity { none, full, selective };
  Granularity granularity = Granularity::none;
  bool block_method = false;    // method "block" (else "uniform"); full only
  int64_t num_layers = 1;       // full only
  int64_t loss_chunk_rows = 0;  // 0: forward computes and keeps the whole logits
};

// What a model's constructor does with its parameters: lays out their buffers (values zero
// until init or load), or only declares them (names, shapes, shards, nothing allocated):
// enough to plan memory and work for a model of any size (loom plan), not to run it.
enum class ParamBuffers { Allocate, DeclareOnly };

// Engines that shard parameters (ZeRO-3) or overlap gradient communication with backward
// (data parallel, ZeRO-2) follow the model through its units: groups of parameters it
// visits in order. Unit 0: the embeddings; 1..L: the blocks; L+1: the final norm and the
// LM head; L+2: the KV prefix, when there is one. forward acquires 0, 1, .., L+1 (and 0
// again for a tied head); backward acquires them in reverse and reports each unit's
// gradients complete as soon as they are. No hooks (the default): nothing happens.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void acquire(int unit) = 0;      // its parameter values are about to be read
  virtual void release(int unit) = 0;      // ... and no longer are
  virtual void grads_ready(int unit) = 0;  // its gradients for this backward are complete
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual nn::ParamStore& params() = 0;
  // pos: optional position ids [B, T] (i32) for packed rows: positions restart at 0 where a
  // packed sample starts, and attention stays inside each sample. Undefined: 0..T-1.
  virtual const Tensor& forward(const Tensor& ids, const Tensor& pos = Tensor()) = 0;
  virtual double backward(const Tensor& targets, float grad_scale) = 0;
  // A pipeline stage's share of forward and backward (forward/backward above are both on a
  // model that is one stage). forward_stage: the first stage reads ids; a later one takes
  // x_in, the previous stage's output [B, T, C] (this rank's rows [B*T/tp, C] under sequence
  // parallel). Returns the logits on the last stage, else this stage's output (same shape
  // as x_in), which stays valid until the next forward. Every stage needs ids (their shape)
  // and pos. backward_stage: the last stage takes targets and returns the loss SUM; an
  // earlier one takes dout, the gradient at its output, and returns 0. input_grad() is then
  // the gradient at x_in (not on the first stage), valid until the next backward.
  // `chunk`: which of the rank's model chunks (StageRange) runs; the first stage is the
  // model's first chunk, the last stage its last chunk.
  virtual const Tensor& forward_stage(const Tensor& ids, const Tensor& pos, const Tensor& x_in,
                                      int chunk) = 0;
  virtual double backward_stage(const Tensor& targets, float grad_scale, const Tensor& dout,
                                int chunk) = 0;
  virtual const Tensor& input_grad(int chunk) const = 0;
  // True for a tensor name (HF's, or under it, e.g. a LoRA weight's) that another pipeline
  // stage holds: a stage model loads only its own and leaves the rest to the others.
  virtual bool in_other_stage(const std::string& name) const = 0;
  // Whether another rank holds the tensor: another pipeline stage, or (a routed expert's,
  // StageRange::ep_size) another expert-parallel rank.
  virtual bool held_elsewhere(const std::string& name) const { return in_other_stage(name); }
  // A tied head's token table when this stage holds it (first or last stage), else null.
  virtual nn::Parameter* tied_embedding() const = 0;
  // The shape of what crosses between stages for a [B, T] micro-batch.
  virtual Shape stage_io_shape(int64_t B, int64_t T) const = 0;
  virtual bool first_stage() const = 0;  // holds the model's first chunk
  virtual bool last_stage() const = 0;   // holds the model's last chunk
  // Evaluation, after forward: per_row[b] = the sum of row b's token losses against
  // targets [B, T] (ignored targets add 0); the logits stay. Collective like forward.
  virtual void loss_sums(const Tensor& targets, double* per_row) = 0;
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
  // Estimated bytes of the activations one forward + backward of a [B, T] micro-batch keeps
  // (saved tensors of every layer, logits, and the largest layer's backward scratch), under
  // the activation checkpointing set.
  virtual int64_t activation_bytes(int64_t B, int64_t T) const = 0;
  // State of the dropout in PEFT modules; the trainer sets it before each micro-batch.
  nn::DropoutContext& dropout() { return dropout_; }
  // Activation checkpointing for the forwards that follow (and activation_bytes' estimate);
  // num_layers may not exceed the model's layers (an error naming the config key).
  void set_activation_checkpointing(const ActivationCheckpointing& a);
  const ActivationCheckpointing& activation_checkpointing() const { return checkpointing_; }

  // The units (see UnitHooks): unit_of(parameter name), and every unit's parameters.
  virtual int num_layers() const = 0;
  int num_units() const { return num_layers() + 2 + (prefix_ ? 1 : 0); }
  virtual int unit_of(const std::string& param_name) const = 0;
  std::vector<std::vector<nn::Parameter*>> units();
  void set_unit_hooks(UnitHooks* h) { hooks_ = h; }
  // This rank's mixture-of-experts layers in layer order (none for dense models).
  virtual std::vector<MoeLayer> moe_layers() const { return {}; }

 protected:
  // ---- shared by the implementations
  int64_t prefix_length() const { return prefix_ ? prefix_->length() : 0; }
  // Block l's unit (l + 1) for a name starting with block_prefix + "l.", else -1.
  static int block_unit(const std::string& name, const std::string& block_prefix);
  // Holds a unit's parameters for a scope (no-op without hooks).
  struct UnitScope {
    UnitHooks* h;
    int unit;
    UnitScope(UnitHooks* hooks, int u) : h(hooks), unit(u) {
      if (h) h->acquire(unit);
    }
    ~UnitScope() {
      if (h) h->release(unit);
    }
    UnitScope(const UnitScope&) = delete;
    UnitScope& operator=(const UnitScope&) = delete;
  };
  void grads_ready(int unit) {
    if (hooks_) hooks_->grads_ready(unit);
  }
  int head_unit() const { return num_layers() + 1; }
  int prefix_unit() const { return num_layers() + 2; }

  // Writes the prefix into the first P rows of a fresh cache.
  void prefill_prefix(KVCache& c);

  nn::DropoutContext dropout_;
  ActivationCheckpointing checkpointing_;
  std::unique_ptr<nn::KVPrefix> prefix_;
  UnitHooks* hooks_ = nullptr;
};

}  // namespace loom::models
