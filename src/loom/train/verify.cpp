#include "loom/train/verify.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <thread>

#include "loom/dist/job_trace.h"
#include "loom/nn/full_tensors.h"
#include "loom/util/error.h"
#include "loom/util/trace.h"

namespace loom::train {

namespace {

// |got - want| / |want|; two NaNs (no validation data on either side) are equal.
double rel_diff(double got, double want) {
  if (std::isnan(got) && std::isnan(want)) return 0.0;
  if (std::isnan(got) || std::isnan(want)) return std::numeric_limits<double>::infinity();
  return std::abs(got - want) / std::max(std::abs(want), 1e-30);
}

// Waits for a collective without spinning: while rank 0 runs the one-process reference the
// other ranks would otherwise busy-poll in MPI and take its cores on a small machine.
void wait_sleeping(dist::Request& r) {
  while (!r.test()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// Every rank's named tensors to rank 0 of `group`, one rank at a time (pipeline stages over
// pp, expert slices over ep; each holds full tensors here). A tensor that arrives twice (a
// tied embedding on the first and last stage) must arrive equal.
void gather_named(dist::Communicator& group, const std::string& what,
                  std::map<std::string, std::vector<float>>& params) {
  for (int s = 0; s < group.size(); ++s) {
    std::vector<char> blob;
    if (group.rank() == s) {
      for (const auto& [name, v] : params) {
        const int64_t sizes[2] = {static_cast<int64_t>(name.size()),
                                  static_cast<int64_t>(v.size())};
        blob.insert(blob.end(), reinterpret_cast<const char*>(sizes),
                    reinterpret_cast<const char*>(sizes + 2));
        blob.insert(blob.end(), name.begin(), name.end());
        blob.insert(blob.end(), reinterpret_cast<const char*>(v.data()),
                    reinterpret_cast<const char*>(v.data() + v.size()));
      }
    }
    int64_t bytes = static_cast<int64_t>(blob.size());
    group.broadcast(&bytes, sizeof bytes, s);
    blob.resize(bytes);
    group.broadcast(blob.data(), bytes, s);
    if (group.rank() != 0 || s == 0) continue;
    for (size_t at = 0; at < blob.size();) {
      int64_t sizes[2];
      std::memcpy(sizes, blob.data() + at, sizeof sizes);
      at += sizeof sizes;
      std::string name(blob.data() + at, sizes[0]);
      at += sizes[0];
      std::vector<float> v(sizes[1]);
      std::memcpy(v.data(), blob.data() + at, sizes[1] * sizeof(float));
      at += sizes[1] * sizeof(float);
      auto [it, fresh] = params.emplace(name, std::move(v));
      LOOM_CHECK(fresh || std::memcmp(it->second.data(), blob.data() + at - sizes[1] * 4,
                                      sizes[1] * sizeof(float)) == 0,
                 "verify: " + what + " " + std::to_string(s) + "'s copy of " + name +
                     " differs from the first's");
    }
  }
}

}  // namespace

RunRecord record_run(Trainer& t, int64_t steps) {
  RunRecord r;
  r.eval_losses.push_back(t.evaluate());
  while (t.steps_done() < steps) {
    const StepStats st = t.step();
    r.losses.push_back(st.loss);
    r.grad_norms.push_back(st.grad_norm);
  }
  r.eval_losses.push_back(t.evaluate());
  // Full tensors on world rank 0: ZeRO-3 pieces gathered over dp (each expert slice's on
  // the first dp rank holding it, dp ranks [0, ep)), then shards over tp, then every expert
  // slice's, then every pipeline stage's.
  t.engine().gather_all(0);
  dist::ProcessMesh& mesh = t.mesh();
  const int ep = mesh.ep_size();
  if (mesh.dp_rank() < ep) {
    nn::FullTensors full(t.model().params(), t.tensor_parallel());
    if (mesh.tp_rank() == 0) {
      // Trained parameters and buffers a training rule moves (the MoE correction bias).
      for (auto& p : t.model().params().all())
        if ((p->trainable || p->kind == nn::ParamKind::Buffer) &&
            (mesh.dp_rank() == 0 || p->expert))
          r.params[p->name].assign(p->value.f32(), p->value.f32() + p->value.numel());
      if (ep > 1) gather_named(mesh.ep(ep), "expert-parallel rank", r.params);
      if (mesh.dp_rank() == 0) gather_named(mesh.pp(), "pipeline stage", r.params);
      if (mesh.world().rank() != 0) r.params.clear();
    }
  }
  t.engine().release_all();
  return r;
}

nlohmann::json one_process_config(const TrainConfig& cfg) {
  nlohmann::json j = cfg.raw;
  j.erase("tensor_parallel");
  j.erase("pipeline_parallel");
  j.erase("expert_parallel");
  j["train_micro_batch_size_per_gpu"] = cfg.micro_batch;
  j["gradient_accumulation_steps"] = cfg.grad_accum * cfg.data_parallel;
  j["train_batch_size"] = cfg.train_batch;
  return j;
}

VerifyReport compare_runs(const RunRecord& got, const RunRecord& want, double rtol) {
  LOOM_CHECK(
      got.losses.size() == want.losses.size() && got.eval_losses.size() == want.eval_losses.size(),
      "verify: the two runs recorded different numbers of steps");
  LOOM_CHECK(got.params.size() == want.params.size(),
             "verify: the two runs train different numbers of tensors");
  VerifyReport rep;
  auto add = [&](std::vector<Difference>& to, std::string what, double g, double w, double rel) {
    to.push_back({std::move(what), g, w, rel});
    if (to.back().rel > rep.worst.rel || rep.worst.what.empty()) rep.worst = to.back();
  };
  for (size_t i = 0; i < want.losses.size(); ++i) {
    const std::string step = std::to_string(i + 1);
    add(rep.steps, "loss, step " + step, got.losses[i], want.losses[i],
        rel_diff(got.losses[i], want.losses[i]));
    add(rep.steps, "gradient norm, step " + step, got.grad_norms[i], want.grad_norms[i],
        rel_diff(got.grad_norms[i], want.grad_norms[i]));
  }
  for (size_t i = 0; i < want.eval_losses.size(); ++i) {
    const std::string what = i == 0 ? "eval loss before training"
                                    : "eval loss after step " + std::to_string(want.losses.size());
    add(rep.steps, what, got.eval_losses[i], want.eval_losses[i],
        rel_diff(got.eval_losses[i], want.eval_losses[i]));
  }
  for (const auto& [name, w] : want.params) {
    auto it = got.params.find(name);
    LOOM_CHECK(it != got.params.end() && it->second.size() == w.size(),
               "verify: tensor " + name + " differs in shape between the two runs");
    const std::vector<float>& g = it->second;
    double diff = 0, gn = 0, wn = 0;  // L2 norms of got - want, got, want
    for (size_t k = 0; k < w.size(); ++k) {
      diff += (double(g[k]) - w[k]) * (double(g[k]) - w[k]);
      gn += double(g[k]) * g[k];
      wn += double(w[k]) * w[k];
    }
    const double rel = std::sqrt(diff) / std::max(std::sqrt(wn), 1e-30);
    add(rep.params, name, std::sqrt(gn), std::sqrt(wn), std::isnan(rel) ? INFINITY : rel);
  }
  rep.equal = rep.worst.rel <= rtol;
  return rep;
}

VerifyReport verify(const TrainConfig& cfg, dist::ProcessMesh& mesh, int64_t steps, double rtol) {
  dist::Communicator& comm = mesh.world();
  const int world = comm.size();
  LOOM_CHECK(world > 1,
             "verify compares N ranks with one process: run it on several, e.g. "
             "`loom launch -n 2 -- verify CONFIG`");
  LOOM_CHECK(steps >= 1 && steps <= cfg.train_steps,
             "verify: --steps must be between 1 and train_steps (" +
                 std::to_string(cfg.train_steps) + ")");
  RunRecord job;
  trace::enable(!cfg.trace_path.empty());  // the job's run, not the reference's
  {
    Trainer t(cfg, nullptr, &mesh);
    job = record_run(t, steps);
  }
  if (trace::enabled()) {
    dist::write_job_trace(mesh, cfg.trace_path);
    trace::enable(false);
  }
  // The reference on rank 0 while the others sleep; then everyone leaves together.
  RunRecord one;
  float token = 0.0f;
  if (comm.rank() == 0) {
    dist::LocalComm local;
    dist::ProcessMesh alone(local, 1, 1);
    Trainer t(parse_config(one_process_config(cfg), "verify (one process)", 1), nullptr, &alone);
    one = record_run(t, steps);
  }
  dist::Request done = comm.iall_reduce_sum(&token, 1);
  wait_sleeping(done);
  if (comm.rank() != 0) return {};

  const VerifyReport rep = compare_runs(job, one, rtol);
  const std::string ep =
      cfg.expert_parallel > 1 ? " (experts over " + std::to_string(cfg.expert_parallel) + ")" : "";
  std::printf(
      "loom verify: %d ranks (data parallel %d%s x tensor parallel %d%s x pipeline parallel "
      "%d%s) at ZeRO stage %d vs "
      "one process, %lld steps, global batch %lld (%lld per micro-batch, accumulation %lld on "
      "the job, %lld on one process)\n",
      world, cfg.data_parallel, ep.c_str(), cfg.tensor_parallel,
      cfg.sequence_parallel ? ", sequence parallel" : "", cfg.pipeline.size,
      cfg.pipeline.size > 1 ? (" " + cfg.pipeline.schedule).c_str() : "", cfg.zero.stage,
      static_cast<long long>(steps), static_cast<long long>(cfg.train_batch),
      static_cast<long long>(cfg.micro_batch), static_cast<long long>(cfg.grad_accum),
      static_cast<long long>(cfg.grad_accum * cfg.data_parallel));
  std::printf("%-30s %16s %16s %10s\n", "", "job", "one process", "rel. diff");
  for (const Difference& d : rep.steps)
    std::printf("%-30s %16.9g %16.9g %10.2e\n", d.what.c_str(), d.got, d.want, d.rel);
  const Difference* worst_param = nullptr;
  for (const Difference& d : rep.params)
    if (!worst_param || d.rel > worst_param->rel) worst_param = &d;
  if (worst_param && worst_param->rel == 0.0)
    std::printf(
        "final parameters: %zu tensors, largest relative difference 0: every element "
        "equal\n",
        rep.params.size());
  else if (worst_param)
    std::printf("final parameters: %zu tensors, largest relative difference %.2e (%s)\n",
                rep.params.size(), worst_param->rel, worst_param->what.c_str());
  std::printf("%s: largest relative difference %.2e (%s), tolerance %.1e\n",
              rep.equal ? "EQUAL" : "DIFFERENT", rep.worst.rel, rep.worst.what.c_str(), rtol);
  if (!rep.equal && cfg.precision != TrainConfig::Precision::fp32 && steps > 1) {
    // rep.steps opens with step 1's loss and gradient norm.
    const double first = std::max(rep.steps[0].rel, rep.steps[1].rel);
    std::printf(
        "note: the products round their operands to 16 bits (weights from the fp32 master,\n"
        "  activations as they enter each product). Where the job adds in another fp32 order\n"
        "  than one process (ZeRO-0/1 sum each rank's micro-batches first, then the ranks;\n"
        "  tensor parallelism splits the products' own sums; a data-parallel size that is not\n"
        "  a power of two; 16-bit gradient accumulation or communication rounds partial sums),\n"
        "  the trained values move by ~1e-7 or more, and from step 2 on that flips\n"
        "  the rounding of some operands, and the flips compound. ZeRO-2/3 over 2 data-\n"
        "  parallel ranks add the micro-batches in one process's pairwise order and stay\n"
        "  bitwise equal (parallel/zero.h). Step 1 starts from the same weights: it agrees\n"
        "  to %.2e here. For the exact check of a 16-bit layout run --steps 1 (its final\n"
        "  parameters are the fp32 values after one update).\n",
        first);
  }
  std::fflush(stdout);
  return rep;
}

}  // namespace loom::train
