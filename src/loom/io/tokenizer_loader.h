// The tokenizer (and chat template) that comes with a model: tokenizer.json (+ the
// chat_template of tokenizer_config.json) in an HF folder, or the tokenizer.ggml.* and
// tokenizer.chat_template metadata of a GGUF file.
#pragma once

#include <filesystem>
#include <string>

#include "loom/data/tokenizer.h"

namespace loom::io {

struct ModelTokenizer {
  data::Tokenizer tokenizer;
  std::string chat_template;  // Jinja source; empty when the model has none
};

ModelTokenizer load_tokenizer(const std::filesystem::path& folder_or_gguf);

}  // namespace loom::io
