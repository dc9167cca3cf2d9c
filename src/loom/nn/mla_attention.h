// Multi-head latent attention (DeepSeek-V2/V3). Names follow transformers:
//   q_proj [H*Dq, C], or q_a_proj [Rq, C] -> q_a_layernorm -> q_b_proj [H*Dq, Rq]  (Dq = Dn + Dr)
//   kv_a_proj_with_mqa [R + Dr, C]: the latent [N, R] and one rotary key [N, Dr] shared by
//     every head; kv_a_layernorm on the latent; kv_b_proj [H*(Dn + Dv), R] expands it to each
//     head's key (no rope) Dn and value Dv; o_proj [C, H*Dv].
// Head h's query is [q_nope (Dn), rope(q_rot) (Dr)], its key [k_nope_h, rope(k_rot)], scores
// scaled by `scale` (Dq^-1/2, times yarn's mscale^2). rope_interleave (V3's default, and V2's
// complex form): the rotary dims are pairs (2i, 2i+1) rotated by frequency i; they are laid
// out as [evens | odds] before the rotate-half kernel, a permutation both q and k share, so
// scores equal transformers'. The attention kernel takes one head width: heads are padded
// to Dh = max(Dq, Dv) with zero columns (zero keys add nothing to a score, zero values
// nothing to the output).
//   forward : x [B, T, C], Positions (rope tables [B*T, Dr/2]) -> y [B, T, C]
//   backward: dy -> dx += ...
//   forward_cached: batch 1; the cache holds what MLA caches, per token the normalised
//     latent and the rotated key [R + Dr] (kc rows past..past+n-1; vc is not used); each
//     step expands every cached latent again through kv_b_proj (transformers' way; the
//     weight-absorbed form that skips it is an inference optimisation not done here).
// Tensor parallelism and prefix tuning are refused by the model (models/deepseek.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/nn/decoder_block.h"
#include "loom/nn/rmsnorm.h"

namespace loom::nn {

struct MlaDims {
  int64_t hidden = 0, n_head = 0;
  int64_t q_lora_rank = 0;  // 0: a direct q_proj
  int64_t kv_lora_rank = 0, nope = 0, rope = 0, v = 0;
  bool bias = false;       // attention_bias: q_a/q (when direct)/kv_a/o biases
  bool interleave = true;  // rope_interleave
  float scale = 0.0f;      // score scale
};

class MlaAttention {
 public:
  MlaAttention(ParamStore& ps, const std::string& name, const MlaDims& d, float init_std);
  const Tensor& forward(const Tensor& x, const Positions& p);
  void backward(const Tensor& dy, const Tensor& dx, Scratch& scratch);
  const Tensor& forward_cached(const Tensor& x, const Positions& p, const Tensor& kc,
                               const Tensor& vc, int64_t past);
  std::vector<Linear*> linears();
  void release_activations();
  void attach_prefix(KVPrefix*, int64_t);  // refused: MLA caches no per-head keys and values
  int64_t cache_width() const { return d_.kv_lora_rank + d_.rope; }

 private:
  int64_t qd() const { return d_.nope + d_.rope; }
  int64_t hd() const { return std::max(qd(), d_.v); }
  // The query q [n, H*Dq] into qh [n, H*Dh]: no-rope part copied, rotary part laid out for
  // the kernel and rotated with the tables (rows n).
  void build_queries(const float* q, int64_t n, const Tensor& cos, const Tensor& sin);
  // Keys and values of rows [0, n) from kv [n, H*(Dn+Dv)] and the rotated keys krot
  // (row r at krot + r * krot_stride, Dr values already rotated and laid out).
  void build_keys_values(const float* kv, const float* krot, int64_t krot_stride, int64_t n);
  // ctx_ [n, H*Dh] -> ctx_v_ [n, H*Dv], then o_proj.
  const Tensor& project_out(const Shape& rows);

  MlaDims d_;
  std::unique_ptr<Linear> q_, q_a_, q_b_, kv_a_, kv_b_, o_;
  std::unique_ptr<RMSNorm> q_norm_, kv_norm_;
  Tensor lat_in_;           // [B, T, R] the latent columns of kv_a's output
  Tensor qh_, kh_, vh_;     // [B, T, H*Dh] the kernel's padded heads (q, k rotated)
  Tensor ctx_, ctx_v_;      // [B, T, H*Dh], [B, T, H*Dv]
  Tensor lse_, cos_, sin_;  // lse_ [B, H, T]
  Tensor krot_;             // [B, T, Dr] the rotated shared key (laid out as the kernel's)
  const int32_t* pos_ = nullptr;
};

}  // namespace loom::nn
