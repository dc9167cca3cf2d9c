// Causal scaled-dot-product attention with grouped K/V heads (MHA when NKV == NH).
// Layout: token-major with a row stride, so GPT-2's fused qkv buffer [B*T, 3C] is used in
// place (q at +0, k at +C, v at +2C, stride 3C) and separate q/k/v projections also work.
//   q[(b*T + t)*q_stride + h*HD + i],  k/v[(b*T + t)*kv_stride + g*HD + i], g = h / (NH/NKV)
//   out[B*T, NH*HD] (contiguous), lse[B, NH, T]: log sum_s exp(score of key s) of each query
//   row (scores already scaled by 1/sqrt(HD)), all a backward needs besides q, k, v, out.
// The [T, T] probabilities are never stored (FlashAttention's recompute, Dao 2022): work
// runs in strips of up to 64 query rows against all the keys they may see, as register-
// tiled products on packed copies (scores = Q K^T, out = P V; backward dV = P^T dO,
// dP = dO V^T, dQ = dS K, dK = dS^T Q: kernels/cpu/attention_tiles.h), with the softmax of
// a strip done exactly on its [rows, keys] block in a per-thread buffer; the tiles stop at
// the last key their rows may see, and backward rebuilds P and dS as the tiles are stored.
// Packed sequences: with pos (position ids [B*T], restarting at 0 where a packed sample
// starts) token t attends only to s in [t - pos[t], t], i.e. within its own sample; with
// pos == nullptr the whole row is one sequence.
// Prefix tuning (PEFT): P virtual key/value rows, shared by every batch row, that every
// query (in every packed sample) attends to besides its causal keys; no mask, no RoPE:
//   prefix_k/v[j*prefix_stride + g*HD + i], j < P. One softmax spans prefix and causal keys.
// Backward writes (=) every element of dq/dk/dv's heads, which share the strides of q and
// k/v (so their buffers need no zeroing), and, when both non-null, of dprefix_k/v[B, P,
// NKV*HD] (contiguous): one slice per batch row so the threads over b never race; the
// caller sums over B for the shared prefix's gradient.
#pragma once

#include <cstdint>

namespace loom::kernels {

struct AttnDims {
  int64_t B, T, NH, NKV, HD;
  int64_t q_stride, kv_stride;
  const int32_t* pos = nullptr;
  const float* prefix_k = nullptr;  // [P rows, row stride prefix_stride], head g at + g*HD
  const float* prefix_v = nullptr;
  int64_t P = 0;              // number of prefix (virtual) tokens
  int64_t prefix_stride = 0;  // floats between consecutive prefix rows
  // The scores' scale; 0: 1/sqrt(HD). MLA (nn/mla_attention.h) pads its heads to one HD
  // and scales by its own query/key width.
  float scale = 0.0f;
};

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttnDims& d);
// out and lse are the forward's.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttnDims& d, float* dprefix_k = nullptr, float* dprefix_v = nullptr);

// Inference with a KV cache (batch 1): n new queries at absolute positions past..past+n-1
// attend causally to cached keys/values rows [0, past + n).
//   q[n, NH*HD] (row stride q_stride), kc/vc[past + n rows, NKV*HD] (row stride kv_stride),
//   out[n, NH*HD]. The same strips as training (a prompt's prefill is GEMM-shaped; one new
//   token is a row of one). scale as AttnDims's.
void attention_forward_cached(float* out, const float* q, const float* kc, const float* vc,
                              int64_t n, int64_t past, int64_t NH, int64_t NKV, int64_t HD,
                              int64_t q_stride, int64_t kv_stride, float scale = 0.0f);

}  // namespace loom::kernels
