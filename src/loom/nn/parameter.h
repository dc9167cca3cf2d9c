// Parameters: logical name (Hugging Face's), shape, shard spec, value and gradient.
// Contract: modules declare parameters in their constructors; ParamStore::materialize()
// then lays all values out in one flat f32 buffer and all trainable gradients in another
// (the flat buffers are what optimizers, ZeRO partitioning and grad all-reduce work on).
// Trainable values come first, at the offsets of their gradients: values[0, trainable_numel)
// and grads line up element for element.
// PEFT adds parameters and changes `trainable` after loading, then materializes again:
// values are kept, views move to the new buffers. A frozen weight may instead be held in
// ggml blocks (`quant`, QLoRA-style); it then has no f32 value and no slot in the buffer.
// Parameter pointers stay valid for the store's lifetime; modules read p->value at use.
// Mixed precision (bf16/fp16) gives a weight a 16-bit copy (`half`) that its products use
// (nn/weight_ops.h); the f32 value stays the working copy everything else reads. A frozen
// weight may be held in those 16 bits only (a bf16 base under LoRA, bf16 inference): then,
// as a quantized one, it has no f32 value and no slot in the buffer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/kernels/cpu/bf16.h"
#include "loom/tensor/ggml_quant.h"
#include "loom/tensor/tensor.h"

namespace loom::nn {

// Which slice of the full (logical) tensor this rank holds, along one dimension `dim`
// (dim == -1: the whole tensor). The dimension is `parts` equal blocks that are split alike
// (GPT-2's fused c_attn rows are q, k and v: each rank holds its heads of all three); of
// every block the rank holds rows [offset, offset + size). The local extent of `dim` is
// parts * size. Several ranks may hold the same slice (key/value heads replicated when
// the tensor-parallel size exceeds their number). Every layout saves, loads and initialises
// in full-tensor coordinates, so a layout does not change what a model is.
struct ShardSpec {
  int dim = -1;
  int parts = 1;
  int64_t offset = 0;
  int64_t size = 0;
  int replica = 0;  // which of the ranks holding this same slice this one is (0: the first)
  bool sharded() const { return dim >= 0; }
};

// What a parameter is, for rules that depend on it (weight decay exclusions). Router: a
// mixture-of-experts router's [experts, C] matrix, decayed as a weight but kept and
// multiplied in fp32 under mixed precision (transformers keeps routers in fp32: top-k
// choices must not flip with bf16 rounding). Buffer: state a rule other than the optimizer
// updates (DeepSeek-V3's e_score_correction_bias), never trained, saved with the model.
enum class ParamKind : uint8_t { Weight, Bias, Norm, Embedding, Router, Buffer };

// The 16-bit copy of a weight's f32 value that its products read under mixed precision:
// made on first use after whoever changes the value (the optimizer step, a ZeRO-3 gather)
// marks it stale, dropped with the value when the value is released. Shared by a pipeline
// stage's activation contexts, as the value is.
struct HalfCopy {
  kernels::Half format = kernels::Half::bf16;
  Tensor data;  // p.shape, BF16 or F16; undefined until first use
  bool stale = true;
  bool only = false;  // the weight itself (frozen, its f32 value dropped): never stale
  // Written by the ZeRO engine (stages 1-3: a trained weight whose fp32 master is sharded,
  // gathered in 16 bits): never converted from an f32 value here.
  bool gathered = false;
  // Rounded from the parameter's own f32 value (lazily when stale, or by the optimizer).
  bool from_value() const { return !only && !gathered; }
};

struct Parameter {
  std::string name;  // logical name, e.g. "transformer.h.3.attn.c_attn.weight"
  Shape shape;       // local shape (== full_shape when unsharded)
  Shape full_shape;
  ShardSpec shard;
  bool trainable = true;
  bool adapter = false;  // declared by a PEFT method, not part of the base model
  // The last pipeline stage's copy of a tied embedding (the head's weight): the first stage
  // holds the copy that counts (gradient norms, checkpoints); both are updated alike.
  bool stage_copy = false;
  // A routed expert's weight (nn/moe.h) or its adapter: under expert parallelism only the
  // ranks of its expert slice hold it, so its gradient is reduced over the dp ranks with
  // the same expert slice (ZeroEngine's expert units), not over all of dp.
  bool expert = false;
  ParamKind kind = ParamKind::Weight;
  float init_std = 0.0f;  // normal(0, init_std); 0 with init_value: constant fill
  float init_value = 0.0f;
  float init_bound = 0.0f;  // > 0: uniform(-init_bound, init_bound) instead
  size_t offset = 0;        // element offset in the flat value buffer
  size_t grad_offset = 0;   // element offset in the flat grad buffer (trainable only)
  Tensor value;             // undefined when quant is set
  Tensor grad;              // undefined when frozen
  std::shared_ptr<const QuantMatrix> quant;  // frozen weight kept in ggml blocks, [out, in]
  std::shared_ptr<HalfCopy> half;            // mixed precision: the products' 16-bit weight

  bool quantized() const { return quant != nullptr; }
  bool held_in_half() const { return half && half->only; }
  // Whether the weight has an f32 value (a slot in the store's buffer) at all.
  bool has_f32() const { return !quantized() && !held_in_half(); }
};

// Whether this rank's copy of p is the one that counts when every rank's copies are
// summed (gradient norms, optimizer-state checkpoints): a slice held by several ranks counts
// on its first replica; an unsharded parameter, held by every rank of the tensor-parallel
// group, on tp rank 0.
inline bool primary_copy(const Parameter& p, int tp_rank) {
  return p.shard.sharded() ? p.shard.replica == 0 : tp_rank == 0;
}

// Element `local` (flat index into p.shape) of p's shard: its flat index in the full tensor.
int64_t full_index(const Parameter& p, int64_t local);
// Copies p's slice out of a full tensor [full_shape] into local [shape], or back.
void shard_from_full(const Parameter& p, const float* full, float* local);
void shard_to_full(const Parameter& p, const float* local, float* full);
// Splits p's local elements [begin, end) into runs that are contiguous in the full tensor
// too: fn(local_first, full_first, n) for each, in order.
void for_full_runs(const Parameter& p, int64_t begin, int64_t end,
                   const std::function<void(int64_t, int64_t, int64_t)>& fn);

class ParamStore {
 public:
  // Declares a parameter of full shape `shape`, of which this rank holds `shard` (the
  // whole tensor by default); init is normal(0, init_std) when init_std > 0, else
  // init_value.
  Parameter* add(const std::string& name, const Shape& shape, ParamKind kind, float init_std,
                 float init_value = 0.0f, const ShardSpec& shard = {});
  // Allocates the flat buffers and makes every value/grad a view into them. Called again
  // after parameters were added, frozen or quantized, it lays the buffers out anew and
  // copies every f32 value across (new parameters start at zero: call init_new()).
  // `group` orders the trainable parameters: by group, then in declaration order (a
  // model's units, so that each unit's trainable parameters are one contiguous range);
  // expert parameters (Parameter::expert) come after all the others, by group too, so a
  // unit's dense and expert parts are each one contiguous range.
  void materialize(const std::function<int(const Parameter&)>& group = {});
  // ZeRO: the engine holds sharded copies instead. Drops the f32 values of trainable
  // parameters (frozen ones are kept) / the gradient buffer; the views become undefined
  // until the engine points them at its own buffers.
  void drop_trainable_values();
  void drop_grads();
  // Initialises only the parameters added since the previous materialize().
  void init_new(uint64_t seed);
  // Fills every value from its init rule, keyed by (seed, name, element of the full
  // tensor) so the result does not depend on layout or order.
  void init(uint64_t seed);
  void zero_grads();
  // An activation context of a pipeline stage (parallel/pipeline_engine.h) is a second copy
  // of the stage's modules over the same parameters: every parameter here, declared alike,
  // takes `owner`'s value, gradient and quantized blocks (views of the same storage), and
  // this store's own buffers are freed. Call after `owner` is laid out for training.
  void share_from(const ParamStore& owner);

  bool materialized() const { return values_.defined(); }
  const std::vector<std::unique_ptr<Parameter>>& all() const { return params_; }
  Parameter* find(const std::string& name) const;  // nullptr if absent
  Tensor flat_values() const { return values_; }
  Tensor flat_grads() const { return grads_; }
  int64_t numel() const;  // logical elements, quantized ones included
  int64_t trainable_numel() const;
  int64_t value_bytes() const;  // f32 values plus quantized blocks and 16-bit weights

 private:
  void init_one(Parameter& p, uint64_t seed);

  std::vector<std::unique_ptr<Parameter>> params_;
  size_t n_materialized_ = 0;  // params_[0, n) had values before the last materialize()
  size_t n_fresh_ = 0;         // first parameter added since the previous materialize()
  Tensor values_, grads_;
};

}  // namespace loom::nn
