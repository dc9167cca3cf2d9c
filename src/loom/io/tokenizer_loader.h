// The tokenizer (and chat template) that comes with a model: tokenizer.json (+ the
// chat_template of tokenizer_config.json) in an HF folder, or the tokenizer.ggml.* and
// tokenizer.chat_template metadata of a GGUF file. Folders written before checkpoints
// carried a tokenizer.json hold tokenizer_source.json = {"gguf": path} instead; they still
// load, from that GGUF file.
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

// A GGUF file's tokenizer as it stores it (for writing it out as tokenizer.json).
struct GgufTokenizer {
  data::TokenizerSpec spec;
  std::string chat_template;
};
GgufTokenizer read_gguf_tokenizer(const std::filesystem::path& gguf);

// The GGUF file whose metadata holds the tokenizer of `folder_or_gguf`: the path itself for a
// .gguf file, the file tokenizer_source.json names for a folder without tokenizer.json, else
// empty (the tokenizer is the folder's tokenizer.json, or there is none).
std::filesystem::path gguf_tokenizer_source(const std::filesystem::path& folder_or_gguf);

}  // namespace loom::io
