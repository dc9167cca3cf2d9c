// Products in which one dimension is a small rank r (LoRA's A [r, in] and B [out, r], r ~ 4
// to 64) against a wide operand of N rows (tokens), written for that shape. BLAS runs them far
// below its GEMM rate: it packs the wide operand on every call (OpenBLAS on Zen 3, x [1024,
// 576] @ A^T with r = 8: 16 GFLOP/s, 4 GB/s of x). Here each is one pass over the wide operand
// with the rank's accumulators in registers. Row-major throughout:
//   skinny_nt    : Y[N, r]  = alpha * X[N, W] @ M[r, W]^T
//   skinny_nn_add: Y[N, W] += op(alpha * U[N, r] @ M[r, W])
//   skinny_tn_add: G[r, W] += alpha * U[N, r]^T @ X[N, W]
// op (optional) transforms each result row in place before it is added, and x_op each row of
// X before it is used (LoRA's dropout: nn/dropout.h), with the row's index in [0, N).
// Every element is summed in a fixed order (over W, or over N), whatever the thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace loom::kernels {

using RowOp = std::function<void(int64_t row, float* v)>;

void skinny_nt(float* Y, const float* X, const float* M, int64_t N, int64_t W, int64_t r,
               float alpha, const RowOp& x_op = {});
void skinny_nn_add(float* Y, const float* U, const float* M, int64_t N, int64_t W, int64_t r,
                   float alpha, const RowOp& op = {});
void skinny_tn_add(float* G, const float* U, const float* X, int64_t N, int64_t W, int64_t r,
                   float alpha);

}  // namespace loom::kernels
