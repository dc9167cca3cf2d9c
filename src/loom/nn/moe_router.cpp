#include "loom/nn/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "loom/nn/buffers.h"
#include "loom/nn/weight_ops.h"
#include "loom/util/error.h"

namespace loom::nn {

Router::Router(ParamStore& ps, const std::string& name, const RouterSpec& s, float init_std)
    : s_(s) {
  const std::string where = name + ": ";
  LOOM_CHECK(s.n_experts > 0 && s.top_k > 0 && s.top_k <= s.n_experts,
             where + "num_experts_per_tok " + std::to_string(s.top_k) + " must be in [1, " +
                 std::to_string(s.n_experts) + "] (n_routed_experts)");
  LOOM_CHECK(s.n_group >= 1 && s.n_experts % s.n_group == 0,
             where + "n_group " + std::to_string(s.n_group) + " does not divide n_routed_experts " +
                 std::to_string(s.n_experts));
  LOOM_CHECK(s.topk_group >= 1 && s.topk_group <= s.n_group &&
                 s.topk_group * (s.n_experts / s.n_group) >= s.top_k,
             where + "topk_group " + std::to_string(s.topk_group) + " of " +
                 std::to_string(s.n_group) + " groups leaves fewer than num_experts_per_tok " +
                 std::to_string(s.top_k) + " experts to choose from");
  LOOM_CHECK(s.aux_alpha == 0.0f || !s.sigmoid,
             where + "aux_loss_alpha: the balance loss is implemented for softmax scores (V2)");
  wg_ = ps.add(name + ".weight", {s.n_experts, s.hidden}, ParamKind::Router, init_std);
  load_.assign(static_cast<size_t>(s.n_experts), 0);
  if (s.score_bias)
    bias_ = ps.add(name + ".e_score_correction_bias", {s.n_experts}, ParamKind::Buffer, 0.0f);
}

void Router::forward(const Tensor& x) {
  const int64_t C = s_.hidden, E = s_.n_experts, K = s_.top_k, N = x.numel() / C;
  x_ = x;
  ensure(scores_, {N, E});
  ensure(w_, {N, K});
  idx_.assign(static_cast<size_t>(N * K), 0);
  weight_forward(scores_.f32(), x.f32(), *wg_, nullptr, N);
  float* sc = scores_.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* r = sc + n * E;
    if (s_.sigmoid) {
      for (int64_t e = 0; e < E; ++e) r[e] = 1.0f / (1.0f + std::exp(-r[e]));
    } else {
      const float m = *std::max_element(r, r + E);
      float sum = 0.0f;
      for (int64_t e = 0; e < E; ++e) sum += (r[e] = std::exp(r[e] - m));
      for (int64_t e = 0; e < E; ++e) r[e] /= sum;
    }
    choose(n);
  }
  counts_.assign(static_cast<size_t>(E), 0);
  for (int32_t e : idx_) ++counts_[e];
  aux_value_ = 0.0;
  if (aux_weight_ > 0.0) {
    // Per sequence: ce from its routed counts, P its mean scores (x is [B, T, C]).
    const int64_t B = x.ndim() == 3 ? x.dim(0) : 1;
    seq_ = N / B;
    ensure(ce_, {B, E});
    ce_.zero_();
    const float unit = static_cast<float>(E) / static_cast<float>(seq_ * K);
    for (int64_t i = 0; i < N * K; ++i) ce_.f32()[(i / K) / seq_ * E + idx_[i]] += unit;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < E; ++e) {
        double p = 0.0;
        for (int64_t t = 0; t < seq_; ++t) p += sc[(b * seq_ + t) * E + e];
        aux_value_ += ce_.f32()[b * E + e] * p / static_cast<double>(seq_);
      }
    aux_value_ *= aux_weight_;
  }
}

void Router::set_aux_loss(double per_sequence, double grad_scale) {
  aux_weight_ = s_.aux_alpha * per_sequence;
  aux_grad_scale_ = grad_scale;
}

void Router::choose(int64_t n) {
  const int64_t E = s_.n_experts, K = s_.top_k, G = s_.n_group, per = E / G;
  const float* s = scores_.f32() + n * E;
  const float* bias = bias_ ? bias_->value.f32() : nullptr;
  constexpr float kOut = -std::numeric_limits<float>::infinity();
  // Per-thread scratch (choose runs once per token, inside forward's parallel loop).
  thread_local std::vector<float> c, gs;
  thread_local std::vector<int64_t> order, gorder;
  thread_local std::vector<char> keep;
  c.assign(s, s + E);
  if (bias)
    for (int64_t e = 0; e < E; ++e) c[e] += bias[e];
  // Larger first; equal values by lower index (a fixed rule, whatever the layout).
  auto before = [](const std::vector<float>& v) {
    return [&v](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  };
  if (G > 1) {
    gs.resize(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      const float* cg = c.data() + g * per;
      if (s_.sigmoid) {  // V3: the sum of the group's two best choice scores
        float a = kOut, b = kOut;
        for (int64_t i = 0; i < per; ++i) {
          if (cg[i] > a) {
            b = a;
            a = cg[i];
          } else if (cg[i] > b) {
            b = cg[i];
          }
        }
        gs[g] = per >= 2 ? a + b : a;
      } else {  // V2: the group's best score
        gs[g] = *std::max_element(cg, cg + per);
      }
    }
    gorder.resize(static_cast<size_t>(G));
    std::iota(gorder.begin(), gorder.end(), 0);
    std::partial_sort(gorder.begin(), gorder.begin() + s_.topk_group, gorder.end(), before(gs));
    keep.assign(static_cast<size_t>(G), 0);
    for (int64_t i = 0; i < s_.topk_group; ++i) keep[gorder[i]] = 1;
    for (int64_t e = 0; e < E; ++e)
      if (!keep[e / per]) c[e] = kOut;
  }
  order.resize(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + K, order.end(), before(c));
  int32_t* idx = idx_.data() + n * K;
  float* w = w_.f32() + n * K;
  float sum = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    idx[k] = static_cast<int32_t>(order[k]);
    sum += (w[k] = s[order[k]]);
  }
  const float scale = s_.norm_topk_prob ? s_.scaling / (sum + 1e-20f) : s_.scaling;
  for (int64_t k = 0; k < K; ++k) w[k] *= scale;
}

void Router::backward(const Tensor& dweights, const Tensor& dx) {
  const int64_t C = s_.hidden, E = s_.n_experts, K = s_.top_k, N = x_.numel() / C;
  Tensor dl = Tensor::zeros({N, E});  // d loss / d logits
  const float* s = scores_.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* sn = s + n * E;
    const float* dw = dweights.f32() + n * K;
    const int32_t* idx = idx_.data() + n * K;
    // w_k = c u_k / Z (Z = sum_j u_j + 1e-20) with norm_topk_prob, else c u_k; u_k = s[idx_k].
    thread_local std::vector<float> d, ds;  // per-thread scratch
    d.resize(static_cast<size_t>(K));       // d loss / d u_k (the chosen scores)
    if (s_.norm_topk_prob) {
      float z = 1e-20f, dot = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        z += sn[idx[k]];
        dot += dw[k] * sn[idx[k]];
      }
      for (int64_t k = 0; k < K; ++k) d[k] = s_.scaling * (dw[k] / z - dot / (z * z));
    } else {
      for (int64_t k = 0; k < K; ++k) d[k] = s_.scaling * dw[k];
    }
    float* g = dl.f32() + n * E;
    if (s_.sigmoid) {
      for (int64_t k = 0; k < K; ++k) g[idx[k]] = d[k] * sn[idx[k]] * (1.0f - sn[idx[k]]);
    } else {  // softmax: dl_e = s_e (ds_e - sum_j ds_j s_j)
      // ds: the chosen weights' part, plus the balance loss's alpha/B * ce[b, e] / T.
      ds.assign(static_cast<size_t>(E), 0.0f);
      if (aux_weight_ > 0.0) {
        const float a = static_cast<float>(aux_weight_ * aux_grad_scale_ / seq_);
        const float* ce = ce_.f32() + (n / seq_) * E;
        for (int64_t e = 0; e < E; ++e) ds[e] = a * ce[e];
      }
      for (int64_t k = 0; k < K; ++k) ds[idx[k]] += d[k];
      float dot = 0.0f;
      for (int64_t e = 0; e < E; ++e) dot += ds[e] * sn[e];
      for (int64_t e = 0; e < E; ++e) g[e] = sn[e] * (ds[e] - dot);
    }
  }
  weight_backward(dx.defined() ? dx.f32() : nullptr, dl.f32(), x_.f32(), *wg_, nullptr, N);
  for (int64_t e = 0; e < E; ++e) load_[e] += counts_[e];
  aux_sum_ += aux_value_;
}

}  // namespace loom::nn
