#include "loom/kernels/cpu/qmatmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "loom/util/error.h"
#include "loom/util/profile.h"

namespace loom::kernels {

namespace {
// ~512 KiB of f32 per tile: large enough for an efficient GEMM panel and for the
// dequantizer's thread pool, small enough to stay out of the way of activations.
constexpr int64_t kTileFloats = int64_t{1} << 17;

int64_t tile_rows(const QuantMatrix& W) {
  return std::clamp<int64_t>(kTileFloats / W.cols, 1, W.rows);
}
}  // namespace

void qmatmul_forward(float* out, const float* inp, const QuantMatrix& W, const float* b,
                     int64_t N) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  const int64_t C = W.cols, OC = W.rows, R = tile_rows(W);
  std::vector<float> tile(static_cast<size_t>(R * C));
  for (int64_t r0 = 0; r0 < OC; r0 += R) {
    const int64_t r = std::min(R, OC - r0);
    W.dequantize_rows(r0, r0 + r, tile.data());
    float beta = 0.0f;
    if (b) {
      for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * OC + r0, b + r0, r * sizeof(float));
      beta = 1.0f;
    }
    // out[:, r0:r0+r] = inp @ tile^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, C, 1.0f, inp, C, tile.data(), C,
                beta, out + r0, OC);
  }
}

void qmatmul_backward(float* dinp, const float* dout, const QuantMatrix& W, int64_t N) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  const int64_t C = W.cols, OC = W.rows, R = tile_rows(W);
  std::vector<float> tile(static_cast<size_t>(R * C));
  for (int64_t r0 = 0; r0 < OC; r0 += R) {
    const int64_t r = std::min(R, OC - r0);
    W.dequantize_rows(r0, r0 + r, tile.data());
    // dinp += dout[:, r0:r0+r] @ tile
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, r, 1.0f, dout + r0, OC,
                tile.data(), C, 1.0f, dinp, C);
  }
}

void qembedding_forward(float* out, const int32_t* ids, int64_t N, const QuantMatrix& W,
                        bool accumulate) {
  prof::ScopedPhase ph(prof::Phase::Embedding);
  const int64_t C = W.cols;
  for (int64_t n = 0; n < N; ++n)
    LOOM_CHECK(ids[n] >= 0 && ids[n] < W.rows,
               "token id " + std::to_string(ids[n]) + " at position " + std::to_string(n) +
                   " is outside the embedding table of " + std::to_string(W.rows) + " rows");
#pragma omp parallel
  {
    std::vector<float> row(accumulate ? C : 0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* o = out + n * C;
      if (!accumulate) {
        W.dequantize_rows(ids[n], ids[n] + 1, o);
        continue;
      }
      W.dequantize_rows(ids[n], ids[n] + 1, row.data());
      for (int64_t i = 0; i < C; ++i) o[i] += row[i];
    }
  }
}

}  // namespace loom::kernels
