// Collective bandwidth on this machine (not a test; bench/plan_calibrate.sh runs it for the
// cost model of `loom plan --memory-per-rank`, train/cost_model.h):
//   mpirun -np N comm_bw [--mib M] [--reps R]
// Each kind of call the engines make (all-reduce, reduce-scatter, all-gather, and a
// point-to-point exchange between rank pairs) moves M MiB of fp32 (default 64) per call,
// R times (default 5, after one warm-up); the rate is the bytes a rank sends per call, as
// dist::CommStats counts them (the collectives' algorithmic volume), over the best call's
// time. Rank 0 prints one JSON line: {"ranks", "mib", "<kind>_bytes_per_s", ...}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/dist/communicator.h"

int main(int argc, char** argv) {
  int64_t mib = 64, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--mib") {
      mib = std::atoll(argv[i + 1]);
    } else if (k == "--reps") {
      reps = std::atoll(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  auto world = loom::dist::make_world_communicator();
  const int n = world->size(), r = world->rank();
  if (n < 2 || mib < 1 || reps < 1) {
    std::fprintf(stderr,
                 "comm_bw: run under mpirun with at least 2 ranks, --mib and --reps >= 1\n");
    return 2;
  }
  const int64_t count = mib * 1048576 / 4 / n * n;  // divisible by the ranks
  std::vector<float> a(count, 1.0f), b(count, 0.0f);
  // An exchange: even ranks send to the next rank and receive from it, odd ranks the reverse.
  const int peer = r % 2 == 0 ? r + 1 : r - 1;
  auto exchange = [&] {
    if (peer >= n) return;
    auto s = world->isend(a.data(), count, peer, 7);
    auto q = world->irecv(b.data(), count, peer, 7);
    s.wait();
    q.wait();
  };
  struct Kind {
    const char* name;
    std::function<void()> call;
  };
  const std::vector<Kind> kinds = {
      {"all_reduce", [&] { world->all_reduce_sum(a.data(), count); }},
      {"reduce_scatter", [&] { world->reduce_scatter_sum(a.data(), b.data(), count / n); }},
      {"all_gather", [&] { world->all_gather(a.data() + r * (count / n), b.data(), count / n); }},
      {"p2p", exchange}};
  nlohmann::json out = {{"ranks", n}, {"mib", mib}};
  for (const Kind& k : kinds) {
    double best = 1e30;
    int64_t bytes = 0;
    for (int64_t i = 0; i <= reps; ++i) {
      world->barrier();
      const int64_t before = world->stats().bytes_sent;
      const auto t0 = std::chrono::steady_clock::now();
      k.call();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double slowest = s;  // the call ends for the job when its slowest rank is done
      world->all_reduce_max(&slowest);
      bytes = world->stats().bytes_sent - before;
      if (i > 0) best = std::min(best, slowest);
    }
    // A point-to-point exchange sends `count` floats; CommStats counts sends the same way.
    if (std::string(k.name) == "p2p") bytes = count * 4;
    out[std::string(k.name) + "_bytes_per_s"] = static_cast<double>(bytes) / best;
  }
  if (r == 0) std::printf("%s\n", out.dump().c_str());
  return 0;
}
