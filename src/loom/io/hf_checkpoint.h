// Hugging Face model folders: config.json + model.safetensors (or a sharded index).
// load: builds the model from config.json and fills every parameter, checking names and
//       shapes (errors name the tensor and the file); GPT-2's Conv1D weights are transposed
//       into our [out, in] layout.
// save: writes config.json + model.safetensors in HF layout into a temporary folder beside
//       `dir`, then renames it, so `dir` is either complete or absent.
#pragma once

#include <filesystem>
#include <memory>

#include "loom/models/causal_lm.h"

namespace loom::io {

std::unique_ptr<models::CausalLM> load_hf_model(const std::filesystem::path& dir);
void load_hf_weights(models::CausalLM& model, const std::filesystem::path& file_or_dir);
// tokenizer_from: the model the weights came from; its tokenizer.json and
// tokenizer_config.json are copied in (an HF folder), or, for a GGUF file whose tokenizer
// lives in its metadata, tokenizer_source.json names that file for load_tokenizer.
void save_hf_checkpoint(models::CausalLM& model, const std::filesystem::path& dir,
                        const std::filesystem::path& tokenizer_from = {});

// Reads and parses a JSON file; errors name the file and the line of a syntax error.
nlohmann::json read_json_file(const std::filesystem::path& path);

}  // namespace loom::io
