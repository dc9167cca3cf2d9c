#include "loom/kernels/cpu/activations.h"

#include <algorithm>
#include <cmath>

#include "loom/kernels/cpu/vec_math.h"
#include "loom/util/profile.h"

namespace loom::kernels {

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
}

// Threads take blocks; the inner loop is a plain simd loop (GCC does not vectorise the
// combined `parallel for simd` form of these bodies).
constexpr int64_t kBlock = 4096;

void gelu_forward(float* y, const float* x, int64_t n) {
  prof::ScopedPhase ph(prof::Phase::Activation);
#pragma omp parallel for schedule(static)
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
#pragma omp simd
    for (int64_t i = b0; i < b1; ++i) {
      float xi = x[i];
      float u = kGeluScale * (xi + 0.044715f * xi * xi * xi);
      y[i] = 0.5f * xi * (1.0f + vtanh(u));
    }
  }
}

void gelu_backward(float* dx, const float* x, const float* dy, int64_t n) {
  prof::ScopedPhase ph(prof::Phase::Activation);
#pragma omp parallel for schedule(static)
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
#pragma omp simd
    for (int64_t i = b0; i < b1; ++i) {
      float xi = x[i];
      float u = kGeluScale * (xi + 0.044715f * xi * xi * xi);
      float th = vtanh(u);
      float sech2 = 1.0f - th * th;
      float du = kGeluScale * (1.0f + 3.0f * 0.044715f * xi * xi);
      dx[i] = dy[i] * (0.5f * (1.0f + th) + 0.5f * xi * sech2 * du);
    }
  }
}

void swiglu_forward(float* h, const float* g, const float* u, int64_t n) {
  prof::ScopedPhase ph(prof::Phase::Activation);
#pragma omp parallel for schedule(static)
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
#pragma omp simd
    for (int64_t i = b0; i < b1; ++i) {
      const float sig = 1.0f / (1.0f + vexp(-g[i]));
      h[i] = g[i] * sig * u[i];
    }
  }
}

void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     int64_t n) {
  prof::ScopedPhase ph(prof::Phase::Activation);
#pragma omp parallel for schedule(static)
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
#pragma omp simd
    for (int64_t i = b0; i < b1; ++i) {
      const float sig = 1.0f / (1.0f + vexp(-g[i]));
      const float silu = g[i] * sig;
      dg[i] = dh[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
      du[i] = dh[i] * silu;
    }
  }
}

void relu_forward(float* y, const float* x, int64_t n) {
  prof::ScopedPhase ph(prof::Phase::Activation);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward(float* dx, const float* x, const float* dy, int64_t n) {
  prof::ScopedPhase ph(prof::Phase::Activation);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

}  // namespace loom::kernels
