// Activation buffers. A module owns its outputs and the activations its backward needs,
// (re)allocated only when the batch shape changes. Gradient scratch that is dead after
// one module's backward comes from a Scratch shared by all layers, so its memory does
// not grow with depth.
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
    Tensor& t = slots_[slot];
    if (t.defined() && t.numel() >= shape_numel(shape)) {
      Tensor v = t.slice0(0, shape_numel(shape)).reshape(shape);
      kernels::zero(v.f32(), v.numel());
      return v;
    }
    t = Tensor::zeros({shape_numel(shape)});
    return t.reshape(shape);
  }

 private:
  std::map<std::string, Tensor> slots_;
};

}  // namespace loom::nn
