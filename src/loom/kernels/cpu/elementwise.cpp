#include "loom/kernels/cpu/elementwise.h"

#include <algorithm>
#include <cstring>

#include "loom/util/profile.h"

namespace loom::kernels {

void add(float* out, const float* a, const float* b, int64_t n) {
  prof::ScopedPhase ph(prof::Phase::Other);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
  prof::ScopedPhase ph(prof::Phase::Other);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void add_rows(float* y, const float* b, int64_t N, int64_t C) {
  prof::ScopedPhase ph(prof::Phase::Other);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) y[n * C + c] += b[c];
}

void zero(float* y, int64_t n) {
  prof::ScopedPhase ph(prof::Phase::Other);
  constexpr int64_t kBlock = 1 << 16;
#pragma omp parallel for schedule(static)
  for (int64_t b0 = 0; b0 < n; b0 += kBlock)
    std::memset(y + b0, 0, std::min(kBlock, n - b0) * sizeof(float));
}

}  // namespace loom::kernels
