// What the benchmark programs share: a monotonic clock and the machine's measured sgemm
// rate, the ceiling their figures are a fraction of.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace loom::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// sgemm rate of C[M, N] = A[M, K] B[N, K]^T (the layers' forward product), GFLOP/s, best of
// 20 (the machine is shared: one sample can be half the rate), on OMP_NUM_THREADS threads.
inline double sgemm_gflops(int64_t M, int64_t N, int64_t K) {
  std::vector<float> a(M * K, 0.5f), b(N * K, 0.25f), c(M * N);
  double best = 1e30;
  for (int r = 0; r < 21; ++r) {
    const double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K,
                0.0f, c.data(), N);
    if (r > 0) best = std::min(best, now_s() - t0);
  }
  return 2.0 * M * N * K / best / 1e9;
}

}  // namespace loom::bench
