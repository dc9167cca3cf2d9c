// What a decoder needs of a normalisation layer (LayerNorm for GPT-2, RMSNorm for the Llama
// family), so the final norm can be either; blocks hold the concrete type.
//   forward : x [..., C] -> y [..., C]   (owned by the layer, saved for backward)
//   backward: dy -> dx += ...
//   params  : its parameters (sequence parallel sums their gradients over the tp group)
//   release_activations: drops x, y and the statistics (activation checkpointing: the
//                        next forward allocates them again; backward needs a forward first)
#pragma once

#include <vector>

#include "loom/nn/parameter.h"
#include "loom/tensor/tensor.h"

namespace loom::nn {

class Norm {
 public:
  virtual ~Norm() = default;
  virtual const Tensor& forward(const Tensor& x) = 0;
  virtual void backward(const Tensor& dy, const Tensor& dx) = 0;
  virtual const Tensor& output() const = 0;  // last forward's y
  virtual std::vector<Parameter*> params() const = 0;
  virtual void release_activations() = 0;
};

}  // namespace loom::nn
