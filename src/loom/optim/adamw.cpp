#include "loom/optim/adamw.h"

#include "loom/kernels/cpu/adamw.h"

namespace loom::optim {

AdamW::AdamW(nn::ParamStore& ps, const AdamWConfig& cfg) : ps_(ps), cfg_(cfg) {
  m_ = Tensor::zeros({ps.trainable_numel()});
  v_ = Tensor::zeros({ps.trainable_numel()});
}

void AdamW::step(float lr, float grad_scale) {
  ++t_;
  for (auto& p : ps_.all()) {
    if (!p->trainable) continue;
    kernels::AdamWHyper h{
        lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.decays(p->kind) ? cfg_.weight_decay : 0.0f,
        t_, grad_scale};
    const size_t off = p->grad_offset;
    kernels::adamw_update(p->value.f32(), p->grad.f32(), m_.f32() + off, v_.f32() + off,
                          p->value.numel(), h);
  }
}

}  // namespace loom::optim
