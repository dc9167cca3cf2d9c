#include "loom/optim/adamw.h"

#include "loom/kernels/cpu/adamw.h"
#include "loom/nn/weight_ops.h"
#include "loom/util/error.h"

namespace loom::optim {

AdamW::AdamW(const AdamWConfig& cfg, int64_t state_numel)
    : cfg_(cfg), m_(Tensor::zeros({state_numel})), v_(Tensor::zeros({state_numel})) {}

AdamW::AdamW(nn::ParamStore& ps, const AdamWConfig& cfg) : AdamW(cfg, ps.trainable_numel()) {}

std::vector<AdamW::Segment> AdamW::segments_of(const nn::ParamStore& ps, const AdamWConfig& cfg) {
  std::vector<Segment> segs;
  for (auto& p : ps.all()) {
    if (!p->trainable) continue;
    segs.push_back({p->value.f32(), p->grad.f32(), static_cast<int64_t>(p->grad_offset),
                    p->value.numel(), cfg.decays(p->kind)});
    nn::HalfCopy* h = p->half.get();
    if (h && h->from_value()) {
      if (!h->data.defined()) h->data = nn::half_zeros(p->shape, h->format);
      segs.back().half = {static_cast<uint16_t*>(h->data.raw()), h->format};
    }
  }
  return segs;
}

void AdamW::step(std::span<const Segment> segs, float lr, float grad_scale, bool clear_grads) {
  ++t_;
  for (const Segment& s : segs) {
    LOOM_CHECK(s.state_offset >= 0 && s.state_offset + s.n <= m_.numel(),
               "AdamW: segment outside the optimizer state");
    kernels::AdamWHyper h{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, s.decay ? cfg_.weight_decay : 0.0f,
                          t_, grad_scale};
    float *m = m_.f32() + s.state_offset, *v = v_.f32() + s.state_offset;
    if (s.grad16) {
      LOOM_CHECK(!clear_grads, "internal: AdamW clears f32 gradients only");
      kernels::adamw_update(s.value, s.grad16, s.grad_format, m, v, s.n, h, s.half);
    } else {
      kernels::adamw_update(s.value, s.grad, m, v, s.n, h, s.half, clear_grads);
    }
  }
}

void AdamW::step(nn::ParamStore& ps, float lr, float grad_scale, bool clear_grads) {
  step(segments_of(ps, cfg_), lr, grad_scale, clear_grads);
  for (auto& p : ps.all())
    if (p->trainable && p->half && p->half->from_value()) p->half->stale = false;
}

}  // namespace loom::optim
