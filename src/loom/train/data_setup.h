// From the config's `data` section to the datasets a run trains and validates on.
// A TextCodec says how text becomes tokens for this run (the model's tokenizer, or bytes)
// and which chat template the model expects; build_train_data reads the file (text, or one
// of the dialogue formats), splits off validation, tokenizes (through the on-disk cache)
// and returns the datasets with a one-line summary for the log.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/data/chat_template.h"
#include "loom/data/dataset.h"
#include "loom/data/sft_dataset.h"
#include "loom/io/tokenizer_loader.h"
#include "loom/train/config.h"

namespace loom::train {

struct TextCodec {
  data::EncodeFn encode;
  std::function<std::string(const std::vector<int32_t>&)> decode;
  int32_t eos_id = -1, pad_id = 0;
  std::string eos_text;  // text that encodes to eos (plain template's end of sample)
  std::string id;        // identifies the tokenizer in cache keys
  data::ChatTemplate chat_template = data::ChatTemplate::Plain;
  std::string default_system;
};

TextCodec bytes_codec();
// The tokenizer and chat template of the model a config names (its tokenizer.json, or the
// tokenizer in its GGUF file).
TextCodec model_codec(const nlohmann::json& model_cfg);
TextCodec codec_for(const io::ModelTokenizer& mt);

struct TrainData {
  std::unique_ptr<data::Dataset> train, valid;  // valid may be null
  std::string summary;
};

TrainData build_train_data(const DataConfig& cfg, const TextCodec& codec, uint64_t seed);

}  // namespace loom::train
