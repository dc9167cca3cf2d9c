// Where a run's numbers go. Rank 0 owns the Monitor; every row the trainer records goes to
// output_dir/metrics.jsonl (one JSON object per line: a "run" row when a process starts, a
// row per step {step, loss, lr, grad_norm, tokens_per_s, rss_bytes[rank], ...}, eval rows
// {step, eval_loss}, a "stopped" row, a closing "memory" row) and, when the config enables
// them, to DeepSpeed's monitors with DeepSpeed's names and x axis (samples seen = step x
// train_batch_size):
//   tensorboard: event files in output_path/job_name (io/tb_events.h);
//   csv_monitor: output_path/job_name/<name with '/' as '_'>.csv, header "step,<last part>".
// Scalars: Train/Samples/train_loss, lr, loss_scale (fp16) as DeepSpeed logs them, and
// Loom's grad_norm, tokens_per_s, eval_loss, rss_mib_rank<r>.
// A resumed run (after step k) keeps what the earlier run wrote up to step k and drops the
// rest, so the files read as one run. A failed write is an error naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "loom/io/tb_events.h"
#include "loom/train/config.h"

namespace loom::train {

class Monitor {
 public:
  // resume_step: the step the run continues after (0: a fresh run, which starts the files
  // afresh).
  Monitor(const TrainConfig& cfg, int64_t resume_step);
  void record(const nlohmann::json& row);

  // The monitors' scalars of one metrics row, (tag, value) at DeepSpeed's x (samples).
  static std::vector<std::pair<std::string, double>> scalars_of(const nlohmann::json& row);

 private:
  void write_csv(int64_t x, const std::string& tag, double value);
  std::filesystem::path metrics_path_;
  std::ofstream metrics_;
  int64_t train_batch_;
  int64_t resume_samples_;
  std::unique_ptr<io::TbEventWriter> tb_;
  std::filesystem::path csv_dir_;  // empty: csv_monitor off
  std::set<std::string> csv_started_;
  bool eval_at_resume_ = false;  // the earlier run's eval row at the resume step was kept
};

}  // namespace loom::train
