// PEFT adapter folders, as Hugging Face PEFT writes and reads them:
//   adapter_config.json        peft_type, task_type, base_model_name_or_path and the
//                              method's keys (LoRA: r, lora_alpha, lora_dropout,
//                              target_modules, bias, use_rslora, modules_to_save, ...;
//                              Prefix Tuning: num_virtual_tokens, token_dim, num_layers, ...)
//   adapter_model.safetensors  LoRA: "base_model.model.<module>.lora_A.weight" [r, in] and
//                              lora_B [out, r], plus modules_to_save / trained biases under
//                              "base_model.model.<name>"; Prefix Tuning: "prompt_embeddings"
//                              [P, L * 2 * KVD] (the projected table when prefix_projection)
// LoRA and Prefix Tuning folders load with peft.PeftModel.from_pretrained. Bottleneck
// adapters have no PEFT type; Loom writes them in the same layout with peft_type
// "LOOM_BOTTLENECK_ADAPTER", for Loom to read back. Folders are written atomically.
#pragma once

#include <filesystem>
#include <memory>

#include "loom/io/model_loader.h"
#include "loom/models/causal_lm.h"
#include "loom/models/peft.h"

namespace loom::io {

bool is_adapter_folder(const std::filesystem::path& p);  // holds adapter_config.json

struct AdapterFolder {
  models::PeftConfig config;
  std::filesystem::path base;  // base_model_name_or_path, as written
};
// Reads adapter_config.json; unsupported options (DoRA, layer patterns, per-module ranks,
// other PEFT types) are errors naming the key.
AdapterFolder read_adapter_config(const std::filesystem::path& dir);

// Fills the adapter's parameters of a model that apply_peft() has prepared with the
// folder's config; a missing, extra or misshapen tensor is an error naming it.
void load_adapter_weights(models::CausalLM& model, const std::filesystem::path& dir);

// The base model (opt.base, else base_model_name_or_path: a relative one is looked up from
// the working directory, then from the adapter folder) with the adapter attached.
std::unique_ptr<models::CausalLM> load_adapter_model(const std::filesystem::path& dir,
                                                     const LoadOptions& opt);

// Writes the trainable PEFT state of `model` (and the tokenizer, as save_hf_checkpoint).
void save_adapter(models::CausalLM& model, const models::PeftConfig& cfg,
                  const std::filesystem::path& dir, const std::string& base_model_name_or_path,
                  const std::filesystem::path& tokenizer_from = {});
// The parts of save_adapter, for a model whose pipeline stages each write theirs: the
// adapter tensors `model` holds (full tensors) into one safetensors file; the config and
// tokenizer files; and the stages' files merged into adapter_model.safetensors (PEFT reads
// one file), the parts removed. experts_only as in write_hf_weights.
void write_adapter_weights(models::CausalLM& model, const std::filesystem::path& file,
                           bool experts_only = false);
void write_adapter_config(models::CausalLM& model, const models::PeftConfig& cfg,
                          const std::filesystem::path& dir,
                          const std::string& base_model_name_or_path,
                          const std::filesystem::path& tokenizer_from);
void merge_adapter_weights(const std::filesystem::path& dir,
                           const std::vector<std::filesystem::path>& parts);

}  // namespace loom::io
