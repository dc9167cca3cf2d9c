// DeepSeekMoE: fine-grained routed experts plus always-on shared experts.
//   y = shared(x) + sum_k w[t, k] * expert_{e(t, k)}(x[t])     (nn/moe_router.h chooses e, w)
// Every expert is a SwiGLU MLP of width moe_intermediate_size; the shared experts are one
// SwiGLU MLP of width n_shared * moe_intermediate_size (absent when n_shared is 0).
// Names follow transformers: <name>.experts.<e>.{gate,up,down}_proj, <name>.gate,
// <name>.shared_experts.{gate,up,down}_proj.
//   forward : x [B, T, C] -> y [B, T, C]
//   backward: dy -> dx += ...
// Dispatch: the N*K (token, slot) pairs are sorted by expert (tokens in order within an
// expert) into rows xs [N*K, C]; expert e runs once on its rows [off[e], off[e+1]). That
// sorted layout is what an expert-parallel exchange sends. dw[t, k] = dy[t] . expert output.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/nn/buffers.h"
#include "loom/nn/moe_router.h"
#include "loom/nn/swiglu_mlp.h"

namespace loom::nn {

struct MoeSpec {
  int64_t hidden = 0, inter = 0;  // moe_intermediate_size
  int64_t n_shared = 0;
  RouterSpec router;
};

class MoE {
 public:
  MoE(ParamStore& ps, const std::string& name, const MoeSpec& s, float init_std);
  const Tensor& forward(const Tensor& x);
  void backward(const Tensor& dy, const Tensor& dx, Scratch& scratch);
  std::vector<Linear*> linears();
  void release_activations();
  Router& router() { return router_; }

 private:
  MoeSpec s_;
  std::vector<std::unique_ptr<SwiGluMLP>> experts_;
  Router router_;
  std::optional<SwiGluMLP> shared_;
  std::vector<int64_t> off_;   // [E + 1]: expert e's rows of xs_
  std::vector<int64_t> slot_;  // [N*K]: row of xs_ that (token t, slot k) went to
  Tensor xs_;                  // [N*K, C] the tokens' rows in expert order
  Tensor y_;                   // [B, T, C]
};

}  // namespace loom::nn
