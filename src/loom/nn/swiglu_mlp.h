// Llama-family MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases.
//   forward : x [B, T, C] -> y [B, T, C]   (saves gate and up outputs [B,T,I], h = swiglu)
//   backward: dy -> dx += ...              (scratch: dh, dg, du [B,T,I])
// Tensor parallel: gate and up column-parallel, down row-parallel (I split); x replicated,
// dx a partial sum (the block applies f's backward). Under sequence parallel down_proj
// reduce-scatters: y and dy are this rank's rows [B*T/tp, C] (nn/linear.h).
#pragma once

#include <string>
#include <vector>

#include "loom/nn/buffers.h"
#include "loom/nn/linear.h"

namespace loom::nn {

class SwiGluMLP {
 public:
  SwiGluMLP(ParamStore& ps, const std::string& name, int64_t C, int64_t inter, float init_std,
            const TensorParallel& tp = {});
  const Tensor& forward(const Tensor& x);
  void backward(const Tensor& dy, const Tensor& dx, Scratch& scratch);
  const Tensor& output() const { return down_.output(); }  // the last forward's
  std::vector<Linear*> linears() { return {&gate_, &up_, &down_}; }
  void release_activations() {  // activation checkpointing (nn/decoder_block.h)
    for (Linear* l : linears()) l->release_activations();
    h_ = Tensor();
  }

 private:
  ColumnParallelLinear gate_, up_;
  RowParallelLinear down_;
  Tensor h_;
};

}  // namespace loom::nn
