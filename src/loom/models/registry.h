// Builds a model from a Hugging Face config.json object, dispatching on model_type /
// architectures. `where` names the file (or config key) in errors. `tp`: the tensor-parallel
// group the layers split over (this rank's shards are declared; none: the whole model); `stage`:
// the pipeline stage's layers (models/causal_lm.h; default: all); `buffers`: DeclareOnly for a
// model that is only measured, never run.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "loom/models/causal_lm.h"
#include "loom/nn/tensor_parallel.h"

namespace loom::models {

std::unique_ptr<CausalLM> make_model(const nlohmann::json& hf_config, const std::string& where,
                                     const nn::TensorParallel& tp = {},
                                     const StageRange& stage = {},
                                     ParamBuffers buffers = ParamBuffers::Allocate);

}  // namespace loom::models
