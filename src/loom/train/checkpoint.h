// Training checkpoints: what a run needs to continue exactly, saved from any parallel
// layout and loadable into any other (1 process <-> ZeRO-3 on 4 <-> ZeRO-2 on 2 <-> pp2 x
// tp2 ...).
//   <dir>/config.json + model.safetensors   the full model, HF layout (full fine-tuning;
//        under pipeline parallelism one model-0000s-of-0000p.safetensors per stage and
//        model.safetensors.index.json, as transformers shards a large model)
//   <dir>/adapter_config.json + ...          or the PEFT adapter folder (PEFT runs)
//   <dir>/trainer_state.json                 step, global batch, the layout it was saved from,
//        skipped steps and (fp16) the loss scaler's state
//   <dir>/optimizer/rank<r>.safetensors      AdamW moments this rank updated, under logical
//        names: "exp_avg/<param>" and "exp_avg_sq/<param>" hold a run of the FULL
//        parameter's flattened elements (tensor-parallel shards in full-tensor
//        coordinates), and the file's metadata maps each tensor to "begin:end"
// Every element is written once: by the rank that updates it (ZeRO shards) on the first
// data-parallel rank at stage 0, and of a slice several tensor-parallel ranks hold, by its
// primary copy (nn/parameter.h); a tied embedding's copy on the last pipeline stage is not
// written (the first stage's is the same). Loading reads, for every run of elements this
// rank updates, the slices that cover it, whoever wrote them, so any layout (dp x tp x pp,
// any ZeRO stage) resumes any other. Collective: every rank calls save/load. Into a
// temporary folder, each pipeline stage's first rank (dp 0, tp 0) writes its part of the
// model (full tensors: ZeRO-3 gathered over dp, shards over tp), every rank its optimizer
// file, and after a barrier rank 0 finishes the model files, writes the state and renames
// the folder, so a checkpoint is complete or absent (a rank that dies mid-save leaves the
// previous checkpoint as it was).
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "loom/dist/communicator.h"
#include "loom/dist/mesh.h"
#include "loom/nn/tensor_parallel.h"
#include "loom/optim/loss_scaler.h"
#include "loom/parallel/zero.h"

namespace loom::train {

struct TrainerState {
  int64_t step = 0;
  int64_t train_batch = 0;  // global batch: the sample order depends on it
  int world_size = 1;
  int zero_stage = 0;
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int64_t skipped_steps = 0;  // fp16 overflows: the learning-rate schedule lags by these
  std::optional<optim::LossScaler::State> loss_scaler;  // saved by fp16 runs
};

// write_stage(dir): writes this stage's part of the model into the existing folder `dir`
// (each stage's dp 0, tp 0 rank calls it, with the stage's parameters as full tensors;
// under expert parallelism dp ranks [0, ep) all do, each holding its expert slice);
// finish_model(dir): world rank 0, once every stage's part is there.
void save_train_checkpoint(const std::filesystem::path& dir, const TrainerState& st,
                           parallel::ZeroEngine& engine, dist::ProcessMesh& mesh,
                           const nn::TensorParallel& tp,
                           const std::function<void(const std::filesystem::path&)>& write_stage,
                           const std::function<void(const std::filesystem::path&)>& finish_model);

TrainerState read_trainer_state(const std::filesystem::path& dir);

// Fills the engine's optimizer moments (and step count) from the checkpoint's shards.
void load_optimizer_state(const std::filesystem::path& dir, const TrainerState& st,
                          parallel::ZeroEngine& engine);

}  // namespace loom::train
