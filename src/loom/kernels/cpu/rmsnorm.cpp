#include "loom/kernels/cpu/rmsnorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "loom/util/profile.h"

namespace loom::kernels {

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                     float eps) {
  prof::ScopedPhase ph(prof::Phase::Norm);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < C; ++i) ss += xr[i] * xr[i];
    const float s = 1.0f / std::sqrt(ss / C + eps);
    float* o = out + n * C;
#pragma omp simd
    for (int64_t i = 0; i < C; ++i) o[i] = xr[i] * s * w[i];
    rstd[n] = s;
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t C) {
  prof::ScopedPhase ph(prof::Phase::Norm);
  const int nt = omp_get_max_threads();
  // Per-thread partial dw, reduced at the end: rows are split across threads.
  std::vector<float> part(static_cast<size_t>(nt) * C, 0.0f);
#pragma omp parallel
  {
    float* pdw = part.data() + static_cast<size_t>(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C;
      const float* dr = dout + n * C;
      const float s = rstd[n];
      float sum_gx = 0.0f;
      for (int64_t i = 0; i < C; ++i) {
        const float xhat = xr[i] * s;
        sum_gx += dr[i] * w[i] * xhat;
        pdw[i] += dr[i] * xhat;
      }
      sum_gx /= C;
      float* dxr = dx + n * C;
      for (int64_t i = 0; i < C; ++i) dxr[i] += s * (dr[i] * w[i] - xr[i] * s * sum_gx);
    }
  }
  if (dw)
    for (int t = 0; t < nt; ++t)
      for (int64_t i = 0; i < C; ++i) dw[i] += part[static_cast<size_t>(t) * C + i];
}

}  // namespace loom::kernels
