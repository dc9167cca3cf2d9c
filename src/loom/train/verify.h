// `loom verify`: does this config train at this parallel layout exactly as on one process?
// DESIGN.md's correctness oracle, for any config a user has, not only the tests':
//   1. every rank of the job trains K steps at the config's layout (DP x TP, ZeRO stage);
//   2. rank 0 alone trains the same K steps with the same global batch (the micro batch
//      kept, gradient accumulation multiplied by the data-parallel size, tensor parallel
//      off, so the sample order and the activation shapes are those of the job);
//   3. rank 0 compares every step's loss and gradient norm, the eval loss before and after
//      (when the config has validation data) and the final trainable parameters (and
//      buffers a training rule moves: the MoE correction bias), each as a
//      relative difference against the one-process value.
// The layouts differ only in fp32 summation order, so differences stay near 1e-7; a wrong
// reduction, shard boundary or sample slice shows up as 1e-3 and more.
// Memory on rank 0: the job's final trainable values are kept while the one-process run
// holds a whole model of its own.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/dist/mesh.h"
#include "loom/train/config.h"
#include "loom/train/trainer.h"

namespace loom::train {

struct RunRecord {
  std::vector<double> losses, grad_norms;  // per step
  std::vector<double> eval_losses;         // before the first step, after the last (or NaN)
  std::map<std::string, std::vector<float>> params;  // trained + buffers, full (rank 0 only)
};

// Trains `t` until it has done `steps` steps and records the run. Collective.
RunRecord record_run(Trainer& t, int64_t steps);

// The config (JSON, as parse_config takes it) that runs `cfg`'s global batch on one
// process: the same micro batch with data_parallel times the accumulation, no tensor,
// pipeline or expert parallelism.
nlohmann::json one_process_config(const TrainConfig& cfg);

struct Difference {
  std::string what;  // "loss, step 3", "eval loss after step 10", a parameter's name
  double got, want, rel;
};

struct VerifyReport {
  std::vector<Difference> steps;   // losses and gradient norms, then eval losses
  std::vector<Difference> params;  // one per trainable tensor (got/want: their L2 norms)
  Difference worst;                // the largest relative difference of all
  bool equal = false;              // worst.rel <= rtol
};

// Compares the job's run (got) with the one-process run (want). Throws loom::Error when
// the two did not record the same steps or tensors.
VerifyReport compare_runs(const RunRecord& got, const RunRecord& want, double rtol);

// The whole command on the job's mesh: returns the report on world rank 0 (and an empty one
// elsewhere) after printing the comparison to stdout on rank 0. With cfg.trace_path, the
// job's run (not the one-process reference) is written there as a schedule trace.
VerifyReport verify(const TrainConfig& cfg, dist::ProcessMesh& mesh, int64_t steps, double rtol);

}  // namespace loom::train
