// Loads a model from what users have: a Hugging Face folder (config.json + safetensors)
// or a GGUF file (llama.cpp's format; llama and qwen2 architectures). GGUF weights are
// dequantized to f32 one tensor at a time, with llama.cpp's q/k row order undone.
#pragma once

#include <filesystem>
#include <memory>

#include "loom/models/causal_lm.h"

namespace loom::io {

bool is_gguf(const std::filesystem::path& p);  // a file whose name ends in .gguf
std::unique_ptr<models::CausalLM> load_gguf_model(const std::filesystem::path& file);
std::unique_ptr<models::CausalLM> load_model(const std::filesystem::path& folder_or_gguf);

}  // namespace loom::io
