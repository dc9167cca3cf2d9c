// What the benchmark programs share: a monotonic clock and a probe of the machine's sgemm
// rate, the ceiling their figures are a fraction of (timed between their own runs: this
// machine is shared, and a probe taken once can read half the rate).
#pragma once

#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace loom::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One C[M, N] = A[M, K] B[N, K]^T (the layers' forward product) on OMP_NUM_THREADS threads:
// its operands, and the seconds one run takes.
struct SgemmProbe {
  int64_t M, N, K;
  std::vector<float> a, b, c;
  SgemmProbe(int64_t m, int64_t n, int64_t k)
      : M(m), N(n), K(k), a(m * k, 0.5f), b(n * k, 0.25f), c(m * n) {}
  double seconds() {
    const double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K,
                0.0f, c.data(), N);
    return now_s() - t0;
  }
  double gflops(double s) const { return 2.0 * M * N * K / s / 1e9; }
};

}  // namespace loom::bench
