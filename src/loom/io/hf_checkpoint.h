// Hugging Face model folders: config.json + model.safetensors (or a sharded index).
// load: builds the model from config.json and fills every parameter, checking names and
//       shapes (errors name the tensor and the file); GPT-2's Conv1D weights are transposed
//       into our [out, in] layout.
// save: writes config.json + model.safetensors in HF layout (f32) into a temporary folder
//       beside `dir`, then renames it, so `dir` is either complete or absent. Quantized
//       weights are written dequantized and LoRA branches merged into their weights (what
//       `loom export --merge` produces); bottleneck adapters and prefixes cannot be merged
//       and make it throw.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>

#include "loom/io/model_loader.h"
#include "loom/io/safetensors.h"
#include "loom/models/causal_lm.h"

namespace loom::io {

class SafetensorsCheckpoint;

// opt: its tp, stage and half (the other options are GGUF's or an adapter folder's).
std::unique_ptr<models::CausalLM> load_hf_model(const std::filesystem::path& dir,
                                                const LoadOptions& opt = {});
// Fills p from the checkpoint's tensor `key` (its full shape; transposed when the model
// says HF stores p transposed), keeping this rank's shard of it; with `half`, rounded into
// 16 bits and held so (nn::hold_in_half) instead of written to p's f32 slot.
void read_param(const SafetensorsCheckpoint& ck, const std::string& key,
                const models::CausalLM& model, nn::Parameter& p,
                std::optional<kernels::Half> half = std::nullopt);
// Every parameter of model from the checkpoint; the matrices opt.half_for() names go into
// 16 bits (then the store is laid out again without their f32 slots).
void load_hf_weights(models::CausalLM& model, const std::filesystem::path& file_or_dir,
                     const LoadOptions& opt = {});
// tokenizer_from: the model the weights came from; its tokenizer files go in beside the
// weights (write_tokenizer_files).
// dtype: the stored weights' type, F32 or BF16 (rounded to nearest even; config.json's
// torch_dtype says which); anything else is an error naming it.
void save_hf_checkpoint(models::CausalLM& model, const std::filesystem::path& dir,
                        const std::filesystem::path& tokenizer_from = {},
                        StDType dtype = StDType::F32);
// The parts of save_hf_checkpoint, for a model whose pipeline stages each write theirs:
// the weights `model` holds (full tensors; LoRA merged in; a tied embedding's stage copy
// left to the first stage) into one safetensors file; config.json and the tokenizer files;
// and, for a folder of `parts` weight files (hf_weights_file(s, parts) for s < parts), the
// model.safetensors.index.json transformers reads them by. experts_only: only the routed
// experts' tensors (nn::Parameter::expert; what an expert-parallel rank adds to the first's).
void write_hf_weights(models::CausalLM& model, const std::filesystem::path& file,
                      StDType dtype = StDType::F32, bool experts_only = false);
void write_hf_config(models::CausalLM& model, const std::filesystem::path& dir,
                     const std::filesystem::path& tokenizer_from, StDType dtype = StDType::F32);
std::string hf_weights_file(int part, int parts);  // model.safetensors, model-00001-of-00004...
void write_hf_index(const std::filesystem::path& dir, int parts);

// Reads and parses a JSON file; errors name the file and the line of a syntax error.
nlohmann::json read_json_file(const std::filesystem::path& path);
// Writes j indented; a string that is not valid UTF-8 is an error naming the file.
void write_json_file(const std::filesystem::path& path, const nlohmann::json& j);
void write_json_file(const std::filesystem::path& path, const nlohmann::ordered_json& j);

// Output folders appear whole or not at all: fill() writes into a temporary folder beside
// `dir`, which then replaces `dir`; on an exception the temporary folder is removed.
void write_folder_atomically(const std::filesystem::path& dir,
                             const std::function<void(const std::filesystem::path&)>& fill);
// Copies tokenizer.json, tokenizer_config.json and special_tokens_map.json from an HF folder;
// for a GGUF file (or an older folder whose tokenizer_source.json names one) writes them from
// its tokenizer metadata (write_hf_tokenizer), so the folder needs no other file to load.
// Nothing for an empty path.
void write_tokenizer_files(const std::filesystem::path& dir,
                           const std::filesystem::path& tokenizer_from);

}  // namespace loom::io
