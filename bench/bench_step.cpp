// Benchmark (not a test): one training step of a GPT-2 124M-shaped model (12 layers,
// d=768, 12 heads, vocab 50304, B=4, T=64, fp32) through the same Trainer::step() that
// `loom train` runs. Prints ms/step (median after warm-up), tokens/s, peak RSS, a
// breakdown by phase, the machine's measured sgemm rate and the step's share of it, as
// one JSON line on stdout (human-readable lines on stderr).
//   bench_step [--steps N] [--warmup N] [--batch B] [--seq T] [--tp N] [--precision P]
// --precision bf16|fp16 (default fp32): the config's "bf16"/"fp16" section, as `loom train`
// runs it; the JSON then also holds the 16-bit GEMM rate of the same shape and the step's
// share of it (fraction_of_half_gemm).
// --config FILE [--set KEY=VALUE]... [--case NAME]: instead of the built-in GPT-2, the step
// of a `loom train` config (its model, PEFT method and data; micro-batch, accumulation and
// seq_len from it, one process): the fine-tuning cases of bench/run.sh. Model FLOPs count
// 6 per trained and 4 per frozen matrix element per token (a frozen matrix has no weight
// gradient), plus causal attention; fraction_of_ceiling is their rate in the best step over
// the best sgemm rate on the step's MLP shape, probed between the steps.
// Threads: OMP_NUM_THREADS (bench/run.sh sets 2 and OMP_WAIT_POLICY=PASSIVE).
// --tp N (under `mpirun -np W`, N dividing W): the same step with tensor parallelism, the
// model split over N ranks (dp = W / N, B sequences per dp rank). Rank 0 prints one JSON
// line with the figures that differ per rank as the max over ranks and as per-rank lists:
// ms/step, peak RSS, the weights each rank holds, and the bytes each rank sent per step on
// its tp communicator (CommStats: the collectives' algorithmic volume, see
// dist/communicator.h). Without --tp nothing changes: no MPI, the same JSON keys.
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

#include "bench_util.h"
#include "loom/data/dataset.h"
#include "loom/dist/communicator.h"
#include "loom/dist/mesh.h"
#include "loom/kernels/cpu/matmul_bf16.h"
#include "loom/train/trainer.h"
#include "loom/util/profile.h"

namespace {

using loom::bench::now_s;

// The same with 16-bit operands and fp32 accumulation (kernels/cpu/matmul_bf16.h's backend).
double half_gemm_gflops(loom::kernels::Half h, int64_t M, int64_t N, int64_t K) {
  std::vector<uint16_t> a(M * K), b(N * K);
  std::vector<float> af(M * K, 0.5f), bf(N * K, 0.25f), c(M * N);
  loom::kernels::to_half(h, af.data(), a.data(), M * K);
  loom::kernels::to_half(h, bf.data(), b.data(), N * K);
  double best = 1e30;
  for (int r = 0; r < 21; ++r) {
    double t0 = now_s();
    loom::kernels::gemm_half(h, false, true, M, N, K, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    if (r > 0) best = std::min(best, now_s() - t0);
  }
  return 2.0 * M * N * K / best / 1e9;
}

// The step's model FLOPs: matrix products (forward 2, input gradient 2, weight gradient 2
// per element per token; the last only for trained matrices, a tied head counted once as
// the embedding) and causal attention (QK^T and AV over the lower triangle: 6 T^2 C per
// layer per sequence, forward and backward).
struct ModelShape {
  int64_t layers = 0, hidden = 0, mlp = 0;
  double trained = 0, frozen = 0;  // matrix elements in products
};

ModelShape model_shape(loom::models::CausalLM& m) {
  const nlohmann::json hf = m.hf_config();
  auto get = [&](const char* a, const char* b) {
    return hf.contains(a) ? hf[a].get<int64_t>() : hf.at(b).get<int64_t>();
  };
  ModelShape s;
  s.layers = get("num_hidden_layers", "n_layer");
  s.hidden = get("hidden_size", "n_embd");
  s.mlp = hf.contains("intermediate_size") ? hf["intermediate_size"].get<int64_t>() : 4 * s.hidden;
  const int64_t vocab = hf.at("vocab_size").get<int64_t>();
  bool separate_head = false;
  for (const auto& p : m.params().all())
    separate_head |= p->name.size() >= 14 && p->name.ends_with("lm_head.weight");
  for (const auto& p : m.params().all()) {
    if (p->full_shape.size() != 2) continue;
    const bool matrix =
        p->kind == loom::nn::ParamKind::Weight ||
        (!separate_head && p->kind == loom::nn::ParamKind::Embedding && p->full_shape[0] == vocab);
    if (!matrix) continue;
    const double n = static_cast<double>(p->full_shape[0] * p->full_shape[1]);
    (p->trainable ? s.trained : s.frozen) += n;
  }
  return s;
}

double step_flops(const ModelShape& s, double sequences, int64_t T) {
  const double tokens = sequences * static_cast<double>(T);
  return tokens * (6.0 * s.trained + 4.0 * s.frozen) +
         6.0 * static_cast<double>(s.layers) * sequences * static_cast<double>(T * T * s.hidden);
}

// One value per rank, on every rank, in rank order (each rank fills its own slot of a sum,
// so the values come back exactly). Without a world: this process's value alone.
std::vector<double> per_rank(loom::dist::Communicator* world, double v) {
  if (!world) return {v};
  std::vector<double> all(world->size(), 0.0);
  all[world->rank()] = v;
  world->all_reduce_sum(all.data(), static_cast<int64_t>(all.size()));
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 10, warmup = 3, B = 4, T = 64, tp = 0;  // tp 0: no --tp
  std::string precision = "fp32", config, name = "gpt2-124m";
  std::vector<std::string> sets;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    int64_t v = std::atoll(argv[i + 1]);
    if (k == "--config")
      config = argv[i + 1];
    else if (k == "--set")
      sets.push_back(argv[i + 1]);
    else if (k == "--case")
      name = argv[i + 1];
    else if (k == "--precision" &&
             (std::string(argv[i + 1]) == "fp32" || std::string(argv[i + 1]) == "bf16" ||
              std::string(argv[i + 1]) == "fp16"))
      precision = argv[i + 1];
    else if (k == "--steps")
      steps = v;
    else if (k == "--warmup")
      warmup = v;
    else if (k == "--batch")
      B = v;
    else if (k == "--seq")
      T = v;
    else if (k == "--tp" && v >= 1)
      tp = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (!config.empty() && tp > 0) {
    std::fprintf(stderr, "--config runs one process: no --tp\n");
    return 2;
  }
  loom::train::TrainConfig cfg;
  if (!config.empty()) {
    if (precision != "fp32") sets.push_back(precision + ".enabled=true");
    cfg = loom::train::load_config(config, sets, 1);
    B = cfg.micro_batch;
    T = cfg.data.seq_len;
  } else {
    cfg.model = {{"arch", "gpt2"}, {"n_layer", 12},       {"n_embd", 768},
                 {"n_head", 12},   {"vocab_size", 50304}, {"n_positions", 1024}};
    cfg.micro_batch = B;
    cfg.grad_accum = 1;
    cfg.train_batch = B;
    cfg.adamw = {6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
    cfg.gradient_clipping = 1.0;
    if (precision == "bf16") cfg.precision = loom::train::TrainConfig::Precision::bf16;
    if (precision == "fp16") cfg.precision = loom::train::TrainConfig::Precision::fp16;
  }
  cfg.train_steps = steps + warmup;
  std::unique_ptr<loom::dist::Communicator> world;
  std::unique_ptr<loom::dist::ProcessMesh> mesh;
  int64_t dp = 1;
  if (tp > 0) {
    world = loom::dist::make_world_communicator();
    if (world->size() % tp != 0) {
      std::fprintf(stderr, "--tp %lld: run under mpirun -np with a multiple of it (world: %d)\n",
                   static_cast<long long>(tp), world->size());
      return 2;
    }
    dp = world->size() / tp;
    cfg.tensor_parallel = static_cast<int>(tp);
    cfg.data_parallel = static_cast<int>(dp);
    cfg.train_batch = B * dp;
    mesh = std::make_unique<loom::dist::ProcessMesh>(*world, static_cast<int>(tp), 1);
  }
  // The built-in GPT-2 trains on random tokens; a config on its own data.
  loom::train::Trainer trainer(
      cfg,
      config.empty() ? std::make_unique<loom::data::RandomTokenDataset>(50304, T, 1024, 1)
                     : nullptr,
      mesh.get());
  const ModelShape shape = model_shape(trainer.model());

  for (int64_t i = 0; i < warmup; ++i) trainer.step();
  loom::prof::enable(true);
  loom::prof::reset();
  if (mesh) mesh->tp().reset_stats();  // warm-up traffic out: the same every step anyway
  // The sgemm ceiling is probed between the steps (3 runs after each, after a barrier so
  // that tp ranks probe together), so the best step and the best probe come from the same
  // stretch of this shared machine; probing only once, before or after, read anything from
  // 85 to 170 GFLOP/s on it within minutes.
  loom::bench::SgemmProbe probe(B * T, shape.mlp / std::max<int64_t>(tp, 1), shape.hidden);
  probe.seconds();  // warm-up
  std::vector<double> ms;
  double probe_best = 1e30;
  for (int64_t i = 0; i < steps; ++i) {
    ms.push_back(trainer.step().seconds * 1e3);
    if (world) world->barrier();
    for (int r = 0; r < 3; ++r) probe_best = std::min(probe_best, probe.seconds());
  }
  loom::prof::Totals tot = loom::prof::totals();

  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2], best = sorted.front();
  double total_ms = 0;
  for (double m : ms) total_ms += m;

  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  // The global batch's model FLOPs (with tp too: every rank lists each parameter's full shape).
  const double sequences = static_cast<double>(B * cfg.grad_accum * dp);
  const double tokens = sequences * static_cast<double>(T);
  const double model_flops = step_flops(shape, sequences, T);
  // With tp every rank times its own shard of the MLP GEMM, all at once, and the machine's
  // rate is their sum: the step's ranks share the cores the same way.
  const std::vector<double> sg_all = per_rank(world.get(), probe.gflops(probe_best));
  double sg = 0;
  for (double x : sg_all) sg += x;
  // Ranks step in lockstep (the collectives), so the slowest rank's median is the step's.
  const std::vector<double> ms_all = per_rank(world.get(), median);
  const std::vector<double> best_all = per_rank(world.get(), best);
  const double step_ms = *std::max_element(ms_all.begin(), ms_all.end());
  const double best_ms = *std::max_element(best_all.begin(), best_all.end());
  const double step_gflops = model_flops / (step_ms / 1e3) / 1e9;
  // The ceiling's fraction compares best with best (the fastest step, the fastest probe).
  const double best_gflops = model_flops / (best_ms / 1e3) / 1e9;

  nlohmann::json j;
  j["case"] = name;
  j["impl"] = "loom";
  j["ms_per_step"] = step_ms;
  j["tokens_per_s"] = tokens / (step_ms / 1e3);
  j["peak_rss_mib"] = ru.ru_maxrss / 1024.0;
  j["threads"] = omp_get_max_threads();
  j["steps"] = steps;
  j["step_gflops"] = step_gflops;
  j["best_step_gflops"] = best_gflops;
  j["best_ms_per_step"] = best_ms;
  j["sgemm_gflops"] = sg;
  j["fraction_of_sgemm"] = best_gflops / sg;
  j["fraction_of_ceiling"] = best_gflops / sg;
  j["tokens_per_step"] = tokens;
  j["trained_matrix_params"] = shape.trained;
  j["frozen_matrix_params"] = shape.frozen;
  j["precision"] = precision;
  if (precision != "fp32") {
    const auto h = precision == "bf16" ? loom::kernels::Half::bf16 : loom::kernels::Half::f16;
    const double hg =
        half_gemm_gflops(h, B * T, shape.mlp / std::max<int64_t>(tp, 1), shape.hidden);
    j["half_gemm_gflops"] = hg;
    j["fraction_of_half_gemm"] = best_gflops / hg;
    j["half_gemm"] = h == loom::kernels::Half::bf16 ? loom::kernels::bf16_gemm_description()
                                                    : "fp32 sgemm on widened operands";
  }
  nlohmann::json br;
  for (int i = 0; i < static_cast<int>(loom::prof::Phase::kCount); ++i)
    br[loom::prof::phase_name(static_cast<loom::prof::Phase>(i))] = tot.ns[i] / 1e6 / steps;
  double in_phases = 0;
  for (auto& [k, v] : br.items()) in_phases += v.get<double>();
  br["untracked"] = total_ms / steps - in_phases;
  j["ms_breakdown"] = br;  // with --tp: rank 0's
  if (mesh) {
    const loom::dist::CommStats cs = mesh->tp().stats();
    const auto rss = per_rank(world.get(), ru.ru_maxrss / 1024.0);
    const auto weights =
        per_rank(world.get(), static_cast<double>(trainer.memory_report().state.params));
    const auto sent = per_rank(world.get(), static_cast<double>(cs.bytes_sent) / steps);
    const auto calls = per_rank(world.get(), static_cast<double>(cs.collectives) / steps);
    auto mx = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
    j["tp"] = tp;
    j["dp"] = dp;
    j["ms_per_step_per_rank"] = ms_all;
    j["peak_rss_mib"] = mx(rss);
    j["peak_rss_mib_per_rank"] = rss;
    j["weights_bytes"] = mx(weights);
    j["weights_bytes_per_rank"] = weights;
    j["tp_bytes_sent_per_step"] = mx(sent);
    j["tp_bytes_sent_per_step_per_rank"] = sent;
    j["tp_collectives_per_step"] = mx(calls);
    if (world->rank() != 0) return 0;
  }
  std::printf("%s\n", j.dump().c_str());
  std::fprintf(stderr,
               "loom: %.1f ms/step (median of %lld), %.0f tok/s; best step %.1f ms, %.1f GFLOP/s "
               "= %.0f%% of sgemm %.1f GFLOP/s (best probe between steps), peak RSS %.0f MiB\n",
               step_ms, static_cast<long long>(steps), tokens / (step_ms / 1e3), best_ms,
               best_gflops, 100 * best_gflops / sg, sg, j["peak_rss_mib"].get<double>());
  if (mesh)
    std::fprintf(stderr, "  tp %lld x dp %lld: weights %.1f MiB/rank, tp sent %.1f MiB/step/rank\n",
                 static_cast<long long>(tp), static_cast<long long>(dp),
                 j["weights_bytes"].get<double>() / 1048576.0,
                 j["tp_bytes_sent_per_step"].get<double>() / 1048576.0);
  return 0;
}
