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
void save_hf_checkpoint(models::CausalLM& model, const std::filesystem::path& dir);

// Reads and parses a JSON file; errors name the file and the line of a syntax error.
nlohmann::json read_json_file(const std::filesystem::path& path);

}  // namespace loom::io
