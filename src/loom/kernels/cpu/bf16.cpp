#include "loom/kernels/cpu/bf16.h"

namespace loom::kernels {

void to_bf16(const float* x, bf16* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = to_bf16(x[i]);
}

void from_bf16(const bf16* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = from_bf16(x[i]);
}

void to_half(Half h, const float* x, uint16_t* y, int64_t n) {
  if (h == Half::bf16) return to_bf16(x, y, n);
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = to_f16(x[i]);
}

void from_half(Half h, const uint16_t* x, float* y, int64_t n) {
  if (h == Half::bf16) return from_bf16(x, y, n);
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = from_f16(x[i]);
}

void add_to_half(Half h, const float* x, uint16_t* acc, int64_t n) {
  if (h == Half::bf16) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) acc[i] = to_bf16(from_bf16(acc[i]) + x[i]);
    return;
  }
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) acc[i] = to_f16(from_f16(acc[i]) + x[i]);
}

}  // namespace loom::kernels
