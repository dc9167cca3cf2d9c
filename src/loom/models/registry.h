// Builds a model from a Hugging Face config.json object, dispatching on model_type /
// architectures. `where` names the file (or config key) in errors.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "loom/models/causal_lm.h"

namespace loom::models {

std::unique_ptr<CausalLM> make_model(const nlohmann::json& hf_config, const std::string& where);

}  // namespace loom::models
