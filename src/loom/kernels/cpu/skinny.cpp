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

float* row_buffer(int64_t n) {
  static thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
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

// G[j, c:c+L] += alpha * sum_n U[n, j] X[n, c:c+L], j in [0, J): one strip of L = kLanes
// columns.
template <int J>
void strip(float* G, const float* U, int64_t r, const float* X, int64_t N, int64_t W, int64_t c,
           float alpha) {
  vf acc[J] = {};
  for (int64_t n = 0; n < N; ++n) {
    const vf xv = loadv(X + n * W + c);
    const float* u = U + n * r;
    for (int j = 0; j < J; ++j) acc[j] += u[j] * xv;
  }
  for (int j = 0; j < J; ++j) storev(G + j * W + c, loadv(G + j * W + c) + alpha * acc[j]);
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
    by_eights(r, [&]<int J>(int64_t j0) { dots<J>(Y + n * r + j0, x, M + j0 * W, W, alpha); });
  }
}

void skinny_nn_add(float* Y, const float* U, const float* M, int64_t N, int64_t W, int64_t r,
                   float alpha, const RowOp& op) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
#pragma omp parallel for schedule(static) if (N * W >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    float a[kRankBlock];
    float* t = row_buffer(W);
    by_eights(r, [&]<int J>(int64_t j0) {
      for (int j = 0; j < J; ++j) a[j] = alpha * U[n * r + j0 + j];
      combine<J>(t, a, M + j0 * W, W, j0 > 0);
    });
    if (op) op(n, t);
    float* y = Y + n * W;
    for (int64_t c = 0; c < W; ++c) y[c] += t[c];
  }
}

void skinny_tn_add(float* G, const float* U, const float* X, int64_t N, int64_t W, int64_t r,
                   float alpha) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  const int64_t strips = W / kLanes;
#pragma omp parallel for schedule(static) if (N * W >= kParallelMin)
  for (int64_t s = 0; s < strips; ++s)
    by_eights(
        r, [&]<int J>(int64_t j0) { strip<J>(G + j0 * W, U + j0, r, X, N, W, s * kLanes, alpha); });
  for (int64_t c = strips * kLanes; c < W; ++c)  // the last W % kLanes columns
    for (int64_t j = 0; j < r; ++j) {
      float acc = 0.0f;
      for (int64_t n = 0; n < N; ++n) acc += U[n * r + j] * X[n * W + c];
      G[j * W + c] += alpha * acc;
    }
}

}  // namespace loom::kernels
