// The products inside one attention strip (kernels/cpu/attention.cpp), register-tiled for
// its shapes: a few hundred query rows against the keys they may see, with a head
// dimension D that is a multiple of 16 (attention pads its packed copies to one). BLAS ran
// these at T = 256 with a quarter of its time in packing and in zeroing C before a beta-0
// product; these read the caller's packed operands as they are, and every row tile stops at
// the last key its rows may see, so most of the causal block's masked half is never computed.
// Row-major; tiles of 6 rows x 16 columns on AVX2; on AVX-512 tile_abt's are 6 x 32 (or 16),
// tile_ab's 6 x 64 and tile_atb's 12 x 32, the head dimension allowing. end[i] (<= n) is the
// number of leading key columns row i may see.
//   tile_abt: C[i, j] = store(A[i, :D] . BT[:D, j]) for j < end[i], and 0 from where its
//             row tile's last column tile ends (BT [D, ldb], ldb >= n rounded up to 16, the
//             padding readable); columns in between are stored too, as store gives them.
//   tile_ab : C[i, :D] (= | +=) sum_{j < end[i]} A[i, j] B[j, :D]; A's columns from end[i]
//             to its tile's end must be 0
//   tile_atb: C[j, :D] += sum_i A[i, j] B[i, :D], i over `segs` segments of m rows; in each,
//             row i may see column j only if i >= j - off (causal), so earlier rows are skipped
// Every element is summed in a fixed order.
#pragma once

#include <cstdint>

namespace loom::kernels {

// What tile_abt stores for x = A[i] . BT[:, j]. The fused forms save the backward a pass
// over the [rows, keys] block each.
struct AbtStore {
  enum Kind {
    Scaled,       // alpha x, each visible one (as for Exp) also maxed into its lane of
                  // row i's maxima (rowmax [rows, kVecWidth])
    Exp,          // the probability again: exp(alpha x - shift[i]) where column j is
                  // visible (j < always, or first[i] <= j < end[i]), else 0
    SoftmaxGrad,  // dS = P[i, j] (x - d[i]) alpha (P [rows, ldp]: 0 where not visible)
  } kind = Scaled;
  float alpha = 1.0f;
  const float* shift = nullptr;
  const int64_t* first = nullptr;
  int64_t always = 0;
  const float* P = nullptr;
  int64_t ldp = 0;
  const float* d = nullptr;
  float* rowmax = nullptr;
};

void tile_abt(float* C, int64_t ldc, const float* A, int64_t lda, const float* BT, int64_t ldb,
              int64_t m, int64_t n, int64_t D, const int64_t* end, const AbtStore& store);
void tile_ab(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb,
             int64_t m, int64_t D, const int64_t* end, bool accumulate);
void tile_atb(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb,
              int64_t n, int64_t D, int64_t m, int64_t segs, int64_t off);

}  // namespace loom::kernels
