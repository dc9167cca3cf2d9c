#include "loom/nn/moe.h"

#include <cstring>

#include "loom/util/error.h"

namespace loom::nn {

MoE::MoE(ParamStore& ps, const std::string& name, const MoeSpec& s, float init_std)
    : s_(s),
      experts_([&] {
        // Declared before the router, as transformers' module order has them.
        std::vector<std::unique_ptr<SwiGluMLP>> v;
        for (int64_t e = 0; e < s.router.n_experts; ++e)
          v.push_back(std::make_unique<SwiGluMLP>(ps, name + ".experts." + std::to_string(e),
                                                  s.hidden, s.inter, init_std));
        return v;
      }()),
      router_(ps, name + ".gate", s.router, init_std) {
  if (s.n_shared > 0)
    shared_.emplace(ps, name + ".shared_experts", s.hidden, s.inter * s.n_shared, init_std);
}

std::vector<Linear*> MoE::linears() {
  std::vector<Linear*> out;
  for (auto& e : experts_)
    for (Linear* l : e->linears()) out.push_back(l);
  if (shared_)
    for (Linear* l : shared_->linears()) out.push_back(l);
  return out;
}

void MoE::release_activations() {
  for (auto& e : experts_) e->release_activations();
  router_.release_activations();
  if (shared_) shared_->release_activations();
  xs_ = y_ = Tensor();
}

const Tensor& MoE::forward(const Tensor& x) {
  const int64_t C = s_.hidden, E = s_.router.n_experts, K = s_.router.top_k, N = x.numel() / C;
  router_.forward(x);
  const std::vector<int32_t>& idx = router_.experts();
  // Counting sort of the (token, slot) pairs by expert, tokens in order within each.
  off_.assign(static_cast<size_t>(E + 1), 0);
  for (int32_t e : idx) ++off_[e + 1];
  for (int64_t e = 0; e < E; ++e) off_[e + 1] += off_[e];
  std::vector<int64_t> next(off_.begin(), off_.end() - 1);
  slot_.resize(static_cast<size_t>(N * K));
  for (int64_t i = 0; i < N * K; ++i) slot_[i] = next[idx[i]]++;
  ensure(xs_, {N * K, C});
  const float* xp = x.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N * K; ++i)
    std::memcpy(xs_.f32() + slot_[i] * C, xp + (i / K) * C, C * sizeof(float));

  ensure(y_, x.shape());
  if (shared_) {
    y_.copy_from(shared_->forward(x).reshape(x.shape()));
  } else {
    y_.zero_();
  }
  // Each expert on its rows; outputs stay in the expert's down_proj (its output()).
  std::vector<const float*> out(static_cast<size_t>(E), nullptr);
  for (int64_t e = 0; e < E; ++e)
    if (off_[e + 1] > off_[e])
      out[e] = experts_[e]->forward(xs_.slice0(off_[e], off_[e + 1])).f32();
  const float* w = router_.weights().f32();
  float* yp = y_.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = t * K + k, e = idx[i];
      const float* r = out[e] + (slot_[i] - off_[e]) * C;
      float* y = yp + t * C;
      for (int64_t c = 0; c < C; ++c) y[c] += w[i] * r[c];
    }
  return y_;
}

void MoE::backward(const Tensor& dy, const Tensor& dx, Scratch& scratch) {
  const int64_t C = s_.hidden, E = s_.router.n_experts, K = s_.router.top_k, N = dy.numel() / C;
  const std::vector<int32_t>& idx = router_.experts();
  const float* w = router_.weights().f32();
  if (shared_) shared_->backward(dy, dx, scratch);
  // dys[row of (t, k)] = w[t, k] dy[t]; dw[t, k] = dy[t] . expert output row.
  Tensor dys = scratch.zeros("moe.dys", {N * K, C});
  Tensor dw = scratch.zeros("moe.dw", {N, K});
  std::vector<const float*> out(static_cast<size_t>(E), nullptr);
  for (int64_t e = 0; e < E; ++e)
    if (off_[e + 1] > off_[e]) out[e] = experts_[e]->linears()[2]->output().f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N * K; ++i) {
    const int64_t e = idx[i];
    const float* g = dy.f32() + (i / K) * C;
    const float* r = out[e] + (slot_[i] - off_[e]) * C;
    float* d = dys.f32() + slot_[i] * C;
    float dot = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      d[c] = w[i] * g[c];
      dot += g[c] * r[c];
    }
    dw.f32()[i] = dot;
  }
  Tensor dxs = scratch.zeros("moe.dxs", {N * K, C});
  for (int64_t e = 0; e < E; ++e)
    if (off_[e + 1] > off_[e])
      experts_[e]->backward(dys.slice0(off_[e], off_[e + 1]), dxs.slice0(off_[e], off_[e + 1]),
                            scratch);
  float* dxp = dx.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const float* r = dxs.f32() + slot_[t * K + k] * C;
      float* d = dxp + t * C;
      for (int64_t c = 0; c < C; ++c) d[c] += r[c];
    }
  router_.backward(dw, dx);
}

}  // namespace loom::nn
