#include "loom/kernels/cpu/skinny.h"

#include <algorithm>
#include <vector>

#include "loom/kernels/cpu/vec_math.h"
#include "loom/util/profile.h"

namespace loom::kernels {

namespace {
// The rank is taken eight at a time, J <= 8 accumulators (vf: kVecWidth floats) in
// registers.
constexpr int64_t kRankBlock = 8;
constexpr int64_t kLanes = kVecWidth;

// Below this many wide elements a product runs on the calling thread alone.
constexpr int64_t kParallelMin = int64_t{1} << 15;

// A per-thread scratch row of n floats; `slot` tells apart rows live at the same time.
float* row_buffer(int64_t n, int slot = 0) {
  static thread_local std::vector<float> buf[2];
  if (static_cast<int64_t>(buf[slot].size()) < n) buf[slot].resize(static_cast<size_t>(n));
  return buf[slot].data();
}

// y[j] = alpha * x . M[j], j in [0, J): J dot products of length W in one pass over x.
template <int J>
void dots(float* y, const float* x, const float* M, int64_t W, float alpha) {
  vf acc[J] = {};
  int64_t c = 0;
  for (; c + kLanes <= W; c += kLanes) {
    const vf xv = loadv(x + c);
    for (int j = 0; j < J; ++j) acc[j] += xv * loadv(M + j * W + c);
  }
  for (int j = 0; j < J; ++j) {
    float s = hsum(acc[j]);
    for (int64_t k = c; k < W; ++k) s += x[k] * M[j * W + k];
    y[j] = alpha * s;
  }
}

// t[:] (=|+=) sum_j a[j] M[j, :], j in [0, J).
template <int J>
void combine(float* t, const float* a, const float* M, int64_t W, bool accumulate) {
  vf b[J];
  for (int j = 0; j < J; ++j) b[j] = a[j] + vf{};
  int64_t c = 0;
  for (; c + kLanes <= W; c += kLanes) {
    vf acc = accumulate ? loadv(t + c) : vf{};
    for (int j = 0; j < J; ++j) acc += b[j] * loadv(M + j * W + c);
    storev(t + c, acc);
  }
  for (; c < W; ++c) {
    float s = accumulate ? t[c] : 0.0f;
    for (int j = 0; j < J; ++j) s += a[j] * M[j * W + c];
    t[c] = s;
  }
}

// G[j, c:c+L] = sum_n U[n, j] X[n, c:c+L], j in [0, J), n in [0, N): one strip of L = kLanes
// columns.
template <int J>
void strip(float* G, const float* U, int64_t r, const float* X, int64_t N, int64_t W, int64_t c) {
  vf acc[J] = {};
  for (int64_t n = 0; n < N; ++n) {
    const vf xv = loadv(X + n * W + c);
    const float* u = U + n * r;
    for (int j = 0; j < J; ++j) acc[j] += u[j] * xv;
  }
  for (int j = 0; j < J; ++j) storev(G + j * W + c, acc[j]);
}

// f.template operator()<J>(j0) for the last `left` (< 8) indices, J = left as a constant.
template <int J, class F>
void remainder(int64_t left, int64_t j0, F& f) {
  if constexpr (J > 0) {
    if (left == J) return f.template operator()<J>(j0);
    remainder<J - 1>(left, j0, f);
  }
}

// Calls f.template operator()<J>(j0) for each block of at most eight of the r indices.
template <class F>
void by_eights(int64_t r, F&& f) {
  int64_t j0 = 0;
  for (; j0 + kRankBlock <= r; j0 += kRankBlock) f.template operator()<kRankBlock>(j0);
  remainder<7>(r - j0, j0, f);
}

// y[0, r) = alpha * x[W] @ M[r, W]^T: one row of skinny_nt.
void dots_row(float* y, const float* x, const float* M, int64_t W, int64_t r, float alpha) {
  by_eights(r, [&]<int J>(int64_t j0) { dots<J>(y + j0, x, M + j0 * W, W, alpha); });
}

// t[W] = alpha * u[r] @ M[r, W]: one row of skinny_nn.
void combine_row(float* t, const float* u, const float* M, int64_t W, int64_t r, float alpha) {
  float a[kRankBlock];
  by_eights(r, [&]<int J>(int64_t j0) {
    for (int j = 0; j < J; ++j) a[j] = alpha * u[j0 + j];
    combine<J>(t, a, M + j0 * W, W, j0 > 0);
  });
}
}  // namespace

void skinny_nt(float* Y, const float* X, const float* M, int64_t N, int64_t W, int64_t r,
               float alpha, const RowOp& x_op) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
#pragma omp parallel for schedule(static) if (N * W >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = X + n * W;
    if (x_op) {
      float* t = row_buffer(W);
      std::copy(x, x + W, t);
      x_op(n, t);
      x = t;
    }
    dots_row(Y + n * r, x, M, W, r, alpha);
  }
}

void skinny_nn(float* Y, const float* U, const float* M, int64_t N, int64_t W, int64_t r,
               float alpha, const RowOp& op, bool accumulate) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
#pragma omp parallel for schedule(static) if (N * W >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    float* y = Y + n * W;
    float* t = accumulate ? row_buffer(W) : y;  // set: the row is built in place
    combine_row(t, U + n * r, M, W, r, alpha);
    if (op) op(n, t);
    if (accumulate)
      for (int64_t c = 0; c < W; ++c) y[c] += t[c];
  }
}

namespace {
// Rows per chunk of the fused kernels: 64 rows of a 1536-wide operand are 384 KiB, read from
// memory by the row-wise product and again from L2 by the column sums.
constexpr int64_t kChunkRows = 64;

// G[r, W] = U[rows, r]^T X[rows, W] (set, not added), strips of kLanes columns, the rest scalar.
void column_sums(float* G, const float* U, int64_t r, const float* X, int64_t rows, int64_t W) {
  const int64_t strips = W / kLanes;
  for (int64_t s = 0; s < strips; ++s)
    by_eights(r,
              [&]<int J>(int64_t j0) { strip<J>(G + j0 * W, U + j0, r, X, rows, W, s * kLanes); });
  for (int64_t c = strips * kLanes; c < W; ++c)
    for (int64_t j = 0; j < r; ++j) {
      float acc = 0.0f;
      for (int64_t n = 0; n < rows; ++n) acc += U[n * r + j] * X[n * W + c];
      G[j * W + c] = acc;
    }
}

// The fused kernels' driver: each chunk of rows [n0, n1) runs rows(n0, n1), the row-wise
// product, which returns the chunk's X rows as the column sums read them; then their sums
// U_c^T X_c go to the chunk's own partial, and G[r, W] += alpha * (the partials in chunk
// order), so the order does not depend on which thread ran which chunk.
template <class Rows>
void by_chunks(float* G, const float* U, int64_t N, int64_t W, int64_t r, float alpha,
               Rows&& rows) {
  const int64_t chunks = (N + kChunkRows - 1) / kChunkRows;
  static thread_local std::vector<float> partials;  // the calling thread's, shared with its team
  if (G) partials.resize(static_cast<size_t>(chunks * r * W));
  float* part = partials.data();
#pragma omp parallel for schedule(static) if (N * W >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n0 = c * kChunkRows, n1 = std::min(N, n0 + kChunkRows);
    const float* xc = rows(n0, n1);
    if (G) column_sums(part + c * r * W, U + n0 * r, r, xc, n1 - n0, W);
  }
  if (!G) return;
  const int64_t n = r * W;
#pragma omp parallel for schedule(static) if (n * chunks >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float s = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) s += part[c * n + i];
    G[i] += alpha * s;
  }
}
}  // namespace

void skinny_nt_tn(float* Y, float* G, const float* X, const float* M, const float* U, int64_t N,
                  int64_t W, int64_t r, float alpha) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  if (!Y && !G) return;
  by_chunks(G, U, N, W, r, alpha, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; Y && n < n1; ++n) dots_row(Y + n * r, X + n * W, M, W, r, alpha);
    return X + n0 * W;
  });
}

void skinny_nn_tn(float* Y, float* G, const float* D, const float* U, const float* M,
                  const float* X, int64_t N, int64_t W, int64_t r, float alpha, const RowOp& mask) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  if (!Y && !G) return;
  by_chunks(G, U, N, W, r, alpha, [&](int64_t n0, int64_t n1) {
    float *mult = row_buffer(W, 0), *t = row_buffer(W, 1);
    static thread_local std::vector<float> masked;  // the chunk's mask * X rows
    if (mask && G) masked.resize(static_cast<size_t>(kChunkRows * W));
    for (int64_t n = n0; n < n1; ++n) {
      if (mask) {
        std::fill_n(mult, W, 1.0f);
        mask(n, mult);
      }
      if (Y) {
        combine_row(t, D + n * r, M, W, r, alpha);
        float* y = Y + n * W;
        if (mask)
          for (int64_t c = 0; c < W; ++c) y[c] += t[c] * mult[c];
        else
          for (int64_t c = 0; c < W; ++c) y[c] += t[c];
      }
      if (mask && G) {
        const float* x = X + n * W;
        float* xm = masked.data() + (n - n0) * W;
        for (int64_t c = 0; c < W; ++c) xm[c] = x[c] * mult[c];
      }
    }
    return mask && G ? static_cast<const float*>(masked.data()) : X + n0 * W;
  });
}

}  // namespace loom::kernels
