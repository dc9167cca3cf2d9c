// Step-time breakdown by phase (GEMM, attention, optimizer, ...), for the benchmark and
// `loom train --profile`. Off by default: a disabled ScopedPhase costs one branch.
// Phases do not nest: an inner ScopedPhase's time is subtracted from its parent, so the
// totals add up to the wall time spent inside any phase.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace loom::prof {

enum class Phase : int {
  Gemm,
  Attention,
  Norm,
  Activation,
  Loss,
  Embedding,
  Optimizer,
  Comm,
  Other,
  kCount
};
const char* phase_name(Phase p);

struct Totals {
  std::array<int64_t, static_cast<int>(Phase::kCount)> ns{};
};

void enable(bool on);
bool enabled();
void reset();
Totals totals();

class ScopedPhase {
 public:
  explicit ScopedPhase(Phase p);
  ~ScopedPhase();
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  Phase phase_;
  bool active_;
  std::chrono::steady_clock::time_point start_;
  int64_t child_ns_at_start_;
};

}  // namespace loom::prof
