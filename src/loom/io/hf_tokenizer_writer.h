// A GGUF-style vocabulary (data::TokenizerSpec) written as a Hugging Face tokenizer, so that a
// folder fine-tuned from a GGUF file is self-contained:
//   tokenizer.json         BPE over every token (vocab id order, merges as [left, right],
//                          ignore_merges as from_vocab resolves it, no unk, no byte fallback);
//                          control/unknown tokens as special added tokens, user-defined ones
//                          as non-special, all non-normalized; no normalizer; the kind's
//                          pre-tokenizer (see data::PreTokenizer); a TemplateProcessing that
//                          prepends BOS when add_bos, else ByteLevel; ByteLevel decoder.
//   tokenizer_config.json  bos/eos/pad token strings, add_bos_token, the chat template,
//                          tokenizer_class PreTrainedTokenizerFast.
// transformers.AutoTokenizer and tokenizers.Tokenizer.from_file load the pair and encode as
// Tokenizer::from_vocab(spec) does; Tokenizer::from_hf_json reads it back to the same ids,
// specials and fingerprint. Throws loom::Error on a vocabulary a tokenizer.json cannot hold
// (the same token text at two ids).
#pragma once

#include <filesystem>
#include <string>

#include "loom/data/tokenizer.h"

namespace loom::io {

void write_hf_tokenizer(const std::filesystem::path& dir, const data::TokenizerSpec& spec,
                        const std::string& chat_template);

}  // namespace loom::io
