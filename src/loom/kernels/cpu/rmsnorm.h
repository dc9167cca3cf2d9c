// RMSNorm over the last dimension (Llama's): y[N, C] = x * rstd * w, rstd = 1/sqrt(mean(x^2) +
// eps).
//   forward saves rstd[N]; backward: dx += rstd * (g - xhat * mean(g * xhat)), g = dy * w,
//   dw += sum_n dy * xhat (dw may be null).
#pragma once

#include <cstdint>

namespace loom::kernels {

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                     float eps);
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t C);

}  // namespace loom::kernels
