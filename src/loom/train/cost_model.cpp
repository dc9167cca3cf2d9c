#include "loom/train/cost_model.h"

#include <algorithm>
#include <cmath>

namespace loom::train {

const Calibration& calibration() {
  // Measured 2026-12-03 by `bash bench/plan_calibrate.sh build` (which prints this block) on
  // this project's machine: Intel Xeon (family 6 model 167, a KVM guest), 2 cores, 23 GiB,
  // Open MPI 4.1.4, shared with other jobs (load average 2.5 falling to 0.7 during the runs;
  // under a load of 5-6 the same runs measured f32 85 GFLOP/s, quantized 57). Medians of
  // steps 2-5: GPT-2 124M, micro-batch 4 x 128 tokens x 2, one process: step 3.44 s, of it
  // AdamW 0.690 s; SmolLM2-135M LoRA on its Q4_1 base, 4 x 256 x 2: step 9.23 s, AdamW
  // 0.034 s; GPT-2 at tp2: 100 collectives took 0.050 s a step, less than their bytes at
  // these bandwidths, so no cost per call; peak RSS beyond the planned bytes 74, 42 and 51
  // MiB (GPT-2, SmolLM2, GPT-2 at tp2 on 2 ranks).
  static const Calibration c{
      .machine = "Intel Xeon, 2 cores, 2026-12-03",
      .cores = 2,
      .f32_flops = 281e9,
      .quant_flops = 127e9,
      .adamw_elements = 180e6,
      .bandwidth = {{2, 2.26e9, 0.587e9, 2.69e9, 4.05e9},
                    {4, 1.05e9, 0.392e9, 1.71e9, 2.31e9},
                    {8, 0.598e9, 0.222e9, 0.945e9, 1.04e9}},
      .call_seconds = 0,
      .process_bytes = int64_t{55} << 20,
  };
  return c;
}

double all_reduce_bytes(double n, int d) { return d > 1 ? 2.0 * (d - 1) / d * 4 * n : 0.0; }
double ring_bytes(double n, int d) { return d > 1 ? (d - 1.0) / d * 4 * n : 0.0; }

Traffic zero_traffic(int stage, double trainable, int units, double bucket, int d, int64_t m,
                     double grad_bytes, double gather_bytes) {
  Traffic t;
  if (d < 2) return t;
  const double ring = ring_bytes(trainable, d) * grad_bytes / 4,
               gather = ring_bytes(trainable, d) * gather_bytes / 4, micro = static_cast<double>(m),
               n = units;
  if (stage == 0) {
    t.all_reduce = all_reduce_bytes(trainable, d) * grad_bytes / 4;
    t.calls = std::ceil(trainable / bucket);
  }
  if (stage == 1) {
    t.reduce_scatter = ring;
    t.all_gather = gather;
    t.calls = 2 * n;
  }
  if (stage == 2) {
    t.reduce_scatter = micro * ring;
    t.all_gather = gather;
    t.calls = (micro + 1) * n;
  }
  if (stage == 3) {
    t.reduce_scatter = micro * ring;
    t.all_gather = 2 * micro * gather;  // units gathered for forward and backward
    t.calls = 3 * micro * n;
  }
  return t;
}

double seconds(const Traffic& t, const Calibration& c, int world) {
  if (world < 2 || c.bandwidth.empty()) return 0.0;
  // The largest measurement at or below the world; past the table, ranks share its cores.
  Bandwidth b = c.bandwidth.front();
  for (const Bandwidth& m : c.bandwidth)
    if (m.ranks <= world) b = m;
  const double share = static_cast<double>(b.ranks) / std::max(world, b.ranks);
  return (t.all_reduce / b.all_reduce + t.reduce_scatter / b.reduce_scatter +
          t.all_gather / b.all_gather + t.p2p / b.p2p + t.calls * c.call_seconds) /
         share;
}

StepTime estimate_step(const StepWork& w, const Calibration& c) {
  const double N = w.world;
  double work = 0;  // seconds of one micro-batch on every stage, at the machine's full rate
  StepTime t;
  for (const StageWork& s : w.stages) {
    const double full_rate = s.f32_flops / c.f32_flops + s.quant_flops / c.quant_flops;
    work += full_rate;
    const double compute = std::min<double>(w.world, c.cores) * full_rate;
    const double tp = seconds(s.tp, c, w.world), p2p = seconds(s.p2p, c, w.world);
    if (compute + tp + p2p > t.micro) {
      t.micro = compute + tp + p2p;
      t.compute = compute;
      t.tp = tp;
      t.p2p = p2p;
      t.f32_flops = s.f32_flops;
      t.quant_flops = s.quant_flops;
      t.traffic = s.tp;
      t.traffic.p2p = s.p2p.p2p;
      t.traffic.calls += s.p2p.calls;
    }
  }
  const double m = static_cast<double>(w.micro_batches);
  t.critical = t.micro * (m + static_cast<double>(w.pp - 1) / w.virtual_stages);
  t.pipeline = std::max(t.critical, N / w.pp * m * work + m * (t.tp + t.p2p));
  t.dp = seconds(w.dp, c, w.world);
  Traffic& s = t.traffic;
  s.all_reduce = m * s.all_reduce + w.dp.all_reduce;
  s.reduce_scatter = m * s.reduce_scatter + w.dp.reduce_scatter;
  s.all_gather = m * s.all_gather + w.dp.all_gather;
  s.p2p = m * s.p2p + w.dp.p2p;
  s.calls = m * s.calls + w.dp.calls;
  t.optimizer = N * w.adamw_elements / c.adamw_elements;
  t.total = t.pipeline + t.dp + t.optimizer;
  return t;
}

}  // namespace loom::train
