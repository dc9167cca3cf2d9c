#include "loom/kernels/cpu/attention.h"

#include <cmath>
#include <vector>

#include "loom/kernels/cpu/vec_math.h"
#include "loom/util/profile.h"

namespace loom::kernels {

namespace {
// First key position token t of row b may attend to: its packed sample's start.
inline int64_t first_key(const AttnDims& d, int64_t b, int64_t t) {
  if (!d.pos) return 0;
  const int64_t p = d.pos[b * d.T + t];
  return p <= t ? t - p : 0;
}
}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       const AttnDims& d) {
  prof::ScopedPhase ph(prof::Phase::Attention);
  const int64_t T = d.T, HD = d.HD, C = d.NH * d.HD, group = d.NH / d.NKV;
  const int64_t P = d.P, W = P + T;  // att row width: P prefix columns, then T key columns
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.NH; ++h) {
      const int64_t g = h / group;
      float* a_bh = att + (b * d.NH + h) * T * W;
      for (int64_t t = 0; t < T; ++t) {
        const float* qt = q + (b * T + t) * d.q_stride + h * HD;
        float* pa = a_bh + t * W;  // pa[j]: prefix key j (none when P == 0)
        float* a = pa + P;         // a[s]: key s
        const int64_t s0 = first_key(d, b, t);
        float mx = -INFINITY;
        // Prefix keys: visible to every query, so no mask.
        for (int64_t j = 0; j < P; ++j) {
          const float* pk = d.prefix_k + j * d.prefix_stride + g * HD;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < HD; ++i) dot += qt[i] * pk[i];
          pa[j] = dot * scale;
          mx = std::max(mx, pa[j]);
        }
        for (int64_t s = 0; s < s0; ++s) a[s] = 0.0f;
        for (int64_t s = s0; s <= t; ++s) {
          const float* ks = k + (b * T + s) * d.kv_stride + g * HD;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < HD; ++i) dot += qt[i] * ks[i];
          a[s] = dot * scale;
          mx = std::max(mx, a[s]);
        }
        // One softmax over prefix and causal scores together.
        float sum = 0.0f;
        for (int64_t j = 0; j < P; ++j) {
          pa[j] = vexp(pa[j] - mx);
          sum += pa[j];
        }
        for (int64_t s = s0; s <= t; ++s) {
          a[s] = vexp(a[s] - mx);
          sum += a[s];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < P; ++j) pa[j] *= inv;
        for (int64_t s = s0; s <= t; ++s) a[s] *= inv;
        for (int64_t s = t + 1; s < T; ++s) a[s] = 0.0f;
        if (!out) continue;  // the probabilities only
        float* o = out + (b * T + t) * C + h * HD;
        for (int64_t i = 0; i < HD; ++i) o[i] = 0.0f;
        for (int64_t j = 0; j < P; ++j) {
          const float* pv = d.prefix_v + j * d.prefix_stride + g * HD;
          const float w = pa[j];
          for (int64_t i = 0; i < HD; ++i) o[i] += w * pv[i];
        }
        for (int64_t s = s0; s <= t; ++s) {
          const float* vs = v + (b * T + s) * d.kv_stride + g * HD;
          const float w = a[s];
          for (int64_t i = 0; i < HD; ++i) o[i] += w * vs[i];
        }
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, const AttnDims& d,
                        float* dprefix_k, float* dprefix_v) {
  prof::ScopedPhase ph(prof::Phase::Attention);
  const int64_t T = d.T, HD = d.HD, C = d.NH * d.HD, group = d.NH / d.NKV;
  const int64_t P = d.P, W = P + T, KVC = d.NKV * d.HD;  // W: att row width
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  // Parallel over (batch, kv head): the query heads of one group all write the same dk/dv
  // rows, so they run in one thread. The prefix is shared across b, so its gradients go to
  // the per-batch slices dprefix_k/v[b] ([P, NKV*HD]) to stay race-free.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t g = 0; g < d.NKV; ++g) {
      std::vector<float> datt_buf(P + T);  // dL/datt of one row: P prefix, then T keys
      float* pdatt = datt_buf.data();
      float* datt = pdatt + P;
      float* dpk_b = dprefix_k ? dprefix_k + b * P * KVC : nullptr;
      float* dpv_b = dprefix_v ? dprefix_v + b * P * KVC : nullptr;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* a_bh = att + (b * d.NH + h) * T * W;
        for (int64_t t = 0; t < T; ++t) {
          const float* pa = a_bh + t * W;  // prefix probabilities
          const float* a = pa + P;         // key probabilities
          const float* dot_ = dout + (b * T + t) * C + h * HD;
          const int64_t s0 = first_key(d, b, t);
          // datt[s] = dout_t . v_s ; dv_s += a[s] * dout_t (same for the prefix values)
          float dsum = 0.0f;
          for (int64_t j = 0; j < P; ++j) {
            const float* pv = d.prefix_v + j * d.prefix_stride + g * HD;
            float dd = 0.0f;
#pragma omp simd reduction(+ : dd)
            for (int64_t i = 0; i < HD; ++i) dd += dot_[i] * pv[i];
            if (dpv_b) {
              float* dpv = dpv_b + j * KVC + g * HD;
#pragma omp simd
              for (int64_t i = 0; i < HD; ++i) dpv[i] += pa[j] * dot_[i];
            }
            pdatt[j] = dd;
            dsum += pa[j] * dd;
          }
          for (int64_t s = s0; s <= t; ++s) {
            const float* vs = v + (b * T + s) * d.kv_stride + g * HD;
            float* dvs = dv + (b * T + s) * d.kv_stride + g * HD;
            float dd = 0.0f;
#pragma omp simd reduction(+ : dd)
            for (int64_t i = 0; i < HD; ++i) {
              dd += dot_[i] * vs[i];
              dvs[i] += a[s] * dot_[i];
            }
            datt[s] = dd;
            dsum += a[s] * dd;
          }
          // softmax backward (dsum spans prefix and keys), then through the scaled dot product
          const float* qt = q + (b * T + t) * d.q_stride + h * HD;
          float* dqt = dq + (b * T + t) * d.q_stride + h * HD;
          for (int64_t j = 0; j < P; ++j) {
            const float gs = pa[j] * (pdatt[j] - dsum) * scale;
            const float* pk = d.prefix_k + j * d.prefix_stride + g * HD;
            for (int64_t i = 0; i < HD; ++i) dqt[i] += gs * pk[i];
            if (dpk_b) {
              float* dpk = dpk_b + j * KVC + g * HD;
              for (int64_t i = 0; i < HD; ++i) dpk[i] += gs * qt[i];
            }
          }
          for (int64_t s = s0; s <= t; ++s) {
            const float gs = a[s] * (datt[s] - dsum) * scale;
            const float* ks = k + (b * T + s) * d.kv_stride + g * HD;
            float* dks = dk + (b * T + s) * d.kv_stride + g * HD;
            for (int64_t i = 0; i < HD; ++i) {
              dqt[i] += gs * ks[i];
              dks[i] += gs * qt[i];
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
  const int64_t group = NH / NKV, C = NH * HD;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
#pragma omp parallel
  {
    std::vector<float> a(past + n);
#pragma omp for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t g = h / group, len = past + i + 1;
        const float* qi = q + i * q_stride + h * HD;
        float mx = -INFINITY;
        for (int64_t s = 0; s < len; ++s) {
          const float* ks = kc + s * kv_stride + g * HD;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < HD; ++d) dot += qi[d] * ks[d];
          a[s] = dot * scale;
          mx = std::max(mx, a[s]);
        }
        float sum = 0.0f;
        for (int64_t s = 0; s < len; ++s) {
          a[s] = vexp(a[s] - mx);
          sum += a[s];
        }
        float* o = out + i * C + h * HD;
        for (int64_t d = 0; d < HD; ++d) o[d] = 0.0f;
        for (int64_t s = 0; s < len; ++s) {
          const float* vs = vc + s * kv_stride + g * HD;
          const float w = a[s] / sum;
          for (int64_t d = 0; d < HD; ++d) o[d] += w * vs[d];
        }
      }
    }
  }
}

}  // namespace loom::kernels
