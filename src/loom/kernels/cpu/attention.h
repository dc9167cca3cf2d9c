// Causal scaled-dot-product attention with grouped K/V heads (MHA when NKV == NH).
// Layout: token-major with a row stride, so GPT-2's fused qkv buffer [B*T, 3C] is used in
// place (q at +0, k at +C, v at +2C, stride 3C) and separate q/k/v projections also work.
//   q[(b*T + t)*q_stride + h*HD + i],  k/v[(b*T + t)*kv_stride + g*HD + i], g = h / (NH/NKV)
//   out[B*T, NH*HD] (contiguous), att[B, NH, T, T] saved softmax probabilities (row t holds
//   t+1 valid entries; the rest are zero).
// Backward accumulates into dq/dk/dv, which share the strides of q and k/v.
#pragma once

#include <cstdint>

namespace loom::kernels {

struct AttnDims {
  int64_t B, T, NH, NKV, HD;
  int64_t q_stride, kv_stride;
};

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       const AttnDims& d);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, const AttnDims& d);

}  // namespace loom::kernels
