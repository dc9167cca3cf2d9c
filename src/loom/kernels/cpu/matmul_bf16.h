// Matrix products with bf16 operands, fp32 accumulation and fp32 output (mixed precision).
//   gemm_bf16: C[M, N] = op(A) @ op(B) + beta * C; A, B row-major bf16 with leading
//              dimensions lda, ldb (op(A) = A [M, K], or A^T with A stored [K, M]).
//   gemm_half: the same for either 16-bit format (kernels/cpu/bf16.h's Half).
//   The Linear layer's products, as kernels/cpu/matmul.h with 16-bit inputs:
//   forward : out[N, OC] = inp[N, C] @ W[OC, C]^T + b[OC]          (b fp32, may be null)
//   backward: dinp[N, C] += dout @ W ; dW[OC, C] += dout^T @ inp ; db[OC] += sum_n dout
// Backends: oneDNN's matmul (Debian's libdnnl, brgemm kernels on avx512_core_bf16 / AMX: the
// CPU's native bf16 dot products) when Loom was built with it and the CPU has them;
// otherwise the operands are widened to fp32 (exact) and OpenBLAS sgemm runs, so results
// agree to fp32 summation order on every machine. LOOM_BF16_GEMM=fallback forces the second.
// (OpenBLAS's own sbgemm is not in Debian's or PyPI's builds: both are compiled without
// BUILD_BFLOAT16.) bench/gemm_bf16.cpp measures both against sgemm. fp16 operands always
// take the widening path: fp16 dot products need avx512_fp16 or AMX-FP16 (Sapphire Rapids
// and later), which the CPUs Loom runs on so far lack; the numbers are the same.
#pragma once

#include <cstdint>
#include <string>

#include "loom/kernels/cpu/bf16.h"

namespace loom::kernels {

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16* A,
               int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

void gemm_half(Half h, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

void matmul_forward_half(Half h, float* out, const uint16_t* inp, const uint16_t* W, const float* b,
                         int64_t N, int64_t C, int64_t OC, bool accumulate = false);
void matmul_backward_half(Half h, float* dinp, float* dW, float* db, const uint16_t* dout,
                          const uint16_t* inp, const uint16_t* W, int64_t N, int64_t C, int64_t OC);

enum class Bf16Gemm { onednn, fallback };
// The backend gemm_bf16 uses (chosen once, on first use, from the build, the CPU and
// LOOM_BF16_GEMM), and a line saying which and why, for logs and benchmarks.
Bf16Gemm bf16_gemm_backend();
std::string bf16_gemm_description();
// Tests and benchmarks: force a backend (onednn only where bf16_native() is true).
void set_bf16_gemm_backend(Bf16Gemm b);
// True when oneDNN is built in and the CPU has native bf16 dot products.
bool bf16_native();

}  // namespace loom::kernels
