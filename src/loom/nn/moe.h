// A mixture of experts with optional always-on shared experts: DeepSeekMoE and Qwen2-MoE.
//   y = g(x) shared(x) + sum_k w[t, k] * expert_{e(t, k)}(x[t])   (nn/moe_router.h: e, w)
// Every expert is a SwiGLU MLP of width moe_intermediate_size; the shared experts are one
// SwiGLU MLP (DeepSeek: n_shared * moe_intermediate_size wide, g = 1; Qwen2-MoE: its
// shared_expert_intermediate_size, g = sigmoid(x . w_g) from a [1, C] shared_expert_gate).
// Names follow transformers: <name>.experts.<e>.{gate,up,down}_proj, <name>.gate,
// <name>.shared_experts.{gate,up,down}_proj (Qwen2-MoE: shared_expert, shared_expert_gate).
//   forward : x [B, T, C] -> y [B, T, C]
//   backward: dy -> dx += ...
// Dispatch: the N*K (token, slot) pairs are sorted by expert (tokens in order within an
// expert) into rows xs [N*K, C]; each expert runs once on its rows, and its outputs come
// back to the same sorted rows ys; dw[t, k] = dy[t] . ys[row of (t, k)].
// Expert parallelism (set_expert_parallel, Megatron's and DeepSpeed's): the ep ranks (a
// group inside the data-parallel ranks) each run experts [r E/P, (r+1) E/P) for the tokens
// of every rank of the group. The sorted rows for rank r's experts are contiguous, so the
// exchange is: per-expert row counts (all_to_all_counts), then the rows (all_to_all); the
// received rows [source][expert] are regrouped by expert, run, put back in received order
// and returned with the reverse all_to_all. Backward runs the same exchanges on the
// gradients. Every rank of the group must run the same MoE layers in the same order.
// A rank declares only its slice of the routed experts (MoeSpec::ep_size / ep_rank, the
// same split set_expert_parallel runs), marked Parameter::expert: ZeroEngine reduces their
// gradients over the dp ranks holding the same slice, and checkpoints write each slice
// from its own rank.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/dist/communicator.h"
#include "loom/nn/buffers.h"
#include "loom/nn/moe_router.h"
#include "loom/nn/swiglu_mlp.h"

namespace loom::nn {

struct MoeSpec {
  int64_t hidden = 0, inter = 0;  // moe_intermediate_size
  int64_t n_shared = 0;
  // Qwen2-MoE's shared expert: its own width (0: n_shared * inter), module name, and the
  // sigmoid gate on its output.
  int64_t shared_width = 0;
  std::string shared_name = "shared_experts";
  bool shared_gate = false;
  RouterSpec router;
  // The routed experts this rank declares: [ep_rank E / ep_size, (ep_rank + 1) E / ep_size).
  int ep_size = 1, ep_rank = 0;
};

struct ExpertParallel {
  dist::Communicator* comm = nullptr;  // the ep group; null: one rank runs every expert
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
  bool active() const { return size() > 1; }
};

class MoE {
 public:
  MoE(ParamStore& ps, const std::string& name, const MoeSpec& s, float init_std);
  const Tensor& forward(const Tensor& x);
  void backward(const Tensor& dy, const Tensor& dx, Scratch& scratch);
  std::vector<Linear*> linears();
  void release_activations();
  Router& router() { return router_; }
  // Runs the routed experts over ep's ranks: its size and rank must be the split the layer
  // was declared with (MoeSpec).
  void set_expert_parallel(const ExpertParallel& ep);
  // Whether routed expert e is one of this rank's (MoeSpec's slice).
  bool holds_expert(int64_t e) const;
  // Floats this rank sent to other ranks in its last forward's token exchange (the
  // returns of backward's exchange are the same amount again).
  int64_t dispatch_floats() const { return dispatched_; }

 private:
  // Rows in the sorted order [N*K, W] -> this rank's experts' rows in expert order [R, W]
  // (exchanged under EP; the same tensor on one rank). `into` holds the result.
  const Tensor& to_experts(const Tensor& sorted, Tensor& into);
  // Under EP, the reverse: expert-order rows [R, W] -> the sorted order [N*K, W] in `into`
  // (on one rank the experts write the sorted rows directly).
  void from_experts(const Tensor& rows, const Tensor& into);
  // LoRA dropout on the experts: each expert row's mask is keyed by its token's row in the
  // global batch (rows_, exchanged with the tokens under EP), not by its place among the
  // expert's rows, so every layout drops what one process drops.
  void key_expert_dropout(int64_t N);

  MoeSpec s_;
  std::vector<std::unique_ptr<SwiGluMLP>> experts_;  // this rank's slice, in expert order
  Router router_;
  std::optional<SwiGluMLP> shared_;
  std::optional<Linear> shared_gate_;  // [1, C]
  Tensor sg_;                          // [N] the gate's sigmoid of the last forward
  ExpertParallel ep_;
  std::vector<int64_t> off_;   // [E + 1]: expert e's rows of xs_
  std::vector<int64_t> slot_;  // [N*K]: row of xs_ that (token t, slot k) went to
  // Under EP: rows to / from each rank, per-expert counts received ([source][local expert]),
  // and where received row i sits in the expert order.
  std::vector<int64_t> send_rows_, recv_rows_, recv_per_, perm_;
  std::vector<int64_t> eoff_;  // [local experts + 1]: their rows in the expert order
  std::vector<int64_t> rows_;  // [R]: the global batch row of each expert-order row
  int64_t dispatched_ = 0;
  Tensor xs_;  // [N*K, C] the tokens' rows in expert order
  Tensor xr_;  // [R, C] under EP: the rows this rank's experts run on
  Tensor ys_;  // [N*K, C] the experts' outputs, sorted as xs_
  Tensor y_;   // [B, T, C]
  // Under EP, grown as needed: the exchanges' staging rows and the experts' outputs.
  Tensor wire_, out_;
};

}  // namespace loom::nn
