#include "loom/util/trace.h"

#include <chrono>
#include <utility>

namespace loom::trace {
namespace {
bool g_enabled = false;
int g_micro = -1;  // the innermost MicroScope's
std::vector<Event> g_events;
int64_t g_dropped = 0;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

const char* kind_name(Kind k) {
  static const char* names[] = {"forward", "backward", "optimizer", "comm", "wait", "step", "eval"};
  return names[static_cast<int>(k)];
}

void enable(bool on) { g_enabled = on; }
bool enabled() { return g_enabled; }

std::vector<Event> take() {
  g_dropped = 0;
  return std::exchange(g_events, {});
}

int64_t dropped() { return g_dropped; }

MicroScope::MicroScope(int micro) : saved_(std::exchange(g_micro, micro)) {}
MicroScope::~MicroScope() { g_micro = saved_; }

Span::Span(Kind kind, int micro, int64_t step, int chunk) : active_(g_enabled), ev_{kind} {
  if (!active_) return;
  ev_.micro = micro >= 0 ? micro : g_micro;
  ev_.step = step;
  ev_.chunk = chunk;
  ev_.start_ns = now_ns();
}

Span::Span(Kind kind, const char* op, int64_t bytes, int peer) : active_(g_enabled), ev_{kind} {
  if (!active_) return;
  ev_.op = op;
  ev_.micro = g_micro;
  ev_.bytes = bytes;
  ev_.peer = peer;
  ev_.start_ns = now_ns();
}

Span::~Span() {
  if (!active_) return;
  ev_.end_ns = now_ns();
  if (static_cast<int64_t>(g_events.size()) < kMaxEvents)
    g_events.push_back(ev_);
  else
    ++g_dropped;
}

}  // namespace loom::trace
