// Llama-family self-attention: separate q/k/v projections (optional bias, as Qwen2),
// grouped K/V heads (NKV divides NH), rotary embedding on q and k, causal softmax,
// output projection o_proj. Names follow transformers: <name>.q_proj, k_proj, v_proj, o_proj.
//   forward : x [B, T, C], Positions (rope cos/sin [B*T, D/2], packed ids) -> y [B, T, C]
//             (saves rotated q [B,T,NH*D], k, v [B,T,NKV*D], att [B,NH,T,T], ctx)
//   backward: dy -> dx += ...   (scratch: dctx, dq, dk, dv; att when released: recomputed
//             from the saved rotated q and k)
// Tensor parallel (Megatron): q, k, v column-parallel, o row-parallel; a rank holds NH/tp
// query heads and NKV/tp key/value heads, or, when tp exceeds NKV (tp a multiple of it), the
// one KV head its query heads use, replicated over tp/NKV ranks (their gradients summed).
// x must be replicated; dx is then a partial sum (the block applies f's backward).
// Under sequence parallel x is the block's gathered rows and o_proj reduce-scatters: y and
// dy are this rank's rows [B*T/tp, C] (nn/linear.h).
#pragma once

#include <string>
#include <vector>

#include "loom/nn/decoder_block.h"

namespace loom::nn {

struct GqaDims {
  int64_t hidden, n_head, n_kv_head, head_dim;
  bool qkv_bias = false, o_bias = false;
};

class GqaAttention {
 public:
  GqaAttention(ParamStore& ps, const std::string& name, const GqaDims& d, float init_std,
               const TensorParallel& tp = {});
  const Tensor& forward(const Tensor& x, const Positions& p);
  void backward(const Tensor& dy, const Tensor& dx, Scratch& scratch);
  // Inference, batch 1: x [1, n, C] at positions past.., rope tables [n, D/2]; appends the
  // rotated keys and the values to kc/vc [capacity, NKV*D] at rows past..past+n-1.
  const Tensor& forward_cached(const Tensor& x, const Positions& p, const Tensor& kc,
                               const Tensor& vc, int64_t past);
  std::vector<Linear*> linears() { return {&q_, &k_, &v_, &o_}; }
  // Activation checkpointing (nn/decoder_block.h): every saved tensor.
  void release_activations();
  // Prefix tuning: attend to `prefix`'s keys and values for `layer` as well.
  void attach_prefix(KVPrefix* prefix, int64_t layer) {
    prefix_ = prefix;
    layer_ = layer;
  }

 private:
  GqaDims d_;  // this rank's heads
  ColumnParallelLinear q_, k_, v_;
  RowParallelLinear o_;
  KVPrefix* prefix_ = nullptr;
  int64_t layer_ = 0;
  Tensor lse_, ctx_, cos_, sin_;  // lse_ [B, NH, T] (kernels/cpu/attention.h)
  const int32_t* pos_ = nullptr;
};

}  // namespace loom::nn
