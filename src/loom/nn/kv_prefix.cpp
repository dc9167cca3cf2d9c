#include "loom/nn/kv_prefix.h"

#include <cmath>

#include "loom/util/error.h"

namespace loom::nn {

KVPrefix::KVPrefix(ParamStore& ps, const PrefixSpec& spec, int64_t n_layers, int64_t kv_width)
    : spec_(spec), layers_(n_layers), kvd_(kv_width) {
  const int64_t P = spec.num_virtual_tokens;
  LOOM_CHECK(P > 0, "prefix tuning: num_virtual_tokens must be positive");
  if (spec_.encoder_hidden <= 0) spec_.encoder_hidden = kvd_;
  // torch.nn.Embedding starts at normal(0, 1); PEFT keeps that init.
  emb_ = ps.add("prefix_encoder.embedding.weight", {P, spec.projection ? kvd_ : stride()},
                ParamKind::Embedding, 1.0f);
  if (spec.projection) {
    const int64_t H = spec_.encoder_hidden;
    w1_ = std::make_unique<Linear>(ps, "prefix_encoder.transform.0", kvd_, H, true, 0.0f);
    w2_ = std::make_unique<Linear>(ps, "prefix_encoder.transform.2", H, stride(), true, 0.0f);
    // torch.nn.Linear's init: weight and bias uniform(+-1/sqrt(in)).
    for (Linear* l : {w1_.get(), w2_.get()}) {
      const float bound = 1.0f / std::sqrt(static_cast<float>(l->in_features()));
      l->weight()->init_bound = bound;
      l->bias()->init_bound = bound;
    }
  }
}

const Tensor& KVPrefix::table() const { return spec_.projection ? w2_->output() : emb_->value; }

void KVPrefix::bind(kernels::AttnDims& d, int64_t layer) const {
  d.prefix_k = keys(layer);
  d.prefix_v = values(layer);
  d.P = length();
  d.prefix_stride = stride();
}

void KVPrefix::accumulate(const float* dk, const float* dv, int64_t B, int64_t layer) {
  const int64_t P = length();
  float* gk = grad_keys(layer);
  float* gv = grad_values(layer);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < P; ++j)
      for (int64_t i = 0; i < kvd_; ++i) {
        gk[j * stride() + i] += dk[(b * P + j) * kvd_ + i];
        gv[j * stride() + i] += dv[(b * P + j) * kvd_ + i];
      }
}

const Tensor& KVPrefix::forward() {
  ensure(grad_, {spec_.num_virtual_tokens, stride()});
  grad_.zero_();
  if (!spec_.projection) return emb_->value;
  const Tensor& h = w1_->forward(emb_->value);
  ensure(act_, h.shape());
  const float* hp = h.f32();
  float* a = act_.f32();
  for (int64_t i = 0; i < h.numel(); ++i) a[i] = std::tanh(hp[i]);
  return w2_->forward(act_);
}

void KVPrefix::backward(Scratch& scratch) {
  if (!spec_.projection) {
    if (!emb_->trainable) return;
    float* g = emb_->grad.f32();
    const float* d = grad_.f32();
    for (int64_t i = 0; i < grad_.numel(); ++i) g[i] += d[i];
    return;
  }
  Tensor dact = scratch.zeros("prefix.dact", act_.shape());
  w2_->backward(grad_, dact);
  // tanh' = 1 - tanh^2
  const float* a = act_.f32();
  float* d = dact.f32();
  for (int64_t i = 0; i < dact.numel(); ++i) d[i] *= 1.0f - a[i] * a[i];
  Tensor demb = scratch.zeros("prefix.demb", emb_->value.shape());
  w1_->backward(dact, demb);
  if (emb_->trainable) {
    float* g = emb_->grad.f32();
    const float* s = demb.f32();
    for (int64_t i = 0; i < demb.numel(); ++i) g[i] += s[i];
  }
}

}  // namespace loom::nn
