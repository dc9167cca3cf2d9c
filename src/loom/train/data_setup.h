// From the config's `data` section to the datasets a run trains and validates on.
// A TextCodec says how text becomes tokens for this run (the model's tokenizer, or bytes)
// and which chat template the model expects; build_train_data reads the file (text, or one
// of the dialogue formats), splits off validation, tokenizes (through the on-disk cache)
// and returns the datasets with a summary for the log. Several files (data.path as a list)
// become a data::MixtureDataset blended by weight; their validation rows are concatenated.
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
  std::string source;    // where the tokenizer and chat template came from (for errors)
  data::ChatTemplate chat_template = data::ChatTemplate::Plain;
  std::string default_system;
};

TextCodec bytes_codec();
// The tokenizer and chat template of the model a config names (its tokenizer.json, or the
// tokenizer in its GGUF file).
TextCodec model_codec(const nlohmann::json& model_cfg);
TextCodec codec_for(const io::ModelTokenizer& mt);
// The codec a run's data is tokenized with (data.tokenizer): bytes, or the model's own.
TextCodec data_codec(const DataConfig& data, const nlohmann::json& model_cfg);

// What one data file gave (for the log and `loom data`).
struct SourceStats {
  std::string path, format;          // format: the one used (after auto)
  double share = 1.0;                // of the training samples (its weight over the weights' sum)
  int64_t records = 0, skipped = 0;  // read, and malformed ones skipped (on_error skip)
  int64_t documents = 0, valid_documents = 0;  // text: after splitting at EOS
  int64_t rows = 0, valid_rows = 0;            // training and validation samples of seq_len
  int64_t tokens = 0, target_tokens = 0, truncated = 0, dropped = 0;
  std::string summary;  // one line (and the first skipped records' errors)
};

struct TrainData {
  std::unique_ptr<data::Dataset> train, valid;  // valid may be null
  std::vector<SourceStats> sources;             // one per data file, in config order
  std::string summary;
};

TrainData build_train_data(const DataConfig& cfg, const TextCodec& codec, uint64_t seed);

}  // namespace loom::train
