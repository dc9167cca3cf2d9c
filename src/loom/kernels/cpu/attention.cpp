#include "loom/kernels/cpu/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/kernels/cpu/vec_math.h"
#include "loom/util/profile.h"

namespace loom::kernels {

namespace {
// Query rows per strip: a multiple of the GEMM kernels' row blocking that keeps a strip's
// scores [64, P + T] in L2 at T = 1024 (256 KiB) while the diagonal block's masked half
// wastes little (1/5 of the score products at T = 256, 1/17 at T = 1024).
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
                     int64_t h, int64_t t0) {
  const int64_t g = h / (d.NH / d.NKV);
  Strip s{};
  s.m = std::min(kRows, d.T - t0);
  s.heads = 1;
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

// C[m, n] (row stride ldc) = alpha A B^T + beta C, or with A and/or B not transposed.
// Single-threaded: it runs inside the kernels' own parallel loops (OpenBLAS's OpenMP build
// does not fork again inside a parallel region).
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// S[rows, P + n] = [Q PK^T | Q K^T] / sqrt(HD)
void scores(float* S, const Strip& s, float scale) {
  const int64_t w = s.width(), r = s.rows();
  if (s.P > 0) gemm(false, true, r, s.P, s.HD, scale, s.q, s.qs, s.pk, s.ps, 0.0f, S, w);
  gemm(false, true, r, s.n, s.HD, scale, s.q, s.qs, s.k, s.kvs, 0.0f, S + s.P, w);
}

// out[rows, HD] (row stride ldo) = S [PV; V] (beta 0), or dq += dS [PK; K] (beta 1).
void times_rows(float* out, int64_t ldo, float beta, const float* S, const Strip& s,
                const float* prefix, const float* keys) {
  const int64_t w = s.width(), r = s.rows();
  if (s.P > 0) {
    gemm(false, false, r, s.HD, s.P, 1.0f, S, w, prefix, s.ps, beta, out, ldo);
    beta = 1.0f;
  }
  gemm(false, false, r, s.HD, s.n, 1.0f, S + s.P, w, keys, s.kvs, beta, out, ldo);
}

// x[c] = exp(x[c] - shift) for c < n; returns their sum. Out of line with plain pointers:
// inlined into the strip loops GCC left it scalar (the clamps became branches).
[[gnu::noinline]] float exp_sum(float* __restrict x, int64_t n, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) {
    x[c] = vexp(x[c] - shift);
    sum += x[c];
  }
  return sum;
}

[[gnu::noinline]] float max_of(const float* __restrict x, int64_t n, float mx) {
#pragma omp simd reduction(max : mx)
  for (int64_t c = 0; c < n; ++c) mx = x[c] > mx ? x[c] : mx;
  return mx;
}

// Row i of the strip's scores: every prefix column and key columns [lo, hi] are visible;
// the rest become 0. Visible x becomes exp(x - shift) (shift = the row's lse in backward:
// the probabilities again). Returns the sum of the visible values.
inline float exp_row(float* row, const Strip& s, int64_t i, float shift) {
  float* a = row + s.P;
  const int64_t lo = s.lo[i], hi = s.hi[i];
  const float sum = exp_sum(row, s.P, shift) + exp_sum(a + lo, hi - lo + 1, shift);
  std::fill(a, a + lo, 0.0f);
  std::fill(a + hi + 1, a + s.n, 0.0f);
  return sum;
}

// Softmax of row i in place over its visible columns (one softmax spans prefix and keys);
// returns the row's log-sum-exp.
inline float softmax_row(float* row, const Strip& s, int64_t i) {
  const float mx = max_of(row + s.P + s.lo[i], s.hi[i] - s.lo[i] + 1, max_of(row, s.P, -INFINITY));
  const float sum = exp_row(row, s, i, mx), inv = 1.0f / sum;
#pragma omp simd
  for (int64_t c = 0; c < s.width(); ++c) row[c] *= inv;
  return mx + std::log(sum);
}

// Row r of a strip's stacked rows (m rows per head) is token row r % m of head r / m: in a
// token-major buffer (row stride ld, heads HD apart) it starts at this offset.
inline int64_t stacked_at(int64_t r, int64_t m, int64_t ld, int64_t HD) {
  return (r % m) * ld + (r / m) * HD;
}

// Packs `heads` heads' m token rows from src (row stride ld) into dst [heads * m, HD].
void stack_heads(float* dst, const float* src, int64_t ld, int64_t m, int64_t heads, int64_t HD) {
  for (int64_t r = 0; r < heads * m; ++r)
    std::copy_n(src + stacked_at(r, m, ld, HD), HD, dst + r * HD);
}

// One strip's forward: out rows (stride ldo, stacked as the strip's) and, when lse is
// non-null, their lse (head j's m values at lse + j * lse_head).
void forward_strip(float* out, int64_t ldo, float* lse, int64_t lse_head, float* S, const Strip& s,
                   float scale) {
  scores(S, s, scale);
  const int64_t w = s.width();
  for (int64_t r = 0; r < s.rows(); ++r) {
    const float l = softmax_row(S + r * w, s, r % s.m);
    if (lse) lse[r / s.m * lse_head + r % s.m] = l;
  }
  times_rows(out, ldo, 0.0f, S, s, s.pv, s.v);
}
// Where one backward strip's gradients go: dq rows (stacked as the strip's rows, row stride
// ldq), the key/value rows from position k0 on (stride ldkv), the prefix's P rows (stride
// ldp; null: no prefix gradients).
struct StripGrads {
  float *dq, *dk, *dv, *dpk, *dpv;
  int64_t ldq, ldkv, ldp;
};

// One strip's backward. dO: the strip's output gradient rows (stride ldo, stacked as its
// rows); l, D: each row's lse and rowsum(dO o O). Pr, dS: [rows, P + n] buffers.
void backward_strip(const Strip& s, const float* dO, int64_t ldo, const float* l, const float* D,
                    const StripGrads& g, float* Pr, float* dS, float scale) {
  const int64_t w = s.width(), R = s.rows(), n = s.n, P = s.P, HD = s.HD;
  scores(Pr, s, scale);
  for (int64_t r = 0; r < R; ++r) exp_row(Pr + r * w, s, r % s.m, l[r]);
  // dP = dO [PV; V]^T
  if (P > 0) gemm(false, true, R, P, HD, 1.0f, dO, ldo, s.pv, s.ps, 0.0f, dS, w);
  gemm(false, true, R, n, HD, 1.0f, dO, ldo, s.v, s.kvs, 0.0f, dS + P, w);
  // Softmax backward: dS = P (dP - D) / sqrt(HD), D = rowsum(dO o O) = sum_s P dP.
  for (int64_t r = 0; r < R; ++r) {
    const float* p = Pr + r * w;
    float* ds = dS + r * w;
#pragma omp simd
    for (int64_t c = 0; c < w; ++c) ds[c] = p[c] * (ds[c] - D[r]) * scale;
  }
  // dV += P^T dO, dK += dS^T Q, dQ += dS [PK; K]; the prefix's rows alike.
  gemm(true, false, n, HD, R, 1.0f, Pr + P, w, dO, ldo, 1.0f, g.dv + s.k0 * g.ldkv, g.ldkv);
  gemm(true, false, n, HD, R, 1.0f, dS + P, w, s.q, s.qs, 1.0f, g.dk + s.k0 * g.ldkv, g.ldkv);
  times_rows(g.dq, g.ldq, 1.0f, dS, s, s.pk, s.k);
  if (P > 0 && g.dpv) gemm(true, false, P, HD, R, 1.0f, Pr, w, dO, ldo, 1.0f, g.dpv, g.ldp);
  if (P > 0 && g.dpk) gemm(true, false, P, HD, R, 1.0f, dS, w, s.q, s.qs, 1.0f, g.dpk, g.ldp);
}
}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttnDims& d) {
  prof::ScopedPhase ph(prof::Phase::Attention);
  const int64_t T = d.T, HD = d.HD, C = d.NH * HD, group = d.NH / d.NKV;
  const int64_t strips = (T + kRows - 1) / kRows;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
#pragma omp parallel
  {
    // Under GQA the heads of a group share their keys and values: their query rows are
    // stacked (Qg [group * m, HD]) so each product runs once per group, group times taller.
    std::vector<float> S(static_cast<size_t>(group * kRows * (d.P + T)));
    std::vector<float> Qg(group > 1 ? group * kRows * HD : 0), Og(Qg.size());
    // Later strips see more keys: dynamic scheduling evens the threads out.
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t g = 0; g < d.NKV; ++g) {
        for (int64_t j = 0; j < strips; ++j) {
          const int64_t t0 = j * kRows, h0 = g * group;
          Strip s = training_strip(d, q, k, v, b, h0, t0);
          float* o = out + (b * T + t0) * C + h0 * HD;
          float* l = lse + (b * d.NH + h0) * T + t0;
          if (group == 1) {
            forward_strip(o, C, l, T, S.data(), s, scale);
            continue;
          }
          stack_heads(Qg.data(), s.q, s.qs, s.m, group, HD);
          s.q = Qg.data();
          s.qs = HD;
          s.heads = group;
          forward_strip(Og.data(), HD, l, T, S.data(), s, scale);
          for (int64_t r = 0; r < group * s.m; ++r)
            std::copy_n(Og.data() + r * HD, HD, o + stacked_at(r, s.m, C, HD));
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
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const bool prefix_grads = P > 0 && dprefix_k && dprefix_v;
  // Under GQA, with enough (batch, group) pairs for the threads, a task owns one KV group of
  // one batch row: its heads' rows stacked as in forward, dk/dv (and the prefix slice) its
  // own. Otherwise a task is one (batch, head), and GQA's heads accumulate their key/value
  // gradients in per-head parts summed per group at the end (MHA's write dk/dv directly).
  const bool stacked = group > 1 && d.B * d.NKV >= 2 * omp_get_max_threads();
  const bool parts = group > 1 && !stacked;
  const int64_t part_kv = d.B * d.NH * T * HD, part_p = prefix_grads ? d.B * d.NH * P * HD : 0;
  std::vector<float> part(parts ? 2 * (part_kv + part_p) : 0, 0.0f);
  float *pdk = part.data(), *pdv = pdk + part_kv, *pdpk = pdv + part_kv, *pdpv = pdpk + part_p;
  const int64_t heads = stacked ? group : 1;  // heads per task
#pragma omp parallel
  {
    // Pr: the strip's probabilities again; dS: dL/dscores. Stacked: the group's q, dO and
    // dq rows packed [group * m, HD].
    std::vector<float> Pr(static_cast<size_t>(heads * kRows * (P + T))), dS(Pr.size());
    std::vector<float> l(heads * kRows), D(l.size());
    std::vector<float> Qg(stacked ? heads * kRows * HD : 0), dOg(Qg.size()), dQg(Qg.size());
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
                0,
                HD,
                HD};
        } else {
          sg = {nullptr,
                dk + b * T * d.kv_stride + g * HD,
                dv + b * T * d.kv_stride + g * HD,
                prefix_grads ? dprefix_k + b * P * KVC + g * HD : nullptr,
                prefix_grads ? dprefix_v + b * P * KVC + g * HD : nullptr,
                0,
                d.kv_stride,
                KVC};
        }
        for (int64_t j = 0; j < strips; ++j) {
          const int64_t t0 = j * kRows;
          Strip s = training_strip(d, q, k, v, b, h0, t0);
          const int64_t m = s.m, R = heads * m;
          const float* dO = dout + (b * T + t0) * C + h0 * HD;  // row r: r % m, head r / m
          const float* O = out + (b * T + t0) * C + h0 * HD;
          for (int64_t r = 0; r < R; ++r) {
            const int64_t at = stacked_at(r, m, C, HD);
            l[r] = lse[(bh0 + r / m) * T + t0 + r % m];
            float dsum = 0.0f;
#pragma omp simd reduction(+ : dsum)
            for (int64_t c = 0; c < HD; ++c) dsum += dO[at + c] * O[at + c];
            D[r] = dsum;
          }
          float* dqs = dq + (b * T + t0) * d.q_stride + h0 * HD;
          if (!stacked) {
            sg.dq = dqs;
            sg.ldq = d.q_stride;
            backward_strip(s, dO, C, l.data(), D.data(), sg, Pr.data(), dS.data(), scale);
            continue;
          }
          stack_heads(Qg.data(), s.q, s.qs, m, heads, HD);
          stack_heads(dOg.data(), dO, C, m, heads, HD);
          std::fill(dQg.begin(), dQg.begin() + R * HD, 0.0f);
          s.q = Qg.data();
          s.qs = HD;
          s.heads = heads;
          sg.dq = dQg.data();
          sg.ldq = HD;
          backward_strip(s, dOg.data(), HD, l.data(), D.data(), sg, Pr.data(), dS.data(), scale);
          for (int64_t r = 0; r < R; ++r) {
            float* dqr = dqs + stacked_at(r, m, d.q_stride, HD);
            const float* src = dQg.data() + r * HD;
#pragma omp simd
            for (int64_t c = 0; c < HD; ++c) dqr[c] += src[c];
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
            for (int64_t t = 0; t < T; ++t) {
              float* dkt = dk + (b * T + t) * d.kv_stride + g * HD;
              float* dvt = dv + (b * T + t) * d.kv_stride + g * HD;
              const float *a = pdk + (bh * T + t) * HD, *c = pdv + (bh * T + t) * HD;
#pragma omp simd
              for (int64_t i = 0; i < HD; ++i) {
                dkt[i] += a[i];
                dvt[i] += c[i];
              }
            }
            for (int64_t j = 0; prefix_grads && j < P; ++j) {
              float* dpk = dprefix_k + (b * P + j) * KVC + g * HD;
              float* dpv = dprefix_v + (b * P + j) * KVC + g * HD;
              const float *a = pdpk + (bh * P + j) * HD, *c = pdpv + (bh * P + j) * HD;
#pragma omp simd
              for (int64_t i = 0; i < HD; ++i) {
                dpk[i] += a[i];
                dpv[i] += c[i];
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
                              int64_t q_stride, int64_t kv_stride) {
  prof::ScopedPhase ph(prof::Phase::Attention);
  const int64_t group = NH / NKV, C = NH * HD, strips = (n + kRows - 1) / kRows;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
#pragma omp parallel
  {
    std::vector<float> S(static_cast<size_t>(kRows * (past + n)));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t j = 0; j < strips; ++j) {
      for (int64_t h = 0; h < NH; ++h) {
        // Queries i0.. sit at positions past + i0.. and see cache rows [0, past + i].
        const int64_t i0 = j * kRows, g = h / group;
        Strip s{};
        s.m = std::min(kRows, n - i0);
        s.heads = 1;
        s.n = past + i0 + s.m;
        for (int64_t i = 0; i < s.m; ++i) {
          s.lo[i] = 0;
          s.hi[i] = past + i0 + i;
        }
        s.q = q + i0 * q_stride + h * HD;
        s.k = kc + g * HD;
        s.v = vc + g * HD;
        s.qs = q_stride;
        s.kvs = kv_stride;
        s.HD = HD;
        forward_strip(out + i0 * C + h * HD, C, nullptr, 0, S.data(), s, scale);
      }
    }
  }
}

}  // namespace loom::kernels
