// Benchmark (not a test): one training step of a GPT-2 124M-shaped model (12 layers,
// d=768, 12 heads, vocab 50304, B=4, T=64, fp32) through the same Trainer::step() that
// `loom train` runs. Prints ms/step (median after warm-up), tokens/s, peak RSS, a
// breakdown by phase, the machine's measured sgemm rate and the step's share of it, as
// one JSON line on stdout (human-readable lines on stderr).
//   bench_step [--steps N] [--warmup N] [--batch B] [--seq T]
// Threads: OMP_NUM_THREADS (bench/run.sh sets 2 and OMP_WAIT_POLICY=PASSIVE).
#include <cblas.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/data/dataset.h"
#include "loom/train/trainer.h"
#include "loom/util/profile.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// sgemm rate on the step's own dominant shapes (M = B*T rows), GFLOP/s, best of 5.
double sgemm_gflops(int64_t M, int64_t N, int64_t K) {
  std::vector<float> a(M * K, 0.5f), b(N * K, 0.25f), c(M * N);
  double best = 1e30;
  for (int r = 0; r < 6; ++r) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K,
                0.0f, c.data(), N);
    if (r > 0) best = std::min(best, now_s() - t0);
  }
  return 2.0 * M * N * K / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 10, warmup = 3, B = 4, T = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    int64_t v = std::atoll(argv[i + 1]);
    if (k == "--steps")
      steps = v;
    else if (k == "--warmup")
      warmup = v;
    else if (k == "--batch")
      B = v;
    else if (k == "--seq")
      T = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const int64_t L = 12, C = 768, V = 50304;
  loom::train::TrainConfig cfg;
  cfg.model = {{"arch", "gpt2"}, {"n_layer", L},    {"n_embd", C},
               {"n_head", 12},   {"vocab_size", V}, {"n_positions", 1024}};
  cfg.micro_batch = B;
  cfg.grad_accum = 1;
  cfg.train_batch = B;
  cfg.train_steps = steps + warmup;
  cfg.adamw = {6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  cfg.gradient_clipping = 1.0;
  loom::train::Trainer trainer(cfg,
                               std::make_unique<loom::data::RandomTokenDataset>(V, T, 1024, 1));

  for (int64_t i = 0; i < warmup; ++i) trainer.step();
  loom::prof::enable(true);
  loom::prof::reset();
  std::vector<double> ms;
  for (int64_t i = 0; i < steps; ++i) ms.push_back(trainer.step().seconds * 1e3);
  loom::prof::Totals tot = loom::prof::totals();
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  double total_ms = 0;
  for (double m : ms) total_ms += m;

  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  // Matmul FLOPs of one step: forward 2*M*N*K per GEMM, backward twice that.
  const double tokens = static_cast<double>(B * T);
  const double gemm_flops = 6.0 * tokens * (L * 12.0 * C * C + static_cast<double>(V) * C);
  const double attn_flops = 6.0 * L * B * T * T * C;  // QK^T and AV, full (not causal-halved)
  const double sg = sgemm_gflops(B * T, 4 * C, C);
  const double step_gflops = (gemm_flops + attn_flops) / (median / 1e3) / 1e9;

  nlohmann::json j;
  j["impl"] = "loom";
  j["ms_per_step"] = median;
  j["tokens_per_s"] = tokens / (median / 1e3);
  j["peak_rss_mib"] = ru.ru_maxrss / 1024.0;
  j["threads"] = omp_get_max_threads();
  j["steps"] = steps;
  j["step_gflops"] = step_gflops;
  j["sgemm_gflops"] = sg;
  j["fraction_of_sgemm"] = step_gflops / sg;
  nlohmann::json br;
  for (int i = 0; i < static_cast<int>(loom::prof::Phase::kCount); ++i)
    br[loom::prof::phase_name(static_cast<loom::prof::Phase>(i))] = tot.ns[i] / 1e6 / steps;
  double in_phases = 0;
  for (auto& [k, v] : br.items()) in_phases += v.get<double>();
  br["untracked"] = total_ms / steps - in_phases;
  j["ms_breakdown"] = br;
  std::printf("%s\n", j.dump().c_str());
  std::fprintf(stderr,
               "loom: %.1f ms/step (median of %lld), %.0f tok/s, %.1f GFLOP/s = %.0f%% of "
               "sgemm %.1f GFLOP/s, peak RSS %.0f MiB\n",
               median, static_cast<long long>(steps), tokens / (median / 1e3), step_gflops,
               100 * step_gflops / sg, sg, ru.ru_maxrss / 1024.0);
  return 0;
}
