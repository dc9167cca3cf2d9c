// The training config: a JSON file whose DeepSpeed keys keep DeepSpeed's meaning
// (train_micro_batch_size_per_gpu, gradient_accumulation_steps, train_batch_size,
// optimizer{type,params}, scheduler{type,params}, gradient_clipping, steps_per_print,
// wall_clock_breakdown) plus loom's own (model, data, train_steps, seed, output_dir,
// no_decay, peft, trace, activation_checkpointing (Megatron's recompute), ...). Unknown keys, wrong
// types and inconsistent batch sizes are errors naming the key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/models/causal_lm.h"
#include "loom/models/peft.h"
#include "loom/optim/adamw.h"
#include "loom/optim/loss_scaler.h"
#include "loom/optim/schedule.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/zero.h"

namespace loom::train {

// One data file and how it is read; several are mixed by weight (data/mixture.h).
struct DataSource {
  std::string path;
  std::string format = "auto";  // auto | text | prompt_response | alpaca | sharegpt | messages
  double weight = 1.0;
};

struct DataConfig {
  std::vector<DataSource> sources;     // data.path: one file, or a list of {path, format, weight}
  std::string format = "auto";         // the sources' format unless they name their own
  std::string tokenizer = "model";     // model (the model's own) | bytes (one token per byte)
  std::string chat_template = "auto";  // auto (from the model) | chatml | llama3 | plain
  int64_t seq_len = 128;
  bool shuffle = true;
  bool pack = false;
  bool train_on_prompt = false;
  double valid_fraction = 0.0;
  std::string valid_path;
  std::string on_error = "stop";  // stop | skip
  std::string cache_dir;          // tokenized-data cache; empty: ~/.cache/loom/tokenized
};

// DeepSpeed's "tensorboard" and "csv_monitor" sections (train/monitor.h): files go to
// output_path/job_name; an empty output_path means the run's output_dir.
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";  // DeepSpeed's default
  std::filesystem::path dir(const std::string& output_dir) const {
    return std::filesystem::path(output_path.empty() ? output_dir : output_path) / job_name;
  }
};

struct TrainConfig {
  nlohmann::json model;  // a path string, or {"path", "keep_quantized"}, or {"arch", sizes...}
  // PEFT: the method to attach, or (peft_from) a saved adapter folder to train further.
  models::PeftConfig peft;
  std::string peft_from;
  DataConfig data;
  int64_t micro_batch = 1, grad_accum = 1, train_batch = 1;
  int64_t train_steps = 100;
  uint64_t seed = 42;
  std::string output_dir = "out";
  optim::AdamWConfig adamw;
  nlohmann::json scheduler;  // null: constant lr
  double gradient_clipping = 0.0;
  int64_t steps_per_print = 10;
  int64_t eval_interval = 0;  // steps between validation passes (0: only at the end)
  bool wall_clock_breakdown = false;
  MonitorConfig tensorboard, csv_monitor;
  // The schedule trace's file (dist/job_trace.h); empty: off. "trace": true in the config
  // means output_dir/trace.json; `loom train --trace FILE` sets it directly.
  std::string trace_path;
  // zero_optimization: stage, reduce_bucket_size; and communication_data_type (zero.comm)
  parallel::ZeroConfig zero;
  int tensor_parallel = 1;            // tensor_parallel.size
  bool sequence_parallel = false;     // tensor_parallel.sequence_parallel
  parallel::PipelineConfig pipeline;  // pipeline_parallel
  // Mixed precision, DeepSpeed's sections: "bf16" {enabled}, "fp16" {enabled, loss_scale,
  // initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis,
  // min_loss_scale} and "data_types" {grad_accum_dtype}. The Trainer runs the products in
  // the 16-bit format over fp32 master weights (train/trainer.h); 16-bit gradient
  // accumulation (grad_accum_dtype = the run's 16-bit format) holds the ZeRO-2/3 shard's
  // gradients in 16 bits (parallel/zero.h); the Trainer refuses it at stages 0-1.
  enum class Precision { fp32, bf16, fp16 };
  Precision precision = Precision::fp32;
  optim::LossScaleConfig loss_scale;  // fp16's keys
  std::string grad_accum_dtype = "fp32";
  // Training runs the LM head and its loss 256 token rows at a time (models/causal_lm.h).
  models::ActivationCheckpointing activation_checkpointing{.loss_chunk_rows = 256};
  int data_parallel = 1;  // world / (tensor_parallel x pipeline.size): train_batch's rule uses it
  // moe.bias_update_rate: DeepSeek-V3's auxiliary-loss-free balancing step (Megatron's
  // moe_router_bias_update_rate; the paper's gamma, 1e-3); 0 (default): the bias stays.
  double moe_bias_update_rate = 0.0;
  // expert_parallel.size: ranks (inside the data-parallel group) the routed experts of a
  // mixture-of-experts model split over (nn/moe.h); 1: every rank runs every expert.
  int expert_parallel = 1;
  int64_t checkpoint_interval = 0;  // steps between checkpoints (0: only the final one)
  // A rank waiting longer than this in one collective or point-to-point call ends the job,
  // naming the call and the ranks that did not arrive (dist/watchdog.h); 0: no watchdog.
  double comm_timeout_s = 1800.0;
  std::string resume_from;  // a checkpoint folder to continue from
  nlohmann::json raw;       // the resolved JSON, saved beside the outputs
};

// Applies one `--set key.path=value` override; value is parsed as JSON when it is valid
// JSON, else taken as a string. Errors name the override.
void apply_override(nlohmann::json& j, const std::string& assignment);

// The activation_checkpointing setting in words for the logs: "" (none), "selective
// activation checkpointing", "full activation checkpointing (uniform, 1 layer)".
std::string checkpointing_str(const models::ActivationCheckpointing& ac);

// Validates and resolves a config. `where` names the file in errors; world_size is the
// number of ranks. DeepSpeed's batch rule uses the data-parallel size dp = world /
// (tensor_parallel.size x pipeline_parallel.size): train = micro * accum * dp.
TrainConfig parse_config(const nlohmann::json& j, const std::string& where, int64_t world_size);

TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& sets,
                        int64_t world_size);

const char* precision_name(const TrainConfig& cfg);  // "fp32", "bf16" or "fp16"

}  // namespace loom::train
