#include "loom/parallel/pipeline_schedule.h"

#include <algorithm>
#include <set>

#include "loom/util/error.h"

namespace loom::parallel {

namespace {

// Megatron's interleaved order: virtual pass k of the m * v is micro-batch
// (k / (p v)) * p + k % p of chunk (k / p) % v (forward), v - 1 - that (backward).
Pass interleaved_pass(Pass::Kind kind, int k, int p, int v) {
  const int chunk = (k % (p * v)) / p;
  return {kind, (k / (p * v)) * p + k % p, kind == Pass::Forward ? chunk : v - 1 - chunk};
}

}  // namespace

std::vector<Pass> stage_schedule(const std::string& schedule, int p, int r, int m, int v) {
  LOOM_CHECK(p >= 1 && r >= 0 && r < p && m >= 1 && v >= 1,
             "pipeline schedule: stage " + std::to_string(r) + " of " + std::to_string(p) +
                 " with " + std::to_string(m) + " micro-batches and " + std::to_string(v) +
                 " chunks is out of range");
  LOOM_CHECK((schedule == "interleaved") == (v > 1),
             "pipeline schedule '" + schedule + "' with " + std::to_string(v) +
                 " model chunks per rank (only 'interleaved' takes more than one)");
  std::vector<Pass> out;
  if (schedule == "gpipe") {
    for (int i = 0; i < m; ++i) out.push_back({Pass::Forward, i});
    for (int i = 0; i < m; ++i) out.push_back({Pass::Backward, i});
    return out;
  }
  if (schedule == "1f1b") {
    const int warmup = std::min(p - r - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) out.push_back({Pass::Forward, f});
    for (; f < m; ++f, ++b) {  // steady state: one forward, one backward
      out.push_back({Pass::Forward, f});
      out.push_back({Pass::Backward, b});
    }
    for (; b < m; ++b) out.push_back({Pass::Backward, b});  // cool-down
    return out;
  }
  LOOM_CHECK(schedule == "interleaved", "pipeline schedule '" + schedule +
                                            "' is not one of "
                                            "gpipe, 1f1b, interleaved");
  LOOM_CHECK(m % p == 0, "gradient_accumulation_steps " + std::to_string(m) +
                             " must be a multiple of pipeline_parallel.size " + std::to_string(p) +
                             " for the interleaved schedule (its micro-batches go in groups of p)");
  const int total = m * v;
  const int warmup = m == p ? total : std::min((p - r - 1) * 2 + (v - 1) * p, total);
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back(interleaved_pass(Pass::Forward, f, p, v));
  for (; f < total; ++f, ++b) {
    out.push_back(interleaved_pass(Pass::Forward, f, p, v));
    out.push_back(interleaved_pass(Pass::Backward, b, p, v));
  }
  for (; b < total; ++b) out.push_back(interleaved_pass(Pass::Backward, b, p, v));
  return out;
}

int max_in_flight(const std::vector<Pass>& passes) {
  // A micro-batch enters with its first forward on the rank and leaves with its last
  // backward: count its passes.
  std::vector<int> left;
  for (const Pass& s : passes) {
    if (s.micro >= static_cast<int>(left.size())) left.resize(s.micro + 1, 0);
    ++left[s.micro];
  }
  std::set<int> held;
  size_t most = 0;
  for (const Pass& s : passes) {
    held.insert(s.micro);
    most = std::max(most, held.size());
    if (--left[s.micro] == 0) held.erase(s.micro);
  }
  return static_cast<int>(most);
}

std::string schedule_str(const std::vector<Pass>& passes) {
  std::string s;
  for (const Pass& x : passes) {
    if (!s.empty()) s += ' ';
    s += static_cast<char>(x.kind);
    s += std::to_string(x.micro);
    if (x.chunk > 0) {  // appended: "." + to_string trips GCC 12's -Wrestrict false positive
      s += '.';
      s += std::to_string(x.chunk);
    }
  }
  return s;
}

}  // namespace loom::parallel
