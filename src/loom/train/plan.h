// `loom plan CONFIG --world N`: the memory each rank will hold, for every ZeRO stage, before
// anything is allocated. The model is built from its config alone (its parameters are laid
// out in lazily mapped memory that nothing writes, so no weights are read and nothing
// becomes resident), PEFT attached as the config says, and the figures come from the same
// arithmetic the engine logs at start (parallel::ZeroPartition::memory); activations are the
// model's own estimate for one micro-batch (CausalLM::activation_bytes).
#pragma once

#include <string>

#include "loom/train/config.h"

namespace loom::train {

std::string plan_report(const TrainConfig& cfg, int world);

}  // namespace loom::train
