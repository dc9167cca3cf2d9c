// The router of a DeepSeek mixture-of-experts layer: which top-k of E routed experts each
// token goes to, and with what weight. Names follow transformers: <name>.weight [E, C]
// (ParamKind::Router: fp32 under mixed precision) and, for V3, <name>.e_score_correction_bias
// [E] (ParamKind::Buffer: moved by the load-balancing rule, never by the optimizer).
//   logits l = x Wg^T [N, E]; scores s = sigmoid(l) (V3) or softmax(l) (V2)
//   choice c = s + bias (V3) or s (V2); with n_group > 1 the experts are n_group groups of
//     E/n_group, each group scored (V3: the sum of its two best c; V2: its best s) and only
//     the topk_group best groups' experts may be chosen
//   the top_k experts by c are the token's; their weights are s at those experts,
//     divided by their sum (+1e-20) when norm_topk_prob, times routed_scaling_factor.
// The bias only chooses; the weights and their gradient use s. (transformers' V2 router
// ignores norm_topk_prob; DeepSeek's own V2 code honours it, as here.)
// V2's sequence-wise balance loss (aux_loss_alpha, seq_aux; DeepSeek's code, which
// transformers leaves out): for each sequence b of T tokens
//   aux_b = sum_e ce[b, e] * P[b, e],  ce = (tokens of b routed to e) E / (T K),
//   P = the mean over b's tokens of s[., e]
// and the loss gains alpha * (sum over the global batch's sequences of aux_b) / (their
// number): set_aux_loss gives alpha / that number (and fp16's loss scale for the gradient).
//   forward : x [N, C] -> experts() [N, K] (int32), weights() [N, K]; counts() [E] tokens
//             per expert of this forward (load statistics)
//   backward: dweights [N, K] -> dx += ..., dWg += ... (when trainable); adds counts() to
//             load(): the tokens each expert took in this step's training passes (counted
//             once per micro-batch however often a recompute repeats the forward)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/nn/parameter.h"

namespace loom::nn {

struct RouterSpec {
  int64_t hidden = 0, n_experts = 0, top_k = 1;
  bool sigmoid = true;      // V3 (sigmoid scores); false: V2 (softmax)
  bool score_bias = false;  // V3's e_score_correction_bias
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = false;
  float scaling = 1.0f;    // routed_scaling_factor
  float aux_alpha = 0.0f;  // V2's aux_loss_alpha (softmax scoring only)
};

class Router {
 public:
  Router(ParamStore& ps, const std::string& name, const RouterSpec& s, float init_std);
  void forward(const Tensor& x);
  void backward(const Tensor& dweights, const Tensor& dx);
  const std::vector<int32_t>& experts() const { return idx_; }
  const Tensor& weights() const { return w_; }
  const std::vector<int64_t>& counts() const { return counts_; }
  std::vector<int64_t>& load() { return load_; }  // the step's; the balancing rule resets it
  // The balance loss's weight this step: aux_alpha * per_sequence (1 / the global batch's
  // sequences), its gradient times grad_scale. Then aux_loss() is the step's sum of it over
  // this rank's training passes (the balancing rule resets it).
  void set_aux_loss(double per_sequence, double grad_scale);
  double& aux_loss() { return aux_sum_; }
  double last_aux_loss() const { return aux_value_; }  // of the last forward
  const RouterSpec& spec() const { return s_; }
  Parameter* weight() const { return wg_; }
  Parameter* bias() const { return bias_; }  // nullptr for V2
  void release_activations() { x_ = scores_ = w_ = ce_ = Tensor(); }

 private:
  // Row n's choice: idx_[n*K ..] and w_[n*K ..] from scores_ row n.
  void choose(int64_t n);

  RouterSpec s_;
  Parameter* wg_;
  Parameter* bias_ = nullptr;
  Tensor x_;       // [N, C] the forward's input
  Tensor scores_;  // [N, E] s
  Tensor w_;       // [N, K]
  std::vector<int32_t> idx_;
  std::vector<int64_t> counts_;
  std::vector<int64_t> load_;
  double aux_weight_ = 0.0, aux_grad_scale_ = 1.0, aux_sum_ = 0.0, aux_value_ = 0.0;
  int64_t seq_ = 1;  // T: tokens per sequence of the last forward
  Tensor ce_;        // [B, E] the balance loss's ce of the last forward
};

}  // namespace loom::nn
