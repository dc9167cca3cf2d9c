#include "loom/kernels/cpu/qmatmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "loom/kernels/cpu/matmul.h"
#include "loom/util/error.h"
#include "loom/util/profile.h"

namespace loom::kernels {

namespace {
// 4 MiB of f32 per tile: a whole projection matrix of a small model (SmolLM2's 1536 x 576
// MLP matrices are 0.9 M floats) is one tile and one GEMM, so these products run at the
// f32 GEMM's rate. At 1 << 17 floats the tiles of SmolLM2's down projection were 85 output
// rows wide, too narrow for OpenBLAS's blocking: its forward ran 30% slower than on the
// dequantized f32 matrix (1.03x at 1 << 20; Zen 3, N = 1024). Larger matrices (the vocab
// head, 7B-scale layers) still go tile by tile, one tile of f32 at a time.
constexpr int64_t kTileFloats = int64_t{1} << 20;

int64_t tile_rows(const QuantMatrix& W) {
  return std::clamp<int64_t>(kTileFloats / W.cols, 1, W.rows);
}

// The tile buffer, kept between calls: allocating it afresh per product cost page faults.
float* tile_buffer(int64_t n) {
  static thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}
}  // namespace

void qmatmul_forward(float* out, const float* inp, const QuantMatrix& W, const float* b, int64_t N,
                     bool accumulate) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  const int64_t C = W.cols, OC = W.rows, R = tile_rows(W);
  float* tile = tile_buffer(R * C);
  for (int64_t r0 = 0; r0 < OC; r0 += R) {
    const int64_t r = std::min(R, OC - r0);
    W.dequantize_rows(r0, r0 + r, tile);
    const float beta = start_output(out + r0, b ? b + r0 : nullptr, N, r, OC, accumulate);
    // out[:, r0:r0+r] = inp @ tile^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, C, 1.0f, inp, C, tile, C, beta,
                out + r0, OC);
  }
}

void qmatmul_backward(float* dinp, const float* dout, const QuantMatrix& W, int64_t N) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  const int64_t C = W.cols, OC = W.rows, R = tile_rows(W);
  float* tile = tile_buffer(R * C);
  for (int64_t r0 = 0; r0 < OC; r0 += R) {
    const int64_t r = std::min(R, OC - r0);
    W.dequantize_rows(r0, r0 + r, tile);
    // dinp += dout[:, r0:r0+r] @ tile
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, r, 1.0f, dout + r0, OC, tile, C,
                1.0f, dinp, C);
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
