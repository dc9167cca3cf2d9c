#include "loom/kernels/cpu/attention_tiles.h"

#include <algorithm>
#include <vector>

#include "loom/kernels/cpu/vec_math.h"

namespace loom::kernels {

namespace {
// tile_atb's tiles (and tile_ab's packed ones, AVX2) are R rows x 16 columns or more, kept as
// R x V vectors of kW floats: kMR = 12 rows on AVX-512, 6 on AVX2 (12 accumulators of its 16
// registers; 12 rows there spill). tile_abt's tiles, and tile_ab's on AVX-512, are
// kInPlaceRows = 6 rows read in place (six row offsets fit in registers; twelve did not and
// were packed first); tile_abt's are 2 vectors wide (AVX-512: 32 columns, 12 accumulators, a
// load of B per 3 FMAs where 12 x 16 took 13 loads per 12) or, where a row tile's visible
// keys end within the first, 1.
constexpr int kW = kVecWidth;
constexpr int kMR = kW == 16 ? 12 : 6;
constexpr int kInPlaceRows = 6;
constexpr int64_t kNR = 16;
constexpr int kV = kNR / kW;
// tile_ab and tile_atb's tiles span kWide of the head dimension's columns where D has them
// (2 x kW: AVX-512's 12 x 2 zmm reuse each broadcast of A twice), else 16.
constexpr int64_t kWide = 2 * kW;

// f.template operator()<R>(i0) for the remainder tile of R rows, R from 1 to kMR - 1.
template <int R, class F>
void tail_tile(int64_t rows, int64_t i0, F& f) {
  if constexpr (R > 0) {
    if (rows == R)
      f.template operator()<R>(i0);
    else
      tail_tile<R - 1>(rows, i0, f);
  }
}

// f.template operator()<R>(i0) over [0, total) in tiles of MR, the last one R < MR.
template <int MR = kMR, class F>
void by_tiles(int64_t total, F&& f) {
  int64_t i0 = 0;
  for (; i0 + MR <= total; i0 += MR) f.template operator()<MR>(i0);
  tail_tile<MR - 1>(total - i0, i0, f);
}

template <int R>
int64_t tile_end(const int64_t* end, int64_t i0) {
  int64_t e = 0;
  for (int i = 0; i < R; ++i) e = std::max(e, end[i0 + i]);
  return e;
}

// The three register tiles below keep R x V accumulators (at R = kMR: 12 on AVX2, 12 or 24
// of AVX-512's 32), started at zero; C is read, where they accumulate, only in the store
// (loading it into the accumulators first made GCC keep them on the stack).

// C[R, V kW] (= | +=) the accumulators.
template <int R, int V>
inline void store_tile(float* C, int64_t ldc, const vf (&acc)[R][V], bool accumulate) {
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < V; ++v) {
      float* c = C + i * ldc + v * kW;
      storev(c, accumulate ? acc[i][v] + loadv(c) : acc[i][v]);
    }
}

// Row i's V kW (or `cols`) products x of a tile, stored into c as `st` says (columns j0..).
template <AbtStore::Kind K, int V>
inline void store_row(float* c, const float* x, int64_t cols, int64_t i, int64_t j0,
                      const int64_t* end, const AbtStore& st) {
  const float alpha = st.alpha;
  if constexpr (K == AbtStore::SoftmaxGrad) {
    const float* p = st.P + i * st.ldp + j0;
    const float d = st.d[i];
#pragma omp simd
    for (int64_t k = 0; k < cols; ++k) c[k] = p[k] * (x[k] - d) * alpha;
    return;
  }
  // Columns of a strip or block number far below 2^31; lane l of j is column j0 + v kW + l.
  const auto lo = static_cast<int32_t>(st.first[i]), hi = static_cast<int32_t>(end[i]),
             always = static_cast<int32_t>(st.always);
  vi j = lane_index() + static_cast<int32_t>(j0);
  auto visible = [&] { return (j < always) | ((j >= lo) & (j < hi)); };
  float y[V * kW];
  if constexpr (K == AbtStore::Scaled) {
    vf mx = loadv(st.rowmax + i * kW);
    for (int v = 0; v < V; ++v, j += kW) {
      const vf s = alpha * loadv(x + v * kW);
      storev(y + v * kW, s);
      mx = visible() & (s > mx) ? s : mx;
    }
    storev(st.rowmax + i * kW, mx);
  } else {
    const float shift = st.shift[i];
    for (int v = 0; v < V; ++v, j += kW) {
      const vf p = vexp(alpha * loadv(x + v * kW) - shift);
      storev(y + v * kW, visible() ? p : vf{});
    }
  }
  if (cols == V * kW)
    for (int v = 0; v < V; ++v) storev(c + v * kW, loadv(y + v * kW));
  else
    for (int64_t k = 0; k < cols; ++k) c[k] = y[k];
}

// C[R, cols] = store(A[R, :D] BT[:D, V kW]) (cols <= V kW stored), rows i0.. of the block,
// A's rows read in place (lda apart).
template <AbtStore::Kind K, int R, int V>
void abt_tile(float* C, int64_t ldc, const float* A, int64_t lda, const float* BT, int64_t ldb,
              int64_t D, int64_t cols, int64_t i0, int64_t j0, const int64_t* end,
              const AbtStore& st) {
  vf acc[R][V] = {};
  for (int64_t c = 0; c < D; ++c) {
    vf b[V];
    for (int v = 0; v < V; ++v) b[v] = loadv(BT + c * ldb + v * kW);
    for (int i = 0; i < R; ++i)
      for (int v = 0; v < V; ++v) acc[i][v] += A[i * lda + c] * b[v];
  }
  for (int i = 0; i < R; ++i) {
    float x[V * kW];
    for (int v = 0; v < V; ++v) storev(x + v * kW, acc[i][v]);
    store_row<K, V>(C + i * ldc, x, cols, i0 + i, j0, end, st);
  }
}

// A's row tiles (by_tiles over m rows), each packed column by column for its first
// cols(R, i0) columns, one after another in this thread's buffer; offsets[t] is tile t's
// start. The tiles then walk one pointer through A: with a tile's R rows read in place GCC
// ran out of registers for their offsets and reloaded them from the stack every step.
template <class Cols>
const float* pack_row_tiles(const float* A, int64_t lda, int64_t m, Cols&& cols,
                            std::vector<int64_t>& offsets) {
  static thread_local std::vector<float> at;
  offsets.clear();
  int64_t total = 0;
  by_tiles(m, [&]<int R>(int64_t i0) {
    offsets.push_back(total);
    total += R * cols.template operator()<R>(i0);
  });
  if (static_cast<int64_t>(at.size()) < total) at.resize(total);
  int64_t t = 0;
  by_tiles(m, [&]<int R>(int64_t i0) {
    float* dst = at.data() + offsets[t++];
    const int64_t e = cols.template operator()<R>(i0);
    for (int64_t j = 0; j < e; ++j)
      for (int i = 0; i < R; ++i) dst[j * R + i] = A[(i0 + i) * lda + j];
  });
  return at.data();
}

template <AbtStore::Kind K>
void abt(float* C, int64_t ldc, const float* A, int64_t lda, const float* BT, int64_t ldb,
         int64_t m, int64_t n, int64_t D, const int64_t* end, const AbtStore& store) {
  // Column panels outside: BT's [D, 2 kW] panel (8 KiB at D = 64 on AVX-512) stays in L1
  // while A's rows stream past it (rows before columns read every panel from L2 for every 6
  // rows). A row tile's columns run to its last visible one rounded up to kW: a 2-vector tile
  // reads BT's columns to j0 + 2 kW only where more than kW of them are left, so never past
  // n rounded up to 16.
  int64_t e = 0;
  for (int64_t i = 0; i < m; ++i) e = std::max(e, end[i]);
  for (int64_t j0 = 0; j0 < std::min(n, e); j0 += 2 * kW) {
    by_tiles<kInPlaceRows>(m, [&]<int R>(int64_t i0) {
      const int64_t left = std::min(n, tile_end<R>(end, i0)) - j0;
      float* c = C + i0 * ldc + j0;
      const float* a = A + i0 * lda;
      if (left > kW)
        abt_tile<K, R, 2>(c, ldc, a, lda, BT + j0, ldb, D, std::min<int64_t>(2 * kW, n - j0), i0,
                          j0, end, store);
      else if (left > 0)
        abt_tile<K, R, 1>(c, ldc, a, lda, BT + j0, ldb, D, std::min<int64_t>(kW, n - j0), i0, j0,
                          end, store);
    });
  }
  // Past each row tile's last column tile, every row's columns are masked: 0.
  by_tiles<kInPlaceRows>(m, [&]<int R>(int64_t i0) {
    const int64_t from = std::min(n, (tile_end<R>(end, i0) + kW - 1) / kW * kW);
    for (int64_t i = i0; i < i0 + R; ++i) std::fill(C + i * ldc + from, C + i * ldc + n, 0.0f);
  });
}

// C[R, V kW] (= | +=) At[:cnt, R]^T B[:cnt, V kW]: At is the row tile of A packed column by
// column (pack_row_tiles).
template <int R, int V>
void ab_tile(float* C, int64_t ldc, const float* At, const float* B, int64_t ldb, int64_t cnt,
             bool accumulate) {
  vf acc[R][V] = {};
  for (int64_t j = 0; j < cnt; ++j, At += R, B += ldb) {
    vf b[V];
    for (int v = 0; v < V; ++v) b[v] = loadv(B + v * kW);
    for (int i = 0; i < R; ++i)
      for (int v = 0; v < V; ++v) acc[i][v] += At[i] * b[v];
  }
  store_tile<R, V>(C, ldc, acc, accumulate);
}

// C[R, V kW] (= | +=) A[R, :cnt] B[:cnt, V kW], A's R rows read in place (lda apart).
template <int R, int V>
void ab_rows_tile(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb,
                  int64_t cnt, bool accumulate) {
  vf acc[R][V] = {};
  for (int64_t j = 0; j < cnt; ++j, ++A, B += ldb) {
    vf b[V];
    for (int v = 0; v < V; ++v) b[v] = loadv(B + v * kW);
    for (int i = 0; i < R; ++i)
      for (int v = 0; v < V; ++v) acc[i][v] += A[i * lda] * b[v];
  }
  store_tile<R, V>(C, ldc, acc, accumulate);
}

// C[R, V kW] += A[rows, R]^T B[rows, V kW], rows [s m + first, s m + m) of each segment s.
template <int R, int V>
void atb_tile(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb,
              int64_t m, int64_t segs, int64_t first) {
  vf acc[R][V] = {};
  for (int64_t s = 0; s < segs; ++s) {
    const float* a = A + (s * m + first) * lda;
    const float* b = B + (s * m + first) * ldb;
    for (int64_t i = first; i < m; ++i, a += lda, b += ldb) {
      vf bv[V];
      for (int v = 0; v < V; ++v) bv[v] = loadv(b + v * kW);
      for (int j = 0; j < R; ++j)
        for (int v = 0; v < V; ++v) acc[j][v] += a[j] * bv[v];
    }
  }
  store_tile<R, V>(C, ldc, acc, true);
}

// f.template operator()<V>(c0) over D's columns in panels of kWide, then of 16.
template <class F>
void by_panels(int64_t D, F&& f) {
  int64_t c0 = 0;
  for (; c0 + kWide <= D; c0 += kWide) f.template operator()<kWide / kW>(c0);
  for (; c0 < D; c0 += kNR) f.template operator()<kV>(c0);
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
  if constexpr (kW == 16) {
    // AVX-512: tiles of 6 rows x 64 columns (24 accumulators; each broadcast of A used four
    // times, each row of B six), A read in place: six row offsets fit in registers, so the
    // packing pass below (8% of the forward at T = 256) goes. The sums are the packed
    // tiles' bit for bit: each element adds its terms in column order either way, and the
    // columns a tile of 12 adds past a row's end are zeros.
    int64_t c0 = 0;
    auto panel = [&]<int V>() {
      by_tiles<kInPlaceRows>(m, [&]<int R>(int64_t i0) {
        ab_rows_tile<R, V>(C + i0 * ldc + c0, ldc, A + i0 * lda, lda, B + c0, ldb,
                           tile_end<R>(end, i0), accumulate);
      });
    };
    for (; c0 + 4 * kW <= D; c0 += 4 * kW) panel.template operator()<4>();
    for (; c0 < D; c0 += kW) panel.template operator()<1>();
    return;
  }
  // A's row tiles packed column by column, one after another (a tile of R rows and e
  // columns takes R e floats), then B's [cnt, 16] column panels outside, each staying in L1
  // while the packed rows stream past it.
  static thread_local std::vector<int64_t> offsets;
  const float* at = pack_row_tiles(
      A, lda, m, [end]<int R>(int64_t i0) { return tile_end<R>(end, i0); }, offsets);
  by_panels(D, [&]<int V>(int64_t c0) {
    int64_t t = 0;
    by_tiles(m, [&]<int R>(int64_t i0) {
      ab_tile<R, V>(C + i0 * ldc + c0, ldc, at + offsets[t++], B + c0, ldb, tile_end<R>(end, i0),
                    accumulate);
    });
  });
}

void tile_atb(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb,
              int64_t n, int64_t D, int64_t m, int64_t segs, int64_t off) {
  // B's [rows, 16] column panels outside (in L1 while A's columns stream past).
  by_panels(D, [&]<int V>(int64_t c0) {
    by_tiles(n, [&]<int R>(int64_t j0) {
      const int64_t first = std::clamp<int64_t>(j0 - off, 0, m);
      atb_tile<R, V>(C + j0 * ldc + c0, ldc, A + j0, lda, B + c0, ldb, m, segs, first);
    });
  });
}

}  // namespace loom::kernels
