// `loom launch -n N -- ARGS...`: starts N copies of this program under OpenMPI's mpirun, with
// the settings a CPU job on one machine needs, so users need not remember them:
//   mpirun -np N [--hostfile F] [--oversubscribe] --bind-to none [--allow-run-as-root]
//          -x OMP_NUM_THREADS=max(1, cores/N) -x OMP_WAIT_POLICY=PASSIVE SELF_EXE ARGS...
// --oversubscribe when N exceeds the cores this process may run on; --bind-to none because
// each rank runs its own OpenMP pool, which mpirun's default core binding would squeeze onto
// one core; --allow-run-as-root when running as root (mpirun refuses otherwise); ranks x
// threads kept within the cores, and passive OpenMP waits, so pools do not fight for them.
// A variable the user already set is forwarded as it is (-x NAME) instead. With a hostfile
// the hosts' slots decide placement and the local core count says nothing about the other
// hosts, so neither --oversubscribe nor a computed OMP_NUM_THREADS is added.
#pragma once

#include <string>
#include <vector>

namespace loom::dist {

// What the command depends on about this machine and environment.
struct LaunchHost {
  int cores = 1;  // CPUs this process may run on (its affinity mask)
  bool root = false;
  bool omp_num_threads_set = false;
  bool omp_wait_policy_set = false;
  static LaunchHost current();
};

// The mpirun command line (argv, "mpirun" first). Throws loom::Error if n < 1 or self_exe
// is empty.
std::vector<std::string> mpirun_command(int n, const std::vector<std::string>& loom_args,
                                        const std::string& self_exe, const std::string& hostfile,
                                        const LaunchHost& host);

// Prints mpirun_command(..., LaunchHost::current()) to stderr, runs it and returns mpirun's
// exit status (128 + signal if it was killed). A first Ctrl-C or SIGTERM asks every rank to
// stop gracefully (SIGUSR1 through mpirun: a training run saves a checkpoint and exits
// with kExitInterrupted, util/stop_signals.h); a second stops the job at once. Throws
// loom::Error if mpirun is not on PATH or the hostfile does not exist.
int launch(int n, const std::vector<std::string>& loom_args, const std::string& self_exe,
           const std::string& hostfile = "");

}  // namespace loom::dist
