#include "loom/util/profile.h"

namespace loom::prof {
namespace {
bool g_enabled = false;
Totals g_totals;
int g_depth = 0;
int64_t g_inner_ns = 0;  // time claimed by finished inner phases (for nesting)
}  // namespace

const char* phase_name(Phase p) {
  static const char* names[] = {"gemm",      "attention", "norm", "activation", "loss",
                                "embedding", "optimizer", "comm", "other"};
  return names[static_cast<int>(p)];
}

void enable(bool on) { g_enabled = on; }
bool enabled() { return g_enabled; }
void reset() { g_totals = Totals{}; }
Totals totals() { return g_totals; }

ScopedPhase::ScopedPhase(Phase p) : phase_(p), active_(g_enabled) {
  if (!active_) return;
  ++g_depth;
  child_ns_at_start_ = g_inner_ns;
  start_ = std::chrono::steady_clock::now();
}

ScopedPhase::~ScopedPhase() {
  if (!active_) return;
  int64_t total = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
  int64_t inner = g_inner_ns - child_ns_at_start_;
  g_totals.ns[static_cast<int>(phase_)] += total - inner;
  --g_depth;
  // Report the whole span to the parent so it subtracts it; reset at top level.
  g_inner_ns = g_depth == 0 ? 0 : child_ns_at_start_ + total;
}

}  // namespace loom::prof
