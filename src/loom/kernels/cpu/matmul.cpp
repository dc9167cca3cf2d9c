#include "loom/kernels/cpu/matmul.h"

#include <cblas.h>

#include <cstring>

#include "loom/util/profile.h"

namespace loom::kernels {

float start_output(float* out, const float* b, int64_t N, int64_t cols, int64_t ld,
                   bool accumulate) {
  if (!b) return accumulate ? 1.0f : 0.0f;
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * ld;
    if (accumulate)
      for (int64_t c = 0; c < cols; ++c) o[c] += b[c];
    else
      std::memcpy(o, b, cols * sizeof(float));
  }
  return 1.0f;
}

void matmul_forward(float* out, const float* inp, const float* W, const float* b, int64_t N,
                    int64_t C, int64_t OC, bool accumulate) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  const float beta = start_output(out, b, N, OC, OC, accumulate);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, W, C, beta, out, OC);
}

void matmul_backward(float* dinp, float* dW, float* db, const float* dout, const float* inp,
                     const float* W, int64_t N, int64_t C, int64_t OC) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  if (dinp) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, W, C, 1.0f,
                dinp, C);
  }
  if (dW) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dW,
                C);
  }
  if (db) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < OC; ++o) {
      float s = 0.0f;
      for (int64_t n = 0; n < N; ++n) s += dout[n * OC + o];
      db[o] += s;
    }
  }
}

}  // namespace loom::kernels
