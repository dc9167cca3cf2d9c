// One transformer layer as a decoder runs it, whatever its wiring (nn/prenorm_block.h is the
// one GPT-2 and the Llama family share).
//   forward       : x [B, T, C] -> out [B, T, C]  (owned by the block; saves what backward needs)
//   backward      : dout [B, T, C] -> dx += ...   (dx zeroed by the caller)
//   Under sequence parallel (nn/tensor_parallel.h) x, out, dout and dx are this rank's rows
//   [N/tp, C] of the [N = B*T, C] tokens; Positions says what B and T are.
//   forward_cached: inference, batch 1: x [1, n, C] at positions past.., appending the layer's
//                   keys and values to kc/vc [capacity, kv width] at rows past..past+n-1
// Activation checkpointing (models/causal_lm.h) releases what a forward saved:
//   release_activations: every tensor the block and its modules hold from the last forward
//                   (norms' inputs and outputs, linears' saved inputs and outputs, q/k/v,
//                   lse, ctx, MLP intermediates, LoRA's and adapters' saved tensors, the
//                   output), so their storage is freed unless someone else holds it (the
//                   input x belongs to the caller, who keeps it to recompute from). The next
//                   forward allocates them again; backward needs such a forward first.
// (Selective recompute needs no release: attention never keeps its probabilities,
// kernels/cpu/attention.h.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/nn/bottleneck_adapter.h"
#include "loom/nn/buffers.h"
#include "loom/nn/kv_prefix.h"
#include "loom/nn/linear.h"

namespace loom::nn {

class MoE;

// Where the tokens of a forward sit, as attention needs it. packed: position ids [B*T] of
// packed rows (attention stays inside each sample), or null (plain causal rows). rope_cos /
// rope_sin [B*T, D/2]: rotary tables at the tokens' absolute positions (a KV prefix's length
// included); undefined for models without rotary embeddings. batch, seq: B and T, the shape
// a sequence-parallel block gathers its rows into.
struct Positions {
  const int32_t* packed = nullptr;
  Tensor rope_cos, rope_sin;
  int64_t batch = 0, seq = 0;
};

class DecoderBlock {
 public:
  virtual ~DecoderBlock() = default;
  virtual const Tensor& forward(const Tensor& x, const Positions& p) = 0;
  virtual void backward(const Tensor& dout, const Tensor& dx, Scratch& scratch) = 0;
  virtual const Tensor& forward_cached(const Tensor& x, const Positions& p, const Tensor& kc,
                                       const Tensor& vc, int64_t past) = 0;
  // PEFT attachment points: the block's Linears in parameter order; Houlsby adapters after
  // attention and MLP (declared in ps, named name + ".attn_adapter" / ".mlp_adapter"); the
  // prefix keys and values attention also attends to.
  virtual void linears(std::vector<Linear*>& out) = 0;
  virtual void add_adapters(ParamStore& ps, const std::string& name, int64_t C,
                            const AdapterSpec& spec) = 0;
  virtual void attach_prefix(KVPrefix* prefix, int64_t layer) = 0;
  virtual void release_activations() = 0;
  // The block's mixture-of-experts MLP (nn/moe.h), if that is what it has.
  virtual MoE* moe() { return nullptr; }
};

}  // namespace loom::nn
