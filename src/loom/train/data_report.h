// `loom data CONFIG`: what a run would train on, without training. The config's data
// section is read, split and tokenized exactly as `loom train` does (through the same
// cache), then reported per file: records read and skipped, training and validation rows,
// tokens, truncated and dropped records, the share of row positions that carry loss, the
// file's share of the samples, and the first few rows rendered as text with the trained
// tokens marked, so a wrong template or mask shows before hours are spent.
#pragma once

#include <string>

#include "loom/train/config.h"
#include "loom/train/data_setup.h"

namespace loom::train {

// The report as text; `samples` rows rendered per file.
std::string describe_data(const TrainConfig& cfg, const TextCodec& codec, int samples);

// One row as text: the trained tokens (those some position predicts) inside the kTrainOpen
// and kTrainClose marks, the rest as is; trailing padding is summarised.
inline constexpr const char* kTrainOpen = "\u27e6";   // ⟦
inline constexpr const char* kTrainClose = "\u27e7";  // ⟧
std::string render_row(const data::Dataset& ds, int64_t index, const TextCodec& codec);

}  // namespace loom::train
