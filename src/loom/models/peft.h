// Parameter-efficient fine-tuning: which method, and attaching it to a loaded base model.
//   lora    : a LoRA branch on each targeted Linear (nn/lora.h)
//   adapter : Houlsby bottleneck adapters after every block's attention and MLP
//   prefix  : Prefix Tuning, P learned key/value rows per layer (nn/kv_prefix.h)
// apply_peft() freezes every base parameter (except `modules_to_save` and the biases
// `bias` names), declares the method's parameters in the model's ParamStore (marked
// Parameter::adapter, so checkpoints and adapter folders can tell them apart), lays the
// store out again and initialises them as PEFT does. Only trainable parameters get
// gradients and optimizer state from then on.
#pragma once

#include <string>
#include <vector>

#include "loom/models/causal_lm.h"
#include "loom/nn/bottleneck_adapter.h"
#include "loom/nn/lora.h"

namespace loom::models {

struct PeftConfig {
  std::string method;  // "" (none) | lora | adapter | prefix

  // lora: target_modules as PEFT reads them: a list of module names, each matching a
  // module whose name equals it or ends in "." + it; or one string, "all-linear" or a
  // regular expression the whole module name must match.
  nn::LoraSpec lora;
  std::vector<std::string> target_modules;
  std::string target_regex;                  // set instead of target_modules for a string
  std::vector<std::string> modules_to_save;  // trained in full (e.g. lm_head), saved whole
  // Which biases train: none, all (every *.bias, norms' included, as PEFT), or lora_only
  // (those of the LoRA-wrapped layers, saved as "<module>.base_layer.bias" as PEFT does).
  std::string bias = "none";

  nn::AdapterSpec adapter;

  int64_t num_virtual_tokens = 0;
  bool prefix_projection = false;
  int64_t encoder_hidden_size = 0;  // 0: the prefix width (PEFT's default)

  bool enabled() const { return !method.empty(); }
};

void apply_peft(CausalLM& model, const PeftConfig& cfg, uint64_t seed);
// apply_peft without the layout and initialisation: the parameters are declared and the
// flags set, nothing is allocated (for planning memory).
void declare_peft(CausalLM& model, const PeftConfig& cfg);

// True when module `name` (e.g. "model.layers.0.self_attn.q_proj") matches `entry` the way
// PEFT matches one entry of a target_modules / modules_to_save list.
bool peft_name_matches(const std::string& name, const std::string& entry);

}  // namespace loom::models
