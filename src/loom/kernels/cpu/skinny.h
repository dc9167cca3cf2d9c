// Products in which one dimension is a small rank r (LoRA's A [r, in] and B [out, r], r ~ 4
// to 64) against a wide operand of N rows (tokens), written for that shape. BLAS runs them far
// below its GEMM rate: it packs the wide operand on every call (OpenBLAS on Zen 3, x [1024,
// 576] @ A^T with r = 8: 16 GFLOP/s, 4 GB/s of x). Here each is one pass over the wide operand
// with the rank's accumulators in registers. Row-major throughout:
//   skinny_nt    : Y[N, r]  = alpha * X[N, W] @ M[r, W]^T
//   skinny_nn    : Y[N, W] (=|+=) op(alpha * U[N, r] @ M[r, W])  (+= with accumulate)
// op (optional) transforms each result row in place before it is stored, and x_op each row of
// X before it is used (LoRA's dropout: nn/dropout.h), with the row's index in [0, N).
// LoRA's backward needs a column sum G[r, W] += U^T X beside each row-wise product over the
// same X; the fused kernels read X once for both, in chunks of rows that stay in cache for
// the column sums (one read of dy and of x per LoRA layer instead of two, and no stored
// dropped copy of x):
//   skinny_nt_tn : Y[N, r]  = alpha * X @ M^T           and G[r, W] += alpha * U[N, r]^T @ X
//   skinny_nn_tn : Y[N, W] += mask * (alpha * D[N, r] @ M) and G[r, W] += alpha * U^T @ (mask * X)
// where `mask` scales row n elementwise (applied once to a row of ones for its multipliers:
// it must be a diagonal map, as dropout is). Y or G may be null (that product is skipped).
// Every element is summed in a fixed order (over W, or over N in chunks of fixed size added
// in chunk order), whatever the thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace loom::kernels {

using RowOp = std::function<void(int64_t row, float* v)>;

void skinny_nt(float* Y, const float* X, const float* M, int64_t N, int64_t W, int64_t r,
               float alpha, const RowOp& x_op = {});
void skinny_nn(float* Y, const float* U, const float* M, int64_t N, int64_t W, int64_t r,
               float alpha, const RowOp& op = {}, bool accumulate = true);
void skinny_nt_tn(float* Y, float* G, const float* X, const float* M, const float* U, int64_t N,
                  int64_t W, int64_t r, float alpha);
void skinny_nn_tn(float* Y, float* G, const float* D, const float* U, const float* M,
                  const float* X, int64_t N, int64_t W, int64_t r, float alpha,
                  const RowOp& mask = {});

}  // namespace loom::kernels
