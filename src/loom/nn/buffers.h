// Activation buffers. A module owns its outputs and the activations its backward needs,
// (re)allocated only when the batch shape changes. Gradient scratch that is dead after
// one module's backward comes from a Scratch shared by all layers, so its memory does
// not grow with depth: zeroed for a gradient that is accumulated into, or as the slot's
// last user left it for one that its producer writes whole (take: no zeroing pass).
#pragma once

#include <map>
#include <string>

#include "loom/kernels/cpu/elementwise.h"
#include "loom/tensor/tensor.h"

namespace loom::nn {

// Makes t an f32 tensor of `shape`, reallocating only if the shape differs.
inline void ensure(Tensor& t, const Shape& shape) {
  if (!t.defined() || t.shape() != shape) t = Tensor::zeros(shape);
}

class Scratch {
 public:
  // A zero-filled buffer for `slot`; the same slot reuses one allocation.
  Tensor zeros(const std::string& slot, const Shape& shape) {
    Tensor v = take(slot, shape);
    kernels::zero(v.f32(), v.numel());
    return v;
  }
  // The same buffer unzeroed: the caller writes every element before reading any.
  Tensor take(const std::string& slot, const Shape& shape) {
    Tensor& t = slots_[slot];
    if (!t.defined() || t.numel() < shape_numel(shape)) t = Tensor::zeros({shape_numel(shape)});
    return t.slice0(0, shape_numel(shape)).reshape(shape);
  }

 private:
  std::map<std::string, Tensor> slots_;
};

}  // namespace loom::nn
