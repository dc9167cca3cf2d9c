#include "loom/kernels/cpu/layernorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "loom/util/profile.h"

namespace loom::kernels {

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
  prof::ScopedPhase ph(prof::Phase::Norm);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    // Two passes in double-free float: C <= a few thousand, error well under 1e-6.
    float m = 0.0f;
    for (int64_t i = 0; i < C; ++i) m += xr[i];
    m /= C;
    float v = 0.0f;
    for (int64_t i = 0; i < C; ++i) v += (xr[i] - m) * (xr[i] - m);
    v /= C;
    float s = 1.0f / std::sqrt(v + eps);
    float* o = out + n * C;
    for (int64_t i = 0; i < C; ++i) o[i] = (xr[i] - m) * s * w[i] + (b ? b[i] : 0.0f);
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N,
                        int64_t C) {
  prof::ScopedPhase ph(prof::Phase::Norm);
  int nt = omp_get_max_threads();
  // Per-thread partial sums for dw/db, reduced at the end: rows are split across threads.
  std::vector<float> part(static_cast<size_t>(nt) * 2 * C, 0.0f);
#pragma omp parallel
  {
    float* pdw = part.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    float* pdb = pdw + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C;
      const float* dr = dout + n * C;
      float m = mean[n], s = rstd[n];
      float sum_g = 0.0f, sum_gx = 0.0f;  // means of dnorm and dnorm * xhat
      for (int64_t i = 0; i < C; ++i) {
        float xhat = (xr[i] - m) * s;
        float g = dr[i] * w[i];
        sum_g += g;
        sum_gx += g * xhat;
        pdw[i] += dr[i] * xhat;
        pdb[i] += dr[i];
      }
      sum_g /= C;
      sum_gx /= C;
      float* dxr = dx + n * C;
      for (int64_t i = 0; i < C; ++i) {
        float xhat = (xr[i] - m) * s;
        dxr[i] += (dr[i] * w[i] - sum_g - xhat * sum_gx) * s;
      }
    }
  }
  for (int t = 0; t < nt; ++t) {
    const float* pdw = part.data() + static_cast<size_t>(t) * 2 * C;
    const float* pdb = pdw + C;
    for (int64_t i = 0; i < C; ++i) {
      if (dw) dw[i] += pdw[i];
      if (db) db[i] += pdb[i];
    }
  }
}

}  // namespace loom::kernels
