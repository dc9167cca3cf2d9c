// A graceful stop for long runs (a scheduler's preemption, Ctrl-C). While a StopSignals
// object lives, the first SIGTERM, SIGINT or SIGUSR1 only sets a flag that the training
// loop reads between steps (every rank then finishes the step, saves a resumable
// checkpoint and exits with kExitInterrupted); a second one ends the process at once with
// status 128 + signal. SIGUSR1 is what `loom launch` turns a SIGTERM/SIGINT into, because
// mpirun forwards SIGUSR1 to the ranks but answers SIGTERM/SIGINT by killing them within a
// second; SLURM sends SIGTERM (or, with --signal, SIGUSR1) to each task itself. The
// previous handlers come back when the object goes.
#pragma once

namespace loom {

// EX_TEMPFAIL from sysexits.h: stopped on request after saving a checkpoint; resume it.
constexpr int kExitInterrupted = 75;

class StopSignals {
 public:
  explicit StopSignals(bool announce);  // announce: say so on stderr when a signal comes
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  static bool requested();
  static int signal_number();  // the first signal received, 0 if none
  static const char* signal_name(int sig);
};

}  // namespace loom
