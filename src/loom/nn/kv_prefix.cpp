#include "loom/nn/kv_prefix.h"

#include <cmath>

#include "loom/util/error.h"

namespace loom::nn {

KVPrefix::KVPrefix(ParamStore& ps, const PrefixSpec& spec, int64_t n_layers, int64_t kv_width,
                   int64_t kv_heads, const TensorParallel& tp)
    : spec_(spec), layers_(n_layers), kvd_full_(kv_width), kvd_(kv_width), tp_(tp) {
  const int64_t P = spec.num_virtual_tokens;
  LOOM_CHECK(P > 0, "prefix tuning: num_virtual_tokens must be positive");
  if (spec_.encoder_hidden <= 0) spec_.encoder_hidden = kvd_full_;
  if (tp.active()) {
    // The attention's split (nn/gqa_attention.h): NKV/tp heads a rank, or one head on
    // tp/NKV ranks.
    const int64_t t = tp.size();
    LOOM_CHECK(kv_heads > 0 && kv_width % kv_heads == 0 && (kv_heads % t == 0 || t % kv_heads == 0),
               "prefix tuning: " + std::to_string(kv_heads) +
                   " key/value heads do not split over tensor_parallel.size " + std::to_string(t));
    replicas_ = t > kv_heads ? static_cast<int>(t / kv_heads) : 1;
    const int64_t slices = t / replicas_;
    kvd_ = kv_width / slices;
    table_shard_ =
        ShardSpec{1, static_cast<int>(2 * n_layers), (tp.rank() / replicas_) * kvd_, kvd_};
  }
  // torch.nn.Embedding starts at normal(0, 1); PEFT keeps that init.
  emb_ = ps.add("prefix_encoder.embedding.weight",
                {P, spec.projection ? kvd_full_ : 2 * layers_ * kvd_full_}, ParamKind::Embedding,
                1.0f, 0.0f, spec.projection ? ShardSpec{} : table_shard_);
  if (spec.projection) {
    const int64_t H = spec_.encoder_hidden;
    w1_ = std::make_unique<Linear>(ps, "prefix_encoder.transform.0", kvd_full_, H, true, 0.0f);
    // Its output rows are the table's columns: 2L blocks split by KV head like the table.
    w2_ = std::make_unique<ColumnParallelLinear>(ps, "prefix_encoder.transform.2", H,
                                                 2 * layers_ * kvd_full_, true, 0.0f, tp,
                                                 static_cast<int>(2 * layers_), replicas_);
    // torch.nn.Linear's init: weight and bias uniform(+-1/sqrt(in)).
    for (Linear* l : {w1_.get(), static_cast<Linear*>(w2_.get())}) {
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
    // grad_ holds this backward's gradient alone (forward zeroed it).
    sum_over_replicas(tp_, replicas_, grad_.f32(), grad_.numel());
    float* g = emb_->grad.f32();
    const float* d = grad_.f32();
    for (int64_t i = 0; i < grad_.numel(); ++i) g[i] += d[i];
    return;
  }
  Tensor dact = scratch.zeros("prefix.dact", act_.shape());
  w2_->backward(grad_, dact);  // sums W2's, b2's gradients over the replicas itself
  // act is replicated and W2 column-parallel: dact [P, H] is this rank's columns' part.
  copy_to_region_backward(tp_, dact);
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
