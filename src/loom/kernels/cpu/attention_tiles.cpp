#include "loom/kernels/cpu/attention_tiles.h"

#include <algorithm>
#include <vector>

#include "loom/kernels/cpu/vec_math.h"

namespace loom::kernels {

namespace {
constexpr int kMR = 6;       // rows (tile_atb: key columns) per register tile
constexpr int64_t kNR = 16;  // columns per register tile: two v8f

// f.template operator()<R>(i0) over [0, total) in tiles of kMR, the last one R < kMR.
template <class F>
void by_tiles(int64_t total, F&& f) {
  int64_t i0 = 0;
  for (; i0 + kMR <= total; i0 += kMR) f.template operator()<kMR>(i0);
  switch (total - i0) {
    case 5:
      f.template operator()<5>(i0);
      break;
    case 4:
      f.template operator()<4>(i0);
      break;
    case 3:
      f.template operator()<3>(i0);
      break;
    case 2:
      f.template operator()<2>(i0);
      break;
    case 1:
      f.template operator()<1>(i0);
      break;
    default:
      break;
  }
}

template <int R>
int64_t tile_end(const int64_t* end, int64_t i0) {
  int64_t e = 0;
  for (int i = 0; i < R; ++i) e = std::max(e, end[i0 + i]);
  return e;
}

// The three register tiles below keep R x 2 v8f accumulators (R <= 6: 12 of the 16 AVX
// registers), started at zero; C is read, where they accumulate, only in the store
// (loading it into the accumulators first made GCC keep them on the stack).

// C[R, 16] (= | +=) the accumulators.
template <int R>
inline void store_tile(float* C, int64_t ldc, const v8f* lo, const v8f* hi, bool accumulate) {
  for (int i = 0; i < R; ++i) {
    float* c = C + i * ldc;
    store8(c, accumulate ? lo[i] + load8(c) : lo[i]);
    store8(c + 8, accumulate ? hi[i] + load8(c + 8) : hi[i]);
  }
}

// Row i's 16 (or `cols`) products x of a tile, stored into c as `st` says (columns j0..).
template <AbtStore::Kind K>
inline void store_row(float* c, const float* x, int64_t cols, int64_t i, int64_t j0,
                      const int64_t* end, const AbtStore& st) {
  const float alpha = st.alpha;
  if constexpr (K == AbtStore::Scaled) {
#pragma omp simd
    for (int64_t k = 0; k < cols; ++k) c[k] = alpha * x[k];
  } else if constexpr (K == AbtStore::Exp) {
    const float shift = st.shift[i];
    const int64_t lo = st.first[i], hi = end[i], always = st.always;
#pragma omp simd
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t j = j0 + k;
      const float e = vexp(alpha * x[k] - shift);
      c[k] = j < always || (j >= lo && j < hi) ? e : 0.0f;
    }
  } else {
    const float* p = st.P + i * st.ldp + j0;
    const float d = st.d[i];
#pragma omp simd
    for (int64_t k = 0; k < cols; ++k) c[k] = p[k] * (x[k] - d) * alpha;
  }
}

// C[R, cols] = store(A[R, :D] BT[:D, 16]) (cols <= 16 stored), rows i0.. of the block.
template <AbtStore::Kind K, int R>
void abt_tile(float* C, int64_t ldc, const float* A, int64_t lda, const float* BT, int64_t ldb,
              int64_t D, int64_t cols, int64_t i0, int64_t j0, const int64_t* end,
              const AbtStore& st) {
  v8f lo[R] = {}, hi[R] = {};
  for (int64_t c = 0; c < D; ++c) {
    const v8f b0 = load8(BT + c * ldb), b1 = load8(BT + c * ldb + 8);
    for (int i = 0; i < R; ++i) {
      const float a = A[i * lda + c];
      lo[i] += a * b0;
      hi[i] += a * b1;
    }
  }
  for (int i = 0; i < R; ++i) {
    float x[kNR];
    store8(x, lo[i]);
    store8(x + 8, hi[i]);
    store_row<K>(C + i * ldc, x, cols, i0 + i, j0, end, st);
  }
}

template <AbtStore::Kind K>
void abt(float* C, int64_t ldc, const float* A, int64_t lda, const float* BT, int64_t ldb,
         int64_t m, int64_t n, int64_t D, const int64_t* end, const AbtStore& store) {
  // Column panels outside: BT's [D, 16] panel (4 KiB at D = 64) stays in L1 while A's rows
  // stream past it (rows before columns read every panel from L2 for every 6 rows).
  int64_t e = 0;
  for (int64_t i = 0; i < m; ++i) e = std::max(e, end[i]);
  for (int64_t j0 = 0; j0 < std::min(n, e); j0 += kNR)
    by_tiles(m, [&]<int R>(int64_t i0) {
      if (tile_end<R>(end, i0) > j0)
        abt_tile<K, R>(C + i0 * ldc + j0, ldc, A + i0 * lda, lda, BT + j0, ldb, D,
                       std::min(kNR, n - j0), i0, j0, end, store);
    });
  // Past each row tile's last column tile, every row's columns are masked: 0.
  by_tiles(m, [&]<int R>(int64_t i0) {
    const int64_t from = std::min(n, (tile_end<R>(end, i0) + kNR - 1) / kNR * kNR);
    for (int64_t i = i0; i < i0 + R; ++i) std::fill(C + i * ldc + from, C + i * ldc + n, 0.0f);
  });
}

// C[R, 16] (= | +=) At[:cnt, R]^T B[:cnt, 16]: At is the row tile of A packed column by column,
// so the loop walks two pointers (with A's R rows read in place GCC ran out of registers
// for their offsets and kept B's pointer in memory: a store-to-load chain per iteration).
template <int R>
void ab_tile(float* C, int64_t ldc, const float* At, const float* B, int64_t ldb, int64_t cnt,
             bool accumulate) {
  v8f lo[R] = {}, hi[R] = {};
  for (int64_t j = 0; j < cnt; ++j, At += R, B += ldb) {
    const v8f b0 = load8(B), b1 = load8(B + 8);
    for (int i = 0; i < R; ++i) {
      lo[i] += At[i] * b0;
      hi[i] += At[i] * b1;
    }
  }
  store_tile<R>(C, ldc, lo, hi, accumulate);
}

// C[R, 16] += A[rows, R]^T B[rows, 16], rows [s m + first, s m + m) of each segment s.
template <int R>
void atb_tile(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb,
              int64_t m, int64_t segs, int64_t first) {
  v8f lo[R] = {}, hi[R] = {};
  for (int64_t s = 0; s < segs; ++s) {
    const float* a = A + (s * m + first) * lda;
    const float* b = B + (s * m + first) * ldb;
    for (int64_t i = first; i < m; ++i, a += lda, b += ldb) {
      const v8f b0 = load8(b), b1 = load8(b + 8);
      for (int j = 0; j < R; ++j) {
        lo[j] += a[j] * b0;
        hi[j] += a[j] * b1;
      }
    }
  }
  store_tile<R>(C, ldc, lo, hi, true);
}
}  // namespace

void tile_abt(float* C, int64_t ldc, const float* A, int64_t lda, const float* BT, int64_t ldb,
              int64_t m, int64_t n, int64_t D, const int64_t* end, const AbtStore& store) {
  switch (store.kind) {
    case AbtStore::Scaled:
      return abt<AbtStore::Scaled>(C, ldc, A, lda, BT, ldb, m, n, D, end, store);
    case AbtStore::Exp:
      return abt<AbtStore::Exp>(C, ldc, A, lda, BT, ldb, m, n, D, end, store);
    case AbtStore::SoftmaxGrad:
      return abt<AbtStore::SoftmaxGrad>(C, ldc, A, lda, BT, ldb, m, n, D, end, store);
  }
}

void tile_ab(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb,
             int64_t m, int64_t D, const int64_t* end, bool accumulate) {
  // A's row tiles packed column by column, one after another (a tile of R rows and e
  // columns takes R e floats), then B's [cnt, 16] column panels outside, each staying in L1
  // while the packed rows stream past it.
  static thread_local std::vector<float> at;
  int64_t total = 0;
  by_tiles(m, [&]<int R>(int64_t i0) { total += R * tile_end<R>(end, i0); });
  if (static_cast<int64_t>(at.size()) < total) at.resize(total);
  int64_t at0 = 0;
  by_tiles(m, [&]<int R>(int64_t i0) {
    const int64_t e = tile_end<R>(end, i0);
    float* t = at.data() + at0;
    for (int64_t j = 0; j < e; ++j)
      for (int i = 0; i < R; ++i) t[j * R + i] = A[(i0 + i) * lda + j];
    at0 += R * e;
  });
  for (int64_t c0 = 0; c0 < D; c0 += kNR) {
    at0 = 0;
    by_tiles(m, [&]<int R>(int64_t i0) {
      const int64_t e = tile_end<R>(end, i0);
      ab_tile<R>(C + i0 * ldc + c0, ldc, at.data() + at0, B + c0, ldb, e, accumulate);
      at0 += R * e;
    });
  }
}

void tile_atb(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb,
              int64_t n, int64_t D, int64_t m, int64_t segs, int64_t off) {
  // B's [rows, 16] column panels outside (in L1 while A's columns stream past).
  for (int64_t c0 = 0; c0 < D; c0 += kNR)
    by_tiles(n, [&]<int R>(int64_t j0) {
      const int64_t first = std::clamp<int64_t>(j0 - off, 0, m);
      atb_tile<R>(C + j0 * ldc + c0, ldc, A + j0, lda, B + c0, ldb, m, segs, first);
    });
}

}  // namespace loom::kernels
