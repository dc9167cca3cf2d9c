// `loom plan`: what each rank of a layout will hold, and which layouts fit a memory budget,
// before anything is allocated or trained.
//   plan_report    the config's layout (dp x tp x pp at its ZeRO stage): bytes per rank for
//                  every ZeRO stage, and with pipeline stages each stage's weights,
//                  gradients, optimizer state, buffers and activations (the micro-batches
//                  its schedule holds at once x one micro-batch's), and the estimated peak
//                  RSS and step time
//   layouts_report every layout of N ranks (dp, tp, pp, ZeRO stage, micro-batch with the
//                  accumulation that keeps the global batch, schedule) whose estimated peak
//                  RSS per rank fits the budget, fastest first (train/cost_model.h); throws
//                  naming the smallest estimate when none fits
// Models are declared, never allocated (models::ParamBuffers::DeclareOnly): no weight is
// read, and a model of any size plans in milliseconds. The bytes come from the arithmetic
// the engine logs at start (parallel::ZeroPartition::memory, tp rank 0's shards) and the
// model's own activation estimate (CausalLM::activation_bytes); peak RSS adds the process's
// calibrated overhead.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/parallel/zero.h"
#include "loom/train/config.h"
#include "loom/train/cost_model.h"

namespace loom::train {

struct Layout {
  int dp = 1, tp = 1, pp = 1, zero = 0;
  int ep = 1;  // expert_parallel.size (the config's; not searched)
  bool sequence_parallel = false;
  int64_t micro = 1, accum = 1;   // micro-batch per rank, micro-batches per step
  std::string schedule = "1f1b";  // with pp > 1
  int virtual_stages = 1;
  std::string partition;                // uniform | parameters; empty: the config's list of layers
  int64_t reduce_bucket = 500'000'000;  // ZeRO-0's all-reduce bucket, elements
  parallel::StateBytes bytes;           // per element of model state: the config's precision
  parallel::StateBytes paper_bytes;     // the same in the ZeRO paper's layout
  std::string str() const;              // "dp2 tp1 pp2 ZeRO-1 micro 2 x 4 1f1b"
  std::string overrides() const;        // the config overrides that select it, as --set arguments
};

// One pipeline stage (the whole model when pp = 1), per rank.
struct StagePlan {
  std::string layers;  // "0-5" (interleaved: "0-1, 8-9")
  int64_t n_layers = 0;
  parallel::ZeroMemory state;        // at the layout's ZeRO stage over its dp ranks
  parallel::ZeroMemory paper_state;  // the same in the ZeRO paper's layout (Layout::paper_bytes)
  int64_t activation_bytes = 0;      // one micro-batch's
  int in_flight = 1;                 // micro-batches whose activations are held at once
  int64_t mpi_bytes = 0;             // MPI's temporaries for the ZeRO engine's calls
  int64_t peak_bytes = 0;            // estimated peak RSS
};

struct LayoutPlan {
  Layout layout;
  std::vector<StagePlan> stages;
  int64_t peak_bytes = 0;  // the largest stage's
  StepTime time;
};

// The config's layout at `world` ranks.
LayoutPlan plan_layout(const TrainConfig& cfg, int world);
std::string plan_report(const TrainConfig& cfg, int world);

// The config of a layout search: the global batch it gives at `world` ranks (its
// train_batch_size, or micro-batch x accumulation x its own data-parallel size), the layout
// left open (dp = world, micro-batch = the global batch): the search sets every part of it.
TrainConfig search_config(const std::filesystem::path& path, const std::vector<std::string>& sets,
                          int world);

// Every layout of `world` ranks at the config's global batch that the trainer can run and the
// model can split into, fastest first (ties: the smaller peak first).
std::vector<LayoutPlan> runnable_layouts(const TrainConfig& cfg, int world);
std::string layouts_report(const TrainConfig& cfg, int world, double budget_gib);

}  // namespace loom::train
