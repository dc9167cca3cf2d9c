// Loads a model from what users have: a Hugging Face folder (config.json + safetensors), a
// GGUF file (llama.cpp's format; llama and qwen2 architectures), or a PEFT adapter folder
// (adapter_config.json + adapter_model.safetensors), which loads its base model and then
// attaches the adapter. GGUF weights are dequantized to f32 one tensor at a time, with
// llama.cpp's q/k row order undone, unless keep_quantized asks to keep 2-D weights in
// their ggml blocks (frozen, for PEFT on a quantized base). With `half`, the matrices of
// either format are rounded to 16 bits as each is read (frozen, for inference or PEFT).
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/kernels/cpu/bf16.h"
#include "loom/models/causal_lm.h"
#include "loom/nn/tensor_parallel.h"

namespace loom::io {

struct LoadOptions {
  bool keep_quantized = false;
  // A frozen base in 16 bits (inference with --dtype bf16/fp16; PEFT under mixed precision):
  // each matrix that is not kept quantized (nn::takes_half) is rounded to this format as it
  // is read and held in it alone (nn::hold_in_half), frozen; its f32 value never exists.
  std::optional<kernels::Half> half;
  // Modules (PEFT's modules_to_save entries) whose weights load as f32 even so (neither
  // quantized nor in 16 bits: they train in full).
  std::vector<std::string> keep_f32_modules;
  // For an adapter folder: the base model to use instead of its base_model_name_or_path.
  std::filesystem::path base;
  // The tensor-parallel group to split the model over: each rank keeps its shards (a kept-
  // quantized weight split by input columns must split on whole ggml blocks).
  nn::TensorParallel tp;
  // The pipeline stage to build: only its tensors are read (the others are left to the
  // other stages' ranks).
  models::StageRange stage;

  // Whether hf_name (a parameter's name) belongs to one of keep_f32_modules.
  bool keeps_f32(const std::string& hf_name) const;
  // The format p is loaded into, if `half` applies to it.
  std::optional<kernels::Half> half_for(const nn::Parameter& p) const;
};

bool is_gguf(const std::filesystem::path& p);  // a file whose name ends in .gguf
std::unique_ptr<models::CausalLM> load_gguf_model(const std::filesystem::path& file,
                                                  const LoadOptions& opt = {});
std::unique_ptr<models::CausalLM> load_model(const std::filesystem::path& path,
                                             const LoadOptions& opt = {});
// The Hugging Face config.json of the model load_model would build from `path`, without
// reading its weights (an adapter folder: its base's; `base` as in LoadOptions).
nlohmann::json read_model_config(const std::filesystem::path& path,
                                 const std::filesystem::path& base = {});

}  // namespace loom::io
