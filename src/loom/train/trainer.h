// The training engine. One step, top to bottom (see step()):
//   data -> forward/backward per micro-batch -> grad sync -> clip -> optimizer -> param sync
// Mixed precision (bf16 / fp16 sections): the products run on 16-bit copies of the weights
// (parallel/zero.h, nn/weight_ops.h); fp16 scales the loss (optim/loss_scaler.h) and skips
// the optimizer step on every rank when any rank's gradients overflowed.
// The step's loss is the mean over every target token of the whole step's global batch
// (all data-parallel ranks): the token count is all-reduced before the first backward, so
// each micro-batch's gradient is scaled by 1 / (tokens in the global batch), and
// accumulation and data parallelism both equal one big batch exactly. Gradient and
// parameter sync are the ZeRO engine's (parallel/zero.h; stage 0 on one rank does none).
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>

#include "loom/data/dataset.h"
#include "loom/data/sampler.h"
#include "loom/dist/communicator.h"
#include "loom/dist/mesh.h"
#include "loom/io/model_loader.h"
#include "loom/models/causal_lm.h"
#include "loom/optim/adamw.h"
#include "loom/optim/expert_balance.h"
#include "loom/optim/loss_scaler.h"
#include "loom/optim/schedule.h"
#include "loom/parallel/pipeline_stage.h"
#include "loom/parallel/zero.h"
#include "loom/train/config.h"
#include "loom/train/data_setup.h"

namespace loom::nn {
class MoE;
}

namespace loom::train {

struct StepStats {
  int64_t step = 0;   // 0-based index of the step just taken
  double loss = 0.0;  // mean over the step's target tokens
  double lr = 0.0;
  double grad_norm = 0.0;  // pre-clip global L2 norm
  int64_t tokens = 0;      // input tokens processed this step
  int64_t target_tokens = 0;
  double seconds = 0.0;
  // fp16: the loss scale this step ran with, and whether its gradients overflowed (then
  // the optimizer step was skipped on every rank and grad_norm is not finite).
  double loss_scale = 1.0;
  bool skipped = false;
  // Mixture-of-experts models: every MoE layer's routed tokens per expert over the global
  // batch, and its correction bias after the step's update (optim/expert_balance.h).
  std::vector<optim::ExpertLoad> expert_load;
};

// Builds the model a config names: a path (HF folder, GGUF file, adapter folder), or
// {"path", "keep_quantized"}, or {"arch": "gpt2" | "llama" | "qwen2", config.json sizes...}
// initialised from `seed`.
std::unique_ptr<models::CausalLM> build_model(const nlohmann::json& model_cfg, uint64_t seed,
                                              const std::string& where, io::LoadOptions opt = {});
std::string model_path(const nlohmann::json& model_cfg);  // "" for a model built from sizes
// The Hugging Face config.json of the model a config names, without reading weights.
nlohmann::json model_hf_config(const nlohmann::json& model_cfg, const std::string& where);

class Trainer {
 public:
  // Reads the dataset cfg.data names; or uses `dataset` (benchmarks, tests). `mesh`: the
  // job's process mesh (one process without one), whose tp size must be the config's
  // tensor_parallel.size; the model splits over mesh.tp(), the batch and ZeRO over
  // mesh.dp(). Every rank constructs a Trainer.
  explicit Trainer(const TrainConfig& cfg, std::unique_ptr<data::Dataset> dataset = nullptr,
                   dist::ProcessMesh* mesh = nullptr);
  ~Trainer();
  StepStats step();  // one optimizer step
  // Mean loss over every target token of the validation set (NaN when there is none).
  double evaluate();
  // Runs cfg.train_steps steps, writes metrics.jsonl, prints progress (rank 0), saves a
  // checkpoint every checkpoint_interval steps and the final one, output_dir/checkpoint-final;
  // with cfg.trace_path, the schedule trace of the steps and evaluations (dist/job_trace.h).
  // step() and evaluate() record trace spans whenever util/trace.h's recorder is on.
  // A SIGTERM, SIGINT or SIGUSR1 during run() (util/stop_signals.h) stops every rank after
  // the step in progress with a resumable output_dir/checkpoint-<step>; interrupted() then
  // says so (loom train exits with kExitInterrupted).
  void run();
  bool interrupted() const { return interrupted_; }
  // A resumable checkpoint of the current state (collective).
  void save_checkpoint(const std::filesystem::path& dir);
  models::CausalLM& model() { return *model_; }
  const optim::AdamW& optimizer() const { return engine_->optimizer(); }
  parallel::ZeroEngine& engine() { return *engine_; }
  dist::ProcessMesh& mesh() { return *mesh_; }
  const nn::TensorParallel& tensor_parallel() const { return tp_; }
  int64_t steps_done() const { return step_; }
  // fp16's loss scaler (null in fp32 and bf16), and the steps skipped for overflow so far.
  const optim::LossScaler* loss_scaler() const { return scaler_.get(); }
  int64_t skipped_steps() const { return scaler_ ? scaler_->skipped_steps() : skipped_; }
  // Tests: called on this rank after the step's gradients are reduced, before the overflow
  // check and clipping (e.g. to plant an inf in one rank's gradients).
  void set_grad_hook(std::function<void()> f) { grad_hook_ = std::move(f); }

  // Bytes this rank holds for the model state (weights as held: f32 and quantized blocks;
  // gradients and AdamW moments of the trainable parameters only, sharded as the ZeRO
  // stage says), the engine's communication buffers, and what a step adds on top.
  struct MemoryReport {
    parallel::ZeroMemory state;
    int64_t activations = 0, peak_rss = 0;
  };
  MemoryReport memory_report() const { return {engine_->memory(), 0, 0}; }

 private:
  // This rank's layers under pipeline parallelism (cut from the model's config).
  models::StageRange pipeline_stage_range() const;
  // Forward and backward of the step's micro-batches, gradients accumulated and reduced:
  // in turn on the whole model, or through the pipeline schedule. Returns the loss sum.
  // fn on every MoE layer of the model and of a pipeline stage's activation contexts.
  void for_each_moe(const std::function<void(nn::MoE&)>& fn);
  // The step's expert loads (and the bias update at `rate`) of every MoE layer.
  std::vector<optim::ExpertLoad> expert_loads(float rate);
  double passes(const std::vector<data::MicroBatch>& micro, float grad_scale);
  double pipeline_passes(const std::vector<data::MicroBatch>& micro, float grad_scale);

  TrainConfig cfg_;
  std::unique_ptr<dist::Communicator> own_world_;  // a LocalComm when no mesh was given
  std::unique_ptr<dist::ProcessMesh> own_mesh_;
  dist::ProcessMesh* mesh_;
  dist::Communicator* dp_;            // mesh_->dp(): the batch's ranks
  dist::Communicator* ep_ = nullptr;  // mesh_->ep(): expert parallelism's group, when on
  nn::TensorParallel tp_;
  std::unique_ptr<models::CausalLM> model_;
  // Pipeline parallel: the stage's schedule, and its activation contexts beyond model_.
  std::unique_ptr<parallel::PipelineStage> stage_;
  models::StageRange stage_range_;  // this rank's layers
  std::vector<std::unique_ptr<models::CausalLM>> contexts_;
  std::unique_ptr<data::Dataset> data_, valid_;
  std::string data_summary_;
  std::unique_ptr<data::Sampler> sampler_;
  std::unique_ptr<parallel::ZeroEngine> engine_;
  optim::Schedule sched_;
  std::unique_ptr<optim::LossScaler> scaler_;  // fp16
  int64_t skipped_ = 0;  // steps skipped before a resume that dropped fp16 (the lr lags them)
  std::function<void()> grad_hook_;
  bool interrupted_ = false;  // run() stopped on a signal
  // fp32: throws naming the step and the first parameter with a non-finite gradient.
  [[noreturn]] void stop_on_non_finite(const StepStats& st);
  int64_t step_ = 0;
};

}  // namespace loom::train
