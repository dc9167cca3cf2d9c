// The training engine. One step, top to bottom (see step()):
//   data -> forward/backward per micro-batch -> grad sync -> clip -> optimizer -> param sync
// The step's loss is the mean over every target token of the whole step's batch: the
// token count is known before the first backward, so each micro-batch's gradient is
// scaled by 1 / (tokens in the step) and accumulation equals one big batch exactly.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>

#include "loom/data/dataset.h"
#include "loom/data/sampler.h"
#include "loom/io/model_loader.h"
#include "loom/models/causal_lm.h"
#include "loom/optim/adamw.h"
#include "loom/optim/schedule.h"
#include "loom/train/config.h"
#include "loom/train/data_setup.h"

namespace loom::train {

struct StepStats {
  int64_t step = 0;   // 0-based index of the step just taken
  double loss = 0.0;  // mean over the step's target tokens
  double lr = 0.0;
  double grad_norm = 0.0;  // pre-clip global L2 norm
  int64_t tokens = 0;      // input tokens processed this step
  int64_t target_tokens = 0;
  double seconds = 0.0;
};

// Builds the model a config names: a path (HF folder, GGUF file, adapter folder), or
// {"path", "keep_quantized"}, or {"arch": "gpt2", sizes...} initialised from `seed`.
std::unique_ptr<models::CausalLM> build_model(const nlohmann::json& model_cfg, uint64_t seed,
                                              const std::string& where, io::LoadOptions opt = {});
std::string model_path(const nlohmann::json& model_cfg);  // "" for a model built from sizes

class Trainer {
 public:
  // Reads the dataset cfg.data names; or uses `dataset` (benchmarks, tests).
  explicit Trainer(const TrainConfig& cfg, std::unique_ptr<data::Dataset> dataset = nullptr);
  StepStats step();  // one optimizer step
  // Mean loss over every target token of the validation set (NaN when there is none).
  double evaluate();
  // Runs cfg.train_steps steps, writes metrics.jsonl, prints progress, saves the final
  // checkpoint to output_dir/checkpoint-final.
  void run();
  models::CausalLM& model() { return *model_; }
  const optim::AdamW& optimizer() const { return *opt_; }
  int64_t steps_done() const { return step_; }

  // Bytes of model state (weights as held: f32 and quantized blocks; gradients and AdamW
  // moments of the trainable parameters only) and what a step adds on top.
  struct MemoryReport {
    int64_t weights = 0, grads = 0, optimizer = 0, activations = 0, peak_rss = 0;
  };
  MemoryReport memory_report() const;

 private:
  TrainConfig cfg_;
  std::unique_ptr<models::CausalLM> model_;
  std::unique_ptr<data::Dataset> data_, valid_;
  std::string data_summary_;
  std::unique_ptr<data::Sampler> sampler_;
  std::unique_ptr<optim::AdamW> opt_;
  optim::Schedule sched_;
  int64_t step_ = 0;
};

}  // namespace loom::train
