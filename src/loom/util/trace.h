// The schedule trace: what this process did when, as spans (forward and backward of a
// micro-batch, the optimizer step, every Communicator call and every wait on a non-blocking
// one, the step and evaluation around them), kept in memory until dist/job_trace.h gathers
// every rank's into one Chrome trace-event file. Off by default: a Span costs one branch
// then. Spans nest (RAII) and are recorded only by the thread that drives the step (the
// Communicator's thread; OpenMP threads inside kernels never record). Times come from
// std::chrono::steady_clock (CLOCK_MONOTONIC on Linux), which all processes of one machine
// share, so spans of ranks on one machine are ordered across ranks.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::trace {

enum class Kind : uint8_t {
  Forward,    // one micro-batch's forward (shown as F<micro>)
  Backward,   // one micro-batch's backward (shown as B<micro>)
  Optimizer,  // the optimizer step, parameter sync included
  Comm,       // a Communicator call: a blocking collective, or posting a non-blocking one
  Wait,       // waiting for a non-blocking Communicator call to complete
  Step,       // one whole training step
  Eval,       // one evaluation pass
};
const char* kind_name(Kind k);  // "forward", ..., the Chrome event's category

struct Event {
  Kind kind;
  const char* op = nullptr;  // Comm/Wait: the Communicator call ("all_gather"); a literal
  int micro = -1;            // micro-batch index, -1 when none
  int64_t step = -1;         // Step: the step's index
  int64_t bytes = -1;        // Comm/Wait: the call's payload on this rank
  int peer = -1;             // point-to-point: the other rank (in the call's communicator)
  int chunk = -1;            // Forward/Backward: the rank's model chunk (interleaved schedule)
  int64_t start_ns = 0, end_ns = 0;
};

void enable(bool on);
bool enabled();
// This rank's events so far, in the order they ended (inner spans before the span around
// them), and the recorder emptied. At most kMaxEvents are kept; later ones are counted in
// dropped() (cleared too) instead of growing memory without bound on long runs.
std::vector<Event> take();
int64_t dropped();
constexpr int64_t kMaxEvents = int64_t{1} << 20;  // ~64 MiB

// Spans begun while a MicroScope lives take its micro-batch unless they name their own:
// the waits and collectives a pass triggers carry that pass's micro-batch.
class MicroScope {
 public:
  explicit MicroScope(int micro);
  ~MicroScope();
  MicroScope(const MicroScope&) = delete;
  MicroScope& operator=(const MicroScope&) = delete;

 private:
  int saved_;
};

class Span {
 public:
  // Forward and Backward name their micro-batch (and model chunk), Step its index; the
  // others neither.
  explicit Span(Kind kind, int micro = -1, int64_t step = -1, int chunk = -1);
  // Comm, Wait: `op` must be a string literal (or otherwise outlive the recorder).
  Span(Kind kind, const char* op, int64_t bytes, int peer = -1);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool active_;
  Event ev_;
};

}  // namespace loom::trace
