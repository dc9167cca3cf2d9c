// GPT-2 causal self-attention: one fused projection to q,k,v (c_attn [3C, C]), causal
// softmax attention over NH heads, output projection (c_proj [C, C]).
//   forward : x [B, T, C] -> y [B, T, C]   (saves qkv [B,T,3C], att [B,NH,T,T], ctx [B,T,C])
//             (Positions: only the packed-row ids; GPT-2's positions are learned embeddings)
//   backward: dy -> dx += ...              (scratch: dctx [B,T,C], dqkv [B,T,3C]; att when
//             released: recomputed from the saved qkv)
// Tensor parallel (Megatron): c_attn is column-parallel with q, k and v each split, so a
// rank holds NH/tp whole heads and C above reads C/tp; c_proj is row-parallel. x must be
// replicated; dx is then a partial sum over the ranks (the block applies f's backward).
// Under sequence parallel x is the block's gathered rows and c_proj reduce-scatters: y and
// dy are this rank's rows [B*T/tp, C] (nn/linear.h).
#pragma once

#include <string>
#include <vector>

#include "loom/nn/decoder_block.h"

namespace loom::nn {

class FusedQKVAttention {
 public:
  FusedQKVAttention(ParamStore& ps, const std::string& name, int64_t C, int64_t n_head,
                    float init_std, float proj_init_std, const TensorParallel& tp = {});
  const Tensor& forward(const Tensor& x, const Positions& p);
  void backward(const Tensor& dy, const Tensor& dx, Scratch& scratch);
  // Inference, batch 1: x [1, n, C] at positions past..; appends k, v to kc/vc [capacity, C].
  const Tensor& forward_cached(const Tensor& x, const Positions& p, const Tensor& kc,
                               const Tensor& vc, int64_t past);
  std::vector<Linear*> linears() { return {&c_attn_, &c_proj_}; }
  // Activation checkpointing (nn/decoder_block.h): every saved tensor.
  void release_activations();
  // Prefix tuning: attend to `prefix`'s keys and values for `layer` as well.
  void attach_prefix(KVPrefix* prefix, int64_t layer) {
    prefix_ = prefix;
    layer_ = layer;
  }

 private:
  ColumnParallelLinear c_attn_;
  RowParallelLinear c_proj_;
  KVPrefix* prefix_ = nullptr;
  int64_t layer_ = 0;
  int64_t C_, NH_;                // this rank's width and heads
  Tensor lse_, ctx_;              // lse_ [B, NH, T] (kernels/cpu/attention.h)
  const int32_t* pos_ = nullptr;  // the forward's position ids (owned by the model)
};

}  // namespace loom::nn
