// Dense layer math through BLAS (row-major, weights stored as nn.Linear does: [OC, C]).
//   forward : out[N, OC] (=|+=) inp[N, C] @ W[OC, C]^T + b[OC]  (+= with accumulate: a LoRA
//             branch written first, so BLAS skips its pass zeroing out for beta = 0)
//   backward: dinp[N, C] += dout @ W ; dW[OC, C] += dout^T @ inp ; db[OC] += sum_n dout
// Backward accumulates (beta = 1) so gradient accumulation and residual branches need no
// extra buffers. Any of dinp, dW, db may be null to skip that product (frozen weights).
#pragma once

#include <cstdint>

namespace loom::kernels {

void matmul_forward(float* out, const float* inp, const float* W, const float* b, int64_t N,
                    int64_t C, int64_t OC, bool accumulate = false);
// The forward products' start: b into columns [0, cols) of out's N rows (row stride ld),
// copied, or added to what out holds when accumulating; returns the GEMM's beta.
float start_output(float* out, const float* b, int64_t N, int64_t cols, int64_t ld,
                   bool accumulate);
void matmul_backward(float* dinp, float* dW, float* db, const float* dout, const float* inp,
                     const float* W, int64_t N, int64_t C, int64_t OC);

}  // namespace loom::kernels
