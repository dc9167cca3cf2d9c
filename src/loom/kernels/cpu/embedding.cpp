#include "loom/kernels/cpu/embedding.h"

#include <omp.h>

#include <string>

#include "loom/util/error.h"
#include "loom/util/profile.h"

namespace loom::kernels {

void embedding_forward(float* out, const int32_t* ids, int64_t N, const float* table, int64_t rows,
                       int64_t C, bool accumulate) {
  prof::ScopedPhase ph(prof::Phase::Embedding);
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] < 0 || ids[n] >= rows)
      throw Error("token id " + std::to_string(ids[n]) + " at position " + std::to_string(n) +
                  " is outside the embedding table of " + std::to_string(rows) + " rows");
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* src = table + static_cast<int64_t>(ids[n]) * C;
    float* dst = out + n * C;
    if (accumulate) {
      for (int64_t i = 0; i < C; ++i) dst[i] += src[i];
    } else {
      for (int64_t i = 0; i < C; ++i) dst[i] = src[i];
    }
  }
}

void embedding_backward(float* dtable, const int32_t* ids, int64_t N, const float* dout,
                        int64_t C) {
  prof::ScopedPhase ph(prof::Phase::Embedding);
  // Threads own disjoint column ranges, so repeated ids never race.
#pragma omp parallel
  {
    int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    int64_t lo = C * tid / nt, hi = C * (tid + 1) / nt;
    for (int64_t n = 0; n < N; ++n) {
      float* dst = dtable + static_cast<int64_t>(ids[n]) * C;
      const float* src = dout + n * C;
      for (int64_t i = lo; i < hi; ++i) dst[i] += src[i];
    }
  }
}

}  // namespace loom::kernels
