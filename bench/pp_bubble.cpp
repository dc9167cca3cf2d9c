// Benchmark (not a test): the pipeline bubble as the schedule trace shows it. Under
// `mpirun -np P`, P pipeline stages of a GPT-2 124M-shaped model (12 layers, d=768, 12
// heads, vocab 50257, random weights, random tokens) train `--warmup` steps, then `--steps`
// steps with the trace on, each of m micro-batches of one sequence of `--seq` tokens under
// `--schedule`; rank 0 writes the trace to `--out` (a Chrome trace, dist/job_trace.h).
// bench/pp_bubble.py reads it and computes each stage's idle time (leaving out the first
// traced step too: it begins as unevenly as the warm-up's first-touch optimizer ended);
// bench/pp_bubble.sh runs the grid.
//   pp_bubble --schedule gpipe|1f1b --m M --out FILE [--warmup N] [--steps N] [--seq T]
//             [--layers a,b,..] [--vocab V]
// --layers: layers per stage (default: uniform). The head (a 768 x 50257 GEMM, ~5 layers'
// FLOPs at T = 256) makes the last stage heavy under a uniform cut. --vocab (default 50257)
// shrinks the head: at 768 it weighs ~8% of a layer, so a 6/6 cut gives equal stages, the
// case the bubble formula describes.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

#include "loom/data/dataset.h"
#include "loom/dist/communicator.h"
#include "loom/dist/job_trace.h"
#include "loom/dist/mesh.h"
#include "loom/train/trainer.h"
#include "loom/util/trace.h"

int main(int argc, char** argv) {
  std::string schedule = "1f1b", out, layers;
  int64_t m = 4, warmup = 1, steps = 3, T = 256, V = 50257;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--schedule")
      schedule = v;
    else if (k == "--m")
      m = std::atoll(v.c_str());
    else if (k == "--warmup")
      warmup = std::atoll(v.c_str());
    else if (k == "--steps")
      steps = std::atoll(v.c_str());
    else if (k == "--seq")
      T = std::atoll(v.c_str());
    else if (k == "--out")
      out = v;
    else if (k == "--layers")
      layers = v;
    else if (k == "--vocab")
      V = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (out.empty() || m < 1 || warmup < 0 || steps < 1 || V < 2) {
    std::fprintf(stderr, "usage: pp_bubble --schedule S --m M --out FILE [--steps N] [--seq T]\n");
    return 2;
  }
  std::unique_ptr<loom::dist::Communicator> world = loom::dist::make_world_communicator();
  loom::train::TrainConfig cfg;
  cfg.model = {{"arch", "gpt2"}, {"n_layer", 12},   {"n_embd", 768},
               {"n_head", 12},   {"vocab_size", V}, {"n_positions", 1024}};
  cfg.micro_batch = 1;
  cfg.grad_accum = m;
  cfg.train_batch = m;
  cfg.train_steps = warmup + steps;
  cfg.adamw = {6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  cfg.gradient_clipping = 1.0;
  cfg.pipeline.size = world->size();
  cfg.pipeline.schedule = schedule;
  std::stringstream list(layers);
  for (std::string n; std::getline(list, n, ',');) cfg.pipeline.layers.push_back(std::stoll(n));
  loom::dist::ProcessMesh mesh(*world, 1, cfg.pipeline.size);
  loom::train::Trainer trainer(cfg, std::make_unique<loom::data::RandomTokenDataset>(V, T, 1024, 1),
                               &mesh);
  for (int64_t s = 0; s < warmup + steps; ++s) {
    loom::trace::enable(s >= warmup);
    const loom::train::StepStats st = trainer.step();
    if (world->rank() == 0)
      std::fprintf(stderr, "pp_bubble: %s m=%lld step %lld: %.2f s, loss %.4f\n", schedule.c_str(),
                   static_cast<long long>(m), static_cast<long long>(s + 1), st.seconds, st.loss);
  }
  loom::dist::write_job_trace(mesh, out);
  return 0;
}
