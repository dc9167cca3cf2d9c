#include "loom/util/stop_signals.h"

#include <unistd.h>

#include <csignal>

namespace loom {

namespace {
volatile std::sig_atomic_t g_first = 0;
volatile std::sig_atomic_t g_announce = 0;
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
struct sigaction g_old[3];

void on_signal(int sig) {
  if (g_first != 0) _exit(128 + sig);  // the second: at once
  g_first = sig;
  if (g_announce) {
    static const char msg[] =
        "loom: stop requested: finishing this step and saving a checkpoint (signal again to "
        "stop at once)\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  }
}
}  // namespace

StopSignals::StopSignals(bool announce) {
  g_first = 0;
  g_announce = announce ? 1 : 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a collective or a write in progress carries on
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &g_old[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &g_old[i], nullptr);
}

bool StopSignals::requested() { return g_first != 0; }

int StopSignals::signal_number() { return g_first; }

const char* StopSignals::signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace loom
