#include "loom/kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "loom/kernels/cpu/attention_tiles.h"
#include "loom/kernels/cpu/vec_math.h"
#include "loom/util/profile.h"

namespace loom::kernels {

namespace {
// Query rows per strip (per head: GQA stacks a group's heads, 192 rows for SmolLM2).
constexpr int64_t kRows = 64;

// First key position token t of row b may attend to: its packed sample's start.
inline int64_t first_key(const AttnDims& d, int64_t b, int64_t t) {
  if (!d.pos) return 0;
  const int64_t p = d.pos[b * d.T + t];
  return p <= t ? t - p : 0;
}

// m query rows of `heads` heads of one KV group (stacked: head 1's m rows after head 0's)
// and the keys they may see: P prefix rows (columns [0, P) of the strip's score block),
// then n key rows starting at key position k0 (columns [P, P + n)); row r sees key columns
// lo[r % m]..hi[r % m] of those n (inclusive) and every prefix column.
struct Strip {
  const float *q, *k, *v, *pk, *pv;
  int64_t qs, kvs, ps;  // row strides of q, k/v, the prefix
  int64_t m, heads, n, P, HD, k0;
  int64_t lo[kRows], hi[kRows];
  int64_t rows() const { return m * heads; }
  int64_t width() const { return P + n; }
};

// The strip of training rows t0.. of head h in batch row b.
Strip training_strip(const AttnDims& d, const float* q, const float* k, const float* v, int64_t b,
                     int64_t h, int64_t t0, int64_t heads) {
  const int64_t g = h / (d.NH / d.NKV);
  Strip s{};
  s.m = std::min(kRows, d.T - t0);
  s.heads = heads;
  s.k0 = t0;
  for (int64_t i = 0; i < s.m; ++i) s.k0 = std::min(s.k0, first_key(d, b, t0 + i));
  s.n = t0 + s.m - s.k0;
  for (int64_t i = 0; i < s.m; ++i) {
    s.lo[i] = first_key(d, b, t0 + i) - s.k0;
    s.hi[i] = t0 + i - s.k0;
  }
  s.q = q + (b * d.T + t0) * d.q_stride + h * d.HD;
  s.k = k + (b * d.T + s.k0) * d.kv_stride + g * d.HD;
  s.v = v + (b * d.T + s.k0) * d.kv_stride + g * d.HD;
  s.qs = d.q_stride;
  s.kvs = d.kv_stride;
  s.P = d.P;
  if (d.P > 0) {
    s.pk = d.prefix_k + g * d.HD;
    s.pv = d.prefix_v + g * d.HD;
    s.ps = d.prefix_stride;
  }
  s.HD = d.HD;
  return s;
}

// Strip s with its window widened to every key of its batch row b (KV group g): the keys a
// task packs once when its strips' windows are runs of them.
Strip whole_window(const Strip& s, const AttnDims& d, const float* k, const float* v, int64_t b,
                   int64_t g) {
  Strip all = s;
  all.k0 = 0;
  all.n = d.T;
  all.k = k + b * d.T * d.kv_stride + g * d.HD;
  all.v = v + b * d.T * d.kv_stride + g * d.HD;
  return all;
}

// Row x of a strip's scores, columns [0, to): every prefix column (j < P) and key columns
// [lo, hi] (lo, hi counted from column 0) are visible; each becomes exp(x - shift), the rest
// 0; returns the visible ones' sum. `to` is the visible span rounded up to 16, inside the
// row's padded stride, so there is no scalar tail; the masked lanes' values are never used.
// Column indices are 32-bit so that the mask costs one vector compare per lane group on AVX2.
[[gnu::noinline]] float exp_visible(float* __restrict x, int32_t to, int32_t P, int32_t lo,
                                    int32_t hi, float shift) {
  vf sum{};
  vi j = lane_index();
  for (int32_t j0 = 0; j0 < to; j0 += kVecWidth, j += kVecWidth) {
    const vf e = vexp(loadv(x + j0) - shift);
    const vf kept = (j < P) | ((j >= lo) & (j <= hi)) ? e : vf{};
    storev(x + j0, kept);
    sum += kept;
  }
  return hsum(sum);
}

// Row r of a strip's stacked rows (m rows per head) is token row r % m of head r / m: in a
// token-major buffer (row stride ld, heads HD apart) it starts at this offset.
inline int64_t stacked_at(int64_t r, int64_t m, int64_t ld, int64_t HD) {
  return (r % m) * ld + (r / m) * HD;
}

inline int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// The row loops over q, out, dO, dq and dk/dv (packing, the output's and the gradients'
// writes, rowsum(dO o O)) touch each row kAhead rows early (prefetch_row): they visit one
// head's HD floats of rows 1-9 KiB apart, which the hardware prefetchers do not follow, and
// from L3 every row was a stall (forward and backward each ~3% faster at T = 256).
constexpr int64_t kAhead = 8;
inline void prefetch_row(const float* p, int64_t n, bool write) {
  for (int64_t c = 0; c < n; c += 16) {
    if (write)
      __builtin_prefetch(p + c, 1, 3);
    else
      __builtin_prefetch(p + c, 0, 3);
  }
}

// Score columns per block (forward's P V, all of backward): P and dS [192, 256] (GQA's
// three heads stacked) take 400 KiB, within a Zen 3 core's 512 KiB L2; whole rows at
// T = 1024 (1.6 MB) did not fit.
constexpr int64_t kKeyBlock = 256;
// Row stride of the transposed keys [D, P + n] and of the scores [rows, P + n]: rounded up
// to the tiles' 16 columns, plus 16 so that the rows a tile reads are not 1 or 4 KiB apart
// (at a stride of 256 or 1024 floats they fall in a few L1 sets and evict each other).
inline int64_t key_ld(int64_t w) { return round16(w) + 16; }

// One thread's packed copies of a strip's operands (attention_tiles.h reads them as they
// are): rows padded from HD to D = HD rounded up to 16 with zeros, the strip's rows stacked
// (Qs, dOs: [rows, D]), its P + n key/value rows in the score columns' order (prefix, then
// the window: Kp, Vp [w, D]) and transposed (KT, VT [D, key_ld(w)], the padding zero).
struct Work {
  int64_t D = 0;
  std::vector<float> S, dS, Qs, dOs, Os, KT, VT, Kp, Vp, dKs, dVs;
  std::vector<float> tKT, tVT, tKp, tVp;  // a whole task's keys and values (forward: tKT, tVp)
  std::vector<float> tdK, tdV;            // and their gradients, [P + T, D]
  std::vector<int64_t> end;               // per row: the score columns it may see (prefix + to hi)
  std::vector<int64_t> first;      // per row: its first visible column (backward: in the block)
  std::vector<int64_t> block_end;  // end within a block of kKeyBlock columns
  std::vector<float> inv;          // forward: 1 / each row's sum of exponentials
  std::vector<float> rowmax;       // forward: each row's largest visible score, by lane
};

// This thread's Work, grown (never shrunk) to strips of `rows` rows and w score columns:
// kept between calls, so a step's 60 attention calls do not map and fault in fresh pages
// (1.3 MB a thread at T = 256) every time.
Work& work(int64_t rows, int64_t w, int64_t HD, bool backward) {
  static thread_local Work wk;
  auto grow = [](auto& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  };
  wk.D = round16(HD);
  const int64_t D = wk.D, bw = std::min(w, kKeyBlock);
  grow(wk.S, rows * key_ld(backward ? bw : w));
  grow(wk.Qs, rows * D);
  grow(wk.Os, rows * D);
  grow(wk.KT, D * key_ld(w));
  grow(wk.tKT, D * key_ld(w));
  grow(wk.end, rows);
  grow(wk.first, rows);
  grow(wk.block_end, rows);
  if (!backward) {
    grow(wk.Vp, w * D);
    grow(wk.tVp, w * D);
    grow(wk.inv, rows);
    grow(wk.rowmax, rows * kVecWidth);
  } else {
    grow(wk.dS, rows * key_ld(bw));
    grow(wk.dOs, rows * D);
    grow(wk.VT, D * key_ld(w));
    grow(wk.tVT, D * key_ld(w));
    grow(wk.Kp, w * D);
    grow(wk.tKp, w * D);
    grow(wk.dKs, w * D);
    grow(wk.dVs, w * D);
    grow(wk.tdK, w * D);
    grow(wk.tdV, w * D);
  }
  return wk;
}

// dst[r, :D] = the strip's stacked row r of src (row stride ld), zero padded.
void pack_rows(float* dst, int64_t D, const float* src, int64_t ld, int64_t m, int64_t heads,
               int64_t HD) {
  for (int64_t r = 0; r < heads * m; ++r) {
    if (r + kAhead < heads * m) prefetch_row(src + stacked_at(r + kAhead, m, ld, HD), HD, false);
    const float* x = src + stacked_at(r, m, ld, HD);
    float* y = dst + r * D;
    for (int64_t c = 0; c < HD; ++c) y[c] = x[c];
    for (int64_t c = HD; c < D; ++c) y[c] = 0.0f;
  }
}

// Lanes of a and b mixed for one step of an in-register transpose (transpose_block): lane l
// of the first result is a's l where bit H of l is clear, else b's l - H; of the second,
// a's l + H where clear, else b's l.
template <int H, size_t... L>
inline void swap_blocks(vf& a, vf& b, std::index_sequence<L...>) {
  const vf lo = __builtin_shufflevector(a, b, ((L & H) ? kVecWidth + L - H : L)...);
  const vf hi = __builtin_shufflevector(a, b, ((L & H) ? kVecWidth + L : L + H)...);
  a = lo;
  b = hi;
}

// m[i][j] becomes m[j][i] (kVecWidth x kVecWidth): swaps of the off-diagonal blocks of
// half, a quarter, ... the width, each a pair of two-vector shuffles per pair of rows.
template <int H = kVecWidth / 2>
inline void transpose_block(vf (&m)[kVecWidth]) {
  for (int i = 0; i < kVecWidth; ++i)
    if ((i & H) == 0) swap_blocks<H>(m[i], m[i + H], std::make_index_sequence<kVecWidth>());
  if constexpr (H > 1) transpose_block<H / 2>(m);
}

// The strip's key (or value) rows in score-column order: the P prefix rows, then the
// window's n rows; as rows dst[w, D] or, transposed, dstT[D, ldk].
void pack_keys(float* dst, float* dstT, int64_t D, const Strip& s, const float* prefix,
               const float* keys) {
  const int64_t w = s.width(), ldk = key_ld(w), HD = s.HD;
  auto row = [&](int64_t j) { return j < s.P ? prefix + j * s.ps : keys + (j - s.P) * s.kvs; };
  if (dst)
    for (int64_t j = 0; j < w; ++j) {
      const float* src = row(j);
      float* y = dst + j * D;
      for (int64_t c = 0; c < HD; ++c) y[c] = src[c];
      for (int64_t c = HD; c < D; ++c) y[c] = 0.0f;
    }
  if (!dstT) return;
  // Blocks of kVecWidth rows x kVecWidth columns transposed in registers (a scalar gather
  // per element took 7% of the forward at T = 256); rows past w and columns past HD read as
  // zeros, so the padding is finite.
  constexpr int kB = kVecWidth;
  for (int64_t j0 = 0; j0 < w; j0 += kB) {
    const float* src[kB];
    for (int jj = 0; jj < kB; ++jj) src[jj] = j0 + jj < w ? row(j0 + jj) : nullptr;
    for (int64_t c0 = 0; c0 < D; c0 += kB) {
      vf m[kB];
      for (int jj = 0; jj < kB; ++jj) {
        if (!src[jj] || c0 >= HD) {
          m[jj] = vf{};
        } else if (c0 + kB <= HD) {
          m[jj] = loadv(src[jj] + c0);
        } else {
          float part[kB] = {};
          for (int64_t c = c0; c < HD; ++c) part[c - c0] = src[jj][c];
          m[jj] = loadv(part);
        }
      }
      transpose_block(m);
      for (int cc = 0; cc < kB; ++cc) storev(dstT + (c0 + cc) * ldk + j0, m[cc]);
    }
  }
  const int64_t from = (w + kB - 1) / kB * kB;  // the padding columns: read by the tiles
  for (int64_t c = 0; c < D; ++c) std::fill(dstT + c * ldk + from, dstT + c * ldk + ldk, 0.0f);
}

// One strip's forward: its stacked rows of out (out: the strip's first row, row stride ldo)
// and, when lse is non-null, their lse (head j's m values at lse + j * lse_head).
// One strip's forward: its stacked rows of out (out: the strip's first row, row stride ldo)
// and, when lse is non-null, their lse (head j's m values at lse + j * lse_head). KT [D, ldk]
// and Vp [w, D]: its keys and values packed in score-column order (pack_keys).
void forward_strip(float* out, int64_t ldo, float* lse, int64_t lse_head, const Strip& s,
                   const float* KT, int64_t ldk, const float* Vp, Work& wk, float scale) {
  const int64_t R = s.rows(), w = s.width(), D = wk.D, m = s.m;
  pack_rows(wk.Qs.data(), D, s.q, s.qs, m, s.heads, s.HD);
  for (int64_t r = 0; r < R; ++r) {
    wk.end[r] = s.P + s.hi[r % m] + 1;
    wk.first[r] = s.P + s.lo[r % m];
  }
  std::fill_n(wk.rowmax.data(), R * kVecWidth, -INFINITY);
  float* S = wk.S.data();
  const int64_t ls = key_ld(w);  // S's row stride: off a power of two, as the keys'
  // The scores, each row's visible maximum taken as they are stored.
  tile_abt(S, ls, wk.Qs.data(), D, KT, ldk, R, w, D, wk.end.data(),
           {.alpha = scale, .first = wk.first.data(), .always = s.P, .rowmax = wk.rowmax.data()});
  for (int64_t r = 0; r < R; ++r) {
    float* row = S + r * ls;
    const int64_t i = r % m;
    // A strip's columns (prefix + window) number far below 2^31.
    const auto P = static_cast<int32_t>(s.P), lo = static_cast<int32_t>(s.P + s.lo[i]),
               hi = static_cast<int32_t>(s.P + s.hi[i]), to = static_cast<int32_t>(round16(hi + 1));
    float mx = -INFINITY;
    for (int l = 0; l < kVecWidth; ++l) mx = std::max(mx, wk.rowmax[r * kVecWidth + l]);
    const float sum = exp_visible(row, to, P, lo, hi, mx);
    if (to < w) std::fill(row + to, row + w, 0.0f);
    wk.inv[r] = 1.0f / sum;
    if (lse) lse[r / m * lse_head + i] = mx + std::log(sum);
  }
  // out = softmax(S) [PV; V]: the unnormalised exponentials times V by blocks of columns,
  // each row then scaled.
  for (int64_t c0 = 0; c0 < w; c0 += kKeyBlock) {
    const int64_t cw = std::min(kKeyBlock, w - c0);
    int64_t* end = wk.block_end.data();
    for (int64_t r = 0; r < R; ++r) end[r] = std::clamp<int64_t>(wk.end[r] - c0, 0, cw);
    tile_ab(wk.Os.data(), D, S + c0, ls, Vp + c0 * D, D, R, D, end, c0 > 0);
  }
  for (int64_t r = 0; r < R; ++r) {
    if (r + kAhead < R) prefetch_row(out + stacked_at(r + kAhead, m, ldo, s.HD), s.HD, true);
    float* o = out + stacked_at(r, m, ldo, s.HD);
    const float* src = wk.Os.data() + r * D;
    const float inv = wk.inv[r];
#pragma omp simd
    for (int64_t c = 0; c < s.HD; ++c) o[c] = src[c] * inv;
  }
}

// A backward strip's keys and values in score-column order: the keys as rows Kp [w, D] (for
// dQ = dS K) and transposed KT [D, ldk], the values transposed VT [D, ldk] (no product reads
// them as rows).
struct KeyPack {
  const float *KT, *VT, *Kp;
  int64_t ldk;
  float *dK, *dV;  // [w, D]: the strip's key/value gradients are added here, in that order
};

// Where a backward task's gradients are added: dq (set per strip to its first row, row
// stride ldq, rows stacked as the strip's), the key/value rows from position 0 (stride
// ldkv), the prefix's P rows (stride ldp; null: no prefix gradients).
struct StripGrads {
  float *dq, *dk, *dv, *dpk, *dpv;
  int64_t ldq, ldkv, ldp;
};

// One strip's backward. dO: the strip's output gradient (its first row, row stride ldo,
// stacked as its rows); l, Dr: each row's lse and rowsum(dO o O).
void backward_strip(const Strip& s, const float* dO, int64_t ldo, const float* l, const float* Dr,
                    const StripGrads& g, const KeyPack& kp, Work& wk, float scale) {
  const int64_t R = s.rows(), w = s.width(), D = wk.D, m = s.m, ldk = kp.ldk, P = s.P;
  pack_rows(wk.Qs.data(), D, s.q, s.qs, m, s.heads, s.HD);
  pack_rows(wk.dOs.data(), D, dO, ldo, m, s.heads, s.HD);
  for (int64_t r = 0; r < R; ++r) wk.end[r] = P + s.hi[r % m] + 1;
  float *Pr = wk.S.data(), *dS = wk.dS.data();
  // Row i of a head's m rows sees window column j only if i >= j - (n - m).
  const int64_t off = P + s.n - m;
  // By blocks of kKeyBlock score columns (everything below is per column but dQ's sum), so
  // that P and dS [rows, block] stay in L2 at any T.
  for (int64_t c0 = 0; c0 < w; c0 += kKeyBlock) {
    const int64_t cw = std::min(kKeyBlock, w - c0);
    int64_t* end = wk.block_end.data();
    for (int64_t r = 0; r < R; ++r) end[r] = std::clamp<int64_t>(wk.end[r] - c0, 0, cw);
    for (int64_t r = 0; r < R; ++r) wk.first[r] = P + s.lo[r % m] - c0;
    // The probabilities again, exp(scores - lse) (0 where a row may not see), then
    // softmax's backward dS = P (dP - D) / sqrt(HD) from dP = dO [PV; V]^T, with
    // D = rowsum(dO o O) = sum_s P dP; both stored by the tiles as they are computed.
    const int64_t ls = key_ld(cw);  // P's and dS's row stride
    tile_abt(Pr, ls, wk.Qs.data(), D, kp.KT + c0, ldk, R, cw, D, end,
             {.kind = AbtStore::Exp,
              .alpha = scale,
              .shift = l,
              .first = wk.first.data(),
              .always = P - c0});
    tile_abt(dS, ls, wk.dOs.data(), D, kp.VT + c0, ldk, R, cw, D, end,
             {.kind = AbtStore::SoftmaxGrad, .alpha = scale, .P = Pr, .ldp = ls, .d = Dr});
    // [dPV; dV] = P^T dO, [dPK; dK] = dS^T Q, dQ += dS [PK; K].
    tile_atb(kp.dV + c0 * D, D, Pr, ls, wk.dOs.data(), D, cw, D, m, s.heads, off - c0);
    tile_atb(kp.dK + c0 * D, D, dS, ls, wk.Qs.data(), D, cw, D, m, s.heads, off - c0);
    tile_ab(wk.Os.data(), D, dS, ls, kp.Kp + c0 * D, D, R, D, end, c0 > 0);
  }
  for (int64_t r = 0; r < R; ++r) {
    if (r + kAhead < R) prefetch_row(g.dq + stacked_at(r + kAhead, m, g.ldq, s.HD), s.HD, true);
    float* dq = g.dq + stacked_at(r, m, g.ldq, s.HD);
    const float* src = wk.Os.data() + r * D;
#pragma omp simd
    for (int64_t c = 0; c < s.HD; ++c) dq[c] = src[c];
  }
}
}  // namespace

namespace {
float score_scale(float scale, int64_t HD) {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(HD));
}
}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttnDims& d) {
  prof::ScopedPhase ph(prof::Phase::Attention);
  const int64_t T = d.T, HD = d.HD, C = d.NH * HD, group = d.NH / d.NKV;
  const int64_t strips = (T + kRows - 1) / kRows;
  const float scale = score_scale(d.scale, HD);
  // With enough (batch, group) pairs for the threads a task owns one pair, all its strips,
  // and packs its keys and values once (as backward does); otherwise a task is one strip
  // and packs the keys it sees.
  const bool per_pair = d.B * d.NKV >= 2 * omp_get_max_threads();
  const int64_t tasks = per_pair ? 1 : strips, W = d.P + T;
#pragma omp parallel
  {
    // Under GQA the heads of a group share their keys and values: their query rows are
    // stacked ([group * m, D]) so each product runs once per group, group times taller.
    Work& wk = work(group * kRows, W, HD, false);
    // Later strips see more keys: dynamic scheduling evens the threads out.
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t g = 0; g < d.NKV; ++g) {
        for (int64_t task = 0; task < tasks; ++task) {
          const int64_t h0 = g * group;
          bool pair_packed = false;
          const int64_t j0 = per_pair ? 0 : task, j1 = per_pair ? strips : task + 1;
          for (int64_t j = j0; j < j1; ++j) {
            const int64_t t0 = j * kRows;
            const Strip s = training_strip(d, q, k, v, b, h0, t0, group);
            const float *KT = wk.KT.data(), *Vp = wk.Vp.data();
            int64_t ldk = key_ld(s.width());
            if (per_pair && (d.P == 0 || s.k0 == 0)) {
              // The strip's window is a run of the pair's packed keys (prefix, then all T).
              if (!pair_packed) {
                const Strip all = whole_window(s, d, k, v, b, g);
                pack_keys(nullptr, wk.tKT.data(), wk.D, all, all.pk, all.k);
                pack_keys(wk.tVp.data(), nullptr, wk.D, all, all.pv, all.v);
                pair_packed = true;
              }
              const int64_t o = d.P == 0 ? s.k0 : 0;
              KT = wk.tKT.data() + o;
              Vp = wk.tVp.data() + o * wk.D;
              ldk = key_ld(W);
            } else {
              pack_keys(nullptr, wk.KT.data(), wk.D, s, s.pk, s.k);
              pack_keys(wk.Vp.data(), nullptr, wk.D, s, s.pv, s.v);
            }
            forward_strip(out + (b * T + t0) * C + h0 * HD, C, lse + (b * d.NH + h0) * T + t0, T, s,
                          KT, ldk, Vp, wk, scale);
          }
        }
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttnDims& d, float* dprefix_k, float* dprefix_v) {
  prof::ScopedPhase ph(prof::Phase::Attention);
  const int64_t T = d.T, HD = d.HD, C = d.NH * HD, group = d.NH / d.NKV, KVC = d.NKV * HD;
  const int64_t strips = (T + kRows - 1) / kRows, P = d.P;
  const float scale = score_scale(d.scale, HD);
  const bool prefix_grads = P > 0 && dprefix_k && dprefix_v;
  // Under GQA, with enough (batch, group) pairs for the threads, a task owns one KV group of
  // one batch row: its heads' rows stacked as in forward, dk/dv (and the prefix slice) its
  // own. Otherwise a task is one (batch, head), and GQA's heads accumulate their key/value
  // gradients in per-head parts summed per group at the end (MHA's write dk/dv directly).
  const bool stacked = group > 1 && d.B * d.NKV >= 2 * omp_get_max_threads();
  const bool parts = group > 1 && !stacked;
  const int64_t part_kv = d.B * d.NH * T * HD, part_p = prefix_grads ? d.B * d.NH * P * HD : 0;
  // Written whole by the tasks (each head's rows), so not zeroed first.
  const auto part = std::make_unique_for_overwrite<float[]>(parts ? 2 * (part_kv + part_p) : 0);
  float *pdk = part.get(), *pdv = pdk + part_kv, *pdpk = pdv + part_kv, *pdpv = pdpk + part_p;
  const int64_t heads = stacked ? group : 1;  // heads per task
#pragma omp parallel
  {
    Work& wk = work(heads * kRows, P + T, HD, true);
    std::vector<float> l(heads * kRows), D(l.size());  // each row's lse and rowsum(dO o O)
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t u = 0; u < d.NH / heads; ++u) {
        const int64_t h0 = u * heads, g = h0 / group, bh0 = b * d.NH + h0;
        StripGrads sg{};
        if (parts) {
          sg = {nullptr,
                pdk + bh0 * T * HD,
                pdv + bh0 * T * HD,
                prefix_grads ? pdpk + bh0 * P * HD : nullptr,
                prefix_grads ? pdpv + bh0 * P * HD : nullptr,
                d.q_stride,
                HD,
                HD};
        } else {
          sg = {nullptr,
                dk + b * T * d.kv_stride + g * HD,
                dv + b * T * d.kv_stride + g * HD,
                prefix_grads ? dprefix_k + b * P * KVC + g * HD : nullptr,
                prefix_grads ? dprefix_v + b * P * KVC + g * HD : nullptr,
                d.q_stride,
                d.kv_stride,
                KVC};
        }
        bool task_packed = false;
        const int64_t Dw = wk.D, W = P + T;
        std::fill_n(wk.tdK.data(), W * Dw, 0.0f);
        std::fill_n(wk.tdV.data(), W * Dw, 0.0f);
        for (int64_t j = 0; j < strips; ++j) {
          const int64_t t0 = j * kRows;
          const Strip s = training_strip(d, q, k, v, b, h0, t0, heads);
          // A strip's window is a run of the task's keys (prefix, then all T) unless a
          // packed sample starts it past a prefix: those rows are packed once per task.
          KeyPack kp;
          const bool run = P == 0 || s.k0 == 0;
          if (run) {
            if (!task_packed) {
              const Strip all = whole_window(s, d, k, v, b, g);
              pack_keys(wk.tKp.data(), wk.tKT.data(), Dw, all, all.pk, all.k);
              pack_keys(nullptr, wk.tVT.data(), Dw, all, all.pv, all.v);
              task_packed = true;
            }
            const int64_t o = P == 0 ? s.k0 : 0;  // the window's first packed row
            kp = {wk.tKT.data() + o, wk.tVT.data() + o,      wk.tKp.data() + o * Dw,
                  key_ld(W),         wk.tdK.data() + o * Dw, wk.tdV.data() + o * Dw};
          } else {
            pack_keys(wk.Kp.data(), wk.KT.data(), Dw, s, s.pk, s.k);
            pack_keys(nullptr, wk.VT.data(), Dw, s, s.pv, s.v);
            std::fill_n(wk.dKs.data(), s.width() * Dw, 0.0f);
            std::fill_n(wk.dVs.data(), s.width() * Dw, 0.0f);
            kp = {wk.KT.data(),      wk.VT.data(),  wk.Kp.data(),
                  key_ld(s.width()), wk.dKs.data(), wk.dVs.data()};
          }
          const int64_t m = s.m, R = heads * m;
          const float* dO = dout + (b * T + t0) * C + h0 * HD;  // row r: r % m, head r / m
          const float* O = out + (b * T + t0) * C + h0 * HD;
          for (int64_t r = 0; r < R; ++r) {
            if (r + kAhead < R) {
              const int64_t ahead = stacked_at(r + kAhead, m, C, HD);
              prefetch_row(dO + ahead, HD, false);
              prefetch_row(O + ahead, HD, false);
            }
            const int64_t at = stacked_at(r, m, C, HD);
            l[r] = lse[(bh0 + r / m) * T + t0 + r % m];
            float dsum = 0.0f;
#pragma omp simd reduction(+ : dsum)
            for (int64_t c = 0; c < HD; ++c) dsum += dO[at + c] * O[at + c];
            D[r] = dsum;
          }
          sg.dq = dq + (b * T + t0) * d.q_stride + h0 * HD;
          backward_strip(s, dO, C, l.data(), D.data(), sg, kp, wk, scale);
          if (!run)  // the strip's own rows: prefix, then the window from k0
            for (int64_t r = 0; r < s.width(); ++r) {
              const int64_t at = (r < P ? r : P + s.k0 + r - P) * Dw;
              for (int64_t c = 0; c < Dw; ++c) {
                wk.tdK[at + c] += wk.dKs[r * Dw + c];
                wk.tdV[at + c] += wk.dVs[r * Dw + c];
              }
            }
        }
        // The task's key/value gradients, written once: prefix rows, then the T keys.
        for (int64_t r = 0; r < W; ++r) {
          if (r >= P && r + kAhead < W) {
            prefetch_row(sg.dk + (r + kAhead - P) * sg.ldkv, HD, true);
            prefetch_row(sg.dv + (r + kAhead - P) * sg.ldkv, HD, true);
          }
          float *dkr, *dvr;
          if (r < P) {
            if (!sg.dpk) continue;
            dkr = sg.dpk + r * sg.ldp;
            dvr = sg.dpv + r * sg.ldp;
          } else {
            dkr = sg.dk + (r - P) * sg.ldkv;
            dvr = sg.dv + (r - P) * sg.ldkv;
          }
          const float *a = wk.tdK.data() + r * Dw, *c = wk.tdV.data() + r * Dw;
#pragma omp simd
          for (int64_t i = 0; i < HD; ++i) {
            dkr[i] = a[i];
            dvr[i] = c[i];
          }
        }
      }
    }
    if (parts) {
      // Each group's heads summed into dk/dv (and the batch row's prefix slices).
#pragma omp for collapse(2) schedule(static)
      for (int64_t b = 0; b < d.B; ++b) {
        for (int64_t g = 0; g < d.NKV; ++g) {
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            const int64_t bh = b * d.NH + h;
            const bool first = h == g * group;  // the group's first head writes, the rest add
            for (int64_t t = 0; t < T; ++t) {
              float* dkt = dk + (b * T + t) * d.kv_stride + g * HD;
              float* dvt = dv + (b * T + t) * d.kv_stride + g * HD;
              const float *a = pdk + (bh * T + t) * HD, *c = pdv + (bh * T + t) * HD;
#pragma omp simd
              for (int64_t i = 0; i < HD; ++i) {
                dkt[i] = first ? a[i] : dkt[i] + a[i];
                dvt[i] = first ? c[i] : dvt[i] + c[i];
              }
            }
            for (int64_t j = 0; prefix_grads && j < P; ++j) {
              float* dpk = dprefix_k + (b * P + j) * KVC + g * HD;
              float* dpv = dprefix_v + (b * P + j) * KVC + g * HD;
              const float *a = pdpk + (bh * P + j) * HD, *c = pdpv + (bh * P + j) * HD;
#pragma omp simd
              for (int64_t i = 0; i < HD; ++i) {
                dpk[i] = first ? a[i] : dpk[i] + a[i];
                dpv[i] = first ? c[i] : dpv[i] + c[i];
              }
            }
          }
        }
      }
    }
  }
}

void attention_forward_cached(float* out, const float* q, const float* kc, const float* vc,
                              int64_t n, int64_t past, int64_t NH, int64_t NKV, int64_t HD,
                              int64_t q_stride, int64_t kv_stride, float scale_in) {
  prof::ScopedPhase ph(prof::Phase::Attention);
  const int64_t group = NH / NKV, C = NH * HD, strips = (n + kRows - 1) / kRows;
  const float scale = score_scale(scale_in, HD);
#pragma omp parallel
  {
    Work& wk = work(group * kRows, past + n, HD, false);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t j = 0; j < strips; ++j) {
      for (int64_t g = 0; g < NKV; ++g) {
        // Queries i0.. sit at positions past + i0.. and see cache rows [0, past + i]; the
        // group's heads stacked, as in training.
        const int64_t i0 = j * kRows, h0 = g * group;
        Strip s{};
        s.m = std::min(kRows, n - i0);
        s.heads = group;
        s.n = past + i0 + s.m;
        for (int64_t i = 0; i < s.m; ++i) {
          s.lo[i] = 0;
          s.hi[i] = past + i0 + i;
        }
        s.q = q + i0 * q_stride + h0 * HD;
        s.k = kc + g * HD;
        s.v = vc + g * HD;
        s.qs = q_stride;
        s.kvs = kv_stride;
        s.HD = HD;
        pack_keys(nullptr, wk.KT.data(), wk.D, s, s.pk, s.k);
        pack_keys(wk.Vp.data(), nullptr, wk.D, s, s.pv, s.v);
        forward_strip(out + i0 * C + h0 * HD, C, nullptr, 0, s, wk.KT.data(), key_ld(s.width()),
                      wk.Vp.data(), wk, scale);
      }
    }
  }
}

}  // namespace loom::kernels
