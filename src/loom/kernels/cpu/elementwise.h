// Small elementwise helpers for residual streams.
#pragma once

#include <cstdint>

namespace loom::kernels {

void add(float* out, const float* a, const float* b, int64_t n);  // out = a + b
void add_inplace(float* y, const float* x, int64_t n);            // y += x
void add_rows(float* y, const float* b, int64_t N, int64_t C);    // y[N, C] += b[C] per row
void zero(float* y, int64_t n);  // threaded memset: one thread cannot saturate memory

}  // namespace loom::kernels
