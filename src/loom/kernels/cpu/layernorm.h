// LayerNorm over the last dimension, fused forward and backward (as llm.c).
//   forward : out[N, C] = (x - mean) * rstd * w + b ; saves mean[N], rstd[N]
//   backward: dx += ..., dw += sum_n dout * xhat, db += sum_n dout (dw/db may be null)
#pragma once

#include <cstdint>

namespace loom::kernels {

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps);
void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C);

}  // namespace loom::kernels
