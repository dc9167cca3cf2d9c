// Houlsby bottleneck adapter (Houlsby et al. 2019) on a sublayer's output h [N, C]:
//   y = h + up(act(down(h)))      down [bn, C] + bias, up [C, bn] + bias
// up starts at zero, so a fresh adapter is the identity and training starts from the base
// model. Blocks apply one after attention and one after the MLP, before the residual add.
// Names: <block>.attn_adapter.{down,up}.{weight,bias} and <block>.mlp_adapter.*.
//   forward : h [..., C] -> y [..., C]   (saves down's output and act's output)
//   backward: dy -> dh += dy + adapter'(dy)
//   params  : down and up weights and biases (sequence parallel sums their gradients)
#pragma once

#include <string>
#include <vector>

#include "loom/nn/buffers.h"
#include "loom/nn/linear.h"

namespace loom::nn {

struct AdapterSpec {
  int64_t bottleneck = 64;
  std::string activation = "gelu";  // gelu (tanh approximation) | relu
  float init_std = 0.02f;           // down's init; up is zero
};

class BottleneckAdapter {
 public:
  BottleneckAdapter(ParamStore& ps, const std::string& name, int64_t C, const AdapterSpec& s);
  const Tensor& forward(const Tensor& h);
  void backward(const Tensor& dy, const Tensor& dh, Scratch& scratch);
  std::vector<Parameter*> params() const {
    return {down_.weight(), down_.bias(), up_.weight(), up_.bias()};
  }
  void release_activations() {  // activation checkpointing (nn/decoder_block.h)
    down_.release_activations();
    up_.release_activations();
    act_ = y_ = Tensor();
  }

 private:
  AdapterSpec spec_;
  Linear down_, up_;
  Tensor act_, y_;
};

}  // namespace loom::nn
