// Gradient clipping by global L2 norm, torch.nn.utils.clip_grad_norm_'s rule:
// coef = max_norm / (norm + 1e-6), applied only when coef < 1.
// The norm is a local sum of squares (which sharded layouts all-reduce before taking the
// root) and the coefficient is applied by the optimizer as it reads the gradients, so
// clipping costs one pass over the gradients, not two.
#pragma once

#include "loom/tensor/tensor.h"

namespace loom::optim {

double sum_of_squares(const Tensor& flat);  // f32, bf16 or fp16; accumulated in double

// Multiplier for the gradients: 1 when norm <= max_norm or max_norm <= 0 (off).
float clip_coefficient(double global_norm, double max_norm);

}  // namespace loom::optim
