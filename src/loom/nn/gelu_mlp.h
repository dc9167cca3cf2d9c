// GPT-2 MLP: c_fc [4C, C] -> GELU(tanh) -> c_proj [C, 4C].
//   forward : x [B, T, C] -> y [B, T, C]  (saves pre-activation h [B,T,4C] and GELU(h))
//   backward: dy -> dx += ...             (scratch: dg, dh [B,T,4C])
// Tensor parallel: c_fc column-parallel, c_proj row-parallel (the hidden 4C split); x
// replicated, dx a partial sum (the block applies f's backward). Under sequence parallel
// c_proj reduce-scatters: y and dy are this rank's rows [B*T/tp, C] (nn/linear.h).
#pragma once

#include <string>
#include <vector>

#include "loom/nn/buffers.h"
#include "loom/nn/linear.h"

namespace loom::nn {

class GeluMLP {
 public:
  GeluMLP(ParamStore& ps, const std::string& name, int64_t C, int64_t hidden, float init_std,
          float proj_init_std, const TensorParallel& tp = {});
  const Tensor& forward(const Tensor& x);
  void backward(const Tensor& dy, const Tensor& dx, Scratch& scratch);
  std::vector<Linear*> linears() { return {&c_fc_, &c_proj_}; }
  void release_activations() {  // activation checkpointing (nn/decoder_block.h)
    c_fc_.release_activations();
    c_proj_.release_activations();
    g_ = Tensor();
  }

 private:
  ColumnParallelLinear c_fc_;
  RowParallelLinear c_proj_;
  Tensor g_;  // GELU(h)
};

}  // namespace loom::nn
