// Fused AdamW update over a flat range (decoupled weight decay, as torch.optim.AdamW):
//   g = grad_scale * g   (the clipping coefficient, fused here to save a pass over g)
//   p -= lr * wd * p
//   m = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// t is the 1-based step count. One pass over p, g, m, v: the optimizer is memory-bound.
// With `half` the updated p is also written rounded to that 16-bit format (mixed
// precision's working copy of the weight), in the same pass instead of a second one over p.
// With clear_grad g is left zero, ready for the next step's accumulation: a write in this
// pass instead of a separate zeroing pass over every gradient (~27 ms of GPT-2 124M's step).
#pragma once

#include <cstdint>

#include "loom/kernels/cpu/bf16.h"

namespace loom::kernels {

struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based
  float grad_scale = 1.0f;
};

struct HalfOut {
  uint16_t* data = nullptr;  // n elements, or none
  Half format = Half::bf16;
};

void adamw_update(float* p, float* g, float* m, float* v, int64_t n, const AdamWHyper& h,
                  HalfOut half = {}, bool clear_grad = false);
// The same with the gradient held in 16 bits (grad_accum_dtype bf16/fp16), widened as read.
void adamw_update(float* p, const uint16_t* g, Half g_format, float* m, float* v, int64_t n,
                  const AdamWHyper& h, HalfOut half = {});

}  // namespace loom::kernels
