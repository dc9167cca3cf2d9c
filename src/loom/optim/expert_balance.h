// DeepSeek-V3's auxiliary-loss-free load balancing, and the load statistics every MoE run
// reports. After each step, for every mixture-of-experts layer: the tokens each routed
// expert took in the step's training passes (nn::Router::load, this rank's) are summed over
// `group` (all data-parallel ranks: together they saw the global batch), and, when `rate`
// > 0 and the router has a correction bias, each expert's bias moves by
//   rate * sign(mean load - its load)
// (an overloaded expert's bias falls, an underloaded one's rises; the bias only chooses
// experts, never weighs them). Every rank applies the same update to its copy. The counts
// are then reset.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/dist/communicator.h"
#include "loom/models/causal_lm.h"

namespace loom::optim {

struct ExpertLoad {
  int64_t layer = 0;
  int64_t min = 0, max = 0;  // tokens of the least and most loaded expert
  double mean = 0.0;
  float bias_min = 0.0f, bias_max = 0.0f;  // after the update (0 without a bias)
  // Expert parallelism: bytes this rank sent to other ranks in the layer's forward token
  // exchange of its last micro-batch (returns and backward's exchanges send as much again
  // each); 0 without.
  int64_t dispatch_bytes = 0;
  // V2's balance loss over the global batch (nn/moe_router.h), summed over the ranks; 0 off.
  double aux_loss = 0.0;
};

std::vector<ExpertLoad> balance_experts(const std::vector<models::MoeLayer>& layers,
                                        dist::Communicator& group, float rate);

}  // namespace loom::optim
