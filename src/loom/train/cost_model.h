// The step-time and peak-memory model `loom plan --memory-per-rank` ranks layouts by, and
// the constants it was calibrated with (cost_model.cpp says when, where and how; re-measure
// with `bash bench/plan_calibrate.sh`). All N ranks are taken to run on one machine like the
// calibration one (C cores; loom launch gives each rank C / N threads), so past one machine
// the seconds rank layouts rather than predict them. One step of a layout with p pipeline
// stages and m micro-batches per step:
//   micro     a micro-batch on the slowest stage: its FLOPs at the machine's rate / min(N, C)
//             (a rank's share while all run; past C ranks, the one core it can have while
//             others wait) + its tp collectives + its point-to-point sends
//   pipeline  the schedule's critical path, micro x (m + p - 1) (GPipe and 1F1B: the bubble
//             factor (m + p - 1) / m; interleaved with v chunks per rank (m + (p - 1) / v)),
//             but not less than the machine takes for every rank's micro-batches at its full
//             rate (plus this rank's communication): ranks idle in a bubble leave their
//             cores to the others
//   dp        the ZeRO engine's collectives per step
//   optimizer AdamW over the rank's shard: elements / (element rate / N)
// Communication is the bytes a rank sends (the collectives' algorithmic volume, as
// dist::CommStats counts them) over the bandwidth of that kind of call measured with N ranks
// on the machine (2, 4 and 8; past 8, the 8-rank figure x 8 / N: ranks beyond the cores
// share them for copying as for computing), plus a cost per call: what a collective waits,
// in training, for its slowest rank (measured on tp2, whose 50 calls per micro-batch make
// it visible), scaled alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::train {

// Bytes one rank sends per step (or per micro-batch), by kind of call, and the calls.
struct Traffic {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0, p2p = 0;
  double calls = 0;
};

// Bytes per second one rank sends in each kind of call, with N ranks on the machine.
struct Bandwidth {
  int ranks = 2;
  double all_reduce = 1e9, reduce_scatter = 1e9, all_gather = 1e9, p2p = 1e9;
};

struct Calibration {
  std::string machine;               // where and when it was measured
  int cores = 1;                     // the machine's
  double f32_flops = 1e9;            // model FLOP/s of training through f32 weights, all cores
  double quant_flops = 1e9;          // FLOP/s of products with frozen ggml-block (GGUF) weights
  double adamw_elements = 1e9;       // AdamW (+ clipping) elements per second, all cores
  std::vector<Bandwidth> bandwidth;  // by ranks, ascending
  double call_seconds = 0;           // per collective or send, with 2 ranks
  int64_t process_bytes = 0;  // resident beyond the planned bytes: code, MPI, data, tokenizer
};

// The constants measured on this project's machine (cost_model.cpp).
const Calibration& calibration();

// Bytes one rank sends in a collective over d ranks of n fp32 values, as CommStats counts
// them: a ring all-reduce 2 (d - 1) / d x 4n, a reduce-scatter or all-gather (d - 1) / d x 4n.
double all_reduce_bytes(double n, int d);
double ring_bytes(double n, int d);

// The ZeRO engine's traffic per rank per step (parallel/zero.h) for `trainable` elements over
// d ranks and m micro-batches, `units` of the model's units holding trainable elements:
// stage 0 all-reduces once per step (in buckets of `bucket` elements), stage 1
// reduce-scatters each unit and all-gathers its updated shard, stage 2 reduce-scatters each
// unit every micro-batch and all-gathers once, stage 3 all-gathers each unit for every
// forward and backward and reduce-scatters it every micro-batch. Gradients travel in
// grad_bytes per element (4, or 2 with communication_data_type bf16/fp16); the parameter
// all-gathers (stages 1-3) in gather_bytes (2 under mixed precision: the 16-bit weights).
Traffic zero_traffic(int stage, double trainable, int units, double bucket, int d, int64_t m,
                     double grad_bytes = 4, double gather_bytes = 4);

// Seconds to send `t` with `world` ranks on the machine.
double seconds(const Traffic& t, const Calibration& c, int world);

// One pipeline stage's work per micro-batch on one rank.
struct StageWork {
  double f32_flops = 0, quant_flops = 0;  // forward + backward
  Traffic tp;                             // on the tensor-parallel group
  Traffic p2p;                            // to the neighbouring stages
};

struct StepWork {
  int world = 1, pp = 1, virtual_stages = 1;
  int64_t micro_batches = 1;  // m, per step on each rank
  std::vector<StageWork> stages;
  Traffic dp;                 // per step, the busiest stage's
  double adamw_elements = 0;  // per step, the largest shard
};

struct StepTime {
  double micro = 0;                       // the slowest stage's micro-batch (compute + tp + p2p)
  double compute = 0, tp = 0, p2p = 0;    // of that stage, per micro-batch
  double f32_flops = 0, quant_flops = 0;  // of that stage, per micro-batch
  Traffic traffic;      // of that stage per step: m micro-batches' tp and p2p, and dp's
  double critical = 0;  // micro x (m + (p - 1) / v)
  double pipeline = 0;  // the larger of that and the machine's time for every rank's work
  double dp = 0, optimizer = 0;
  double total = 0;
};

StepTime estimate_step(const StepWork& w, const Calibration& c);

}  // namespace loom::train
