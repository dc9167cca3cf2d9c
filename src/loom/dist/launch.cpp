#include "loom/dist/launch.h"

#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include "loom/util/error.h"

extern char** environ;

namespace loom::dist {

LaunchHost LaunchHost::current() {
  LaunchHost h;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    h.cores = CPU_COUNT(&set);
  else
    h.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  h.root = ::geteuid() == 0;
  h.omp_num_threads_set = std::getenv("OMP_NUM_THREADS") != nullptr;
  h.omp_wait_policy_set = std::getenv("OMP_WAIT_POLICY") != nullptr;
  return h;
}

std::vector<std::string> mpirun_command(int n, const std::vector<std::string>& loom_args,
                                        const std::string& self_exe, const std::string& hostfile,
                                        const LaunchHost& host) {
  LOOM_CHECK(n >= 1, "launch: the number of processes must be >= 1, got " + std::to_string(n));
  LOOM_CHECK(!self_exe.empty(), "launch: empty program path");
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(n)};
  if (!hostfile.empty()) {
    cmd.insert(cmd.end(), {"--hostfile", hostfile});
  } else if (n > host.cores) {
    cmd.push_back("--oversubscribe");
  }
  cmd.insert(cmd.end(), {"--bind-to", "none"});
  if (host.root) cmd.push_back("--allow-run-as-root");
  if (host.omp_num_threads_set) {
    cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS"});
  } else if (hostfile.empty()) {
    cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(std::max(1, host.cores / n))});
  }
  cmd.insert(cmd.end(),
             {"-x", host.omp_wait_policy_set ? "OMP_WAIT_POLICY" : "OMP_WAIT_POLICY=PASSIVE"});
  cmd.push_back(self_exe);
  cmd.insert(cmd.end(), loom_args.begin(), loom_args.end());
  return cmd;
}

namespace {

constexpr const char* kShellSafe =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,+@%";

// The command as a shell would need it typed, for the log line.
std::string shell_line(const std::vector<std::string>& argv) {
  std::string line;
  for (const auto& a : argv) {
    if (!line.empty()) line += ' ';
    bool plain = !a.empty() && a.find_first_not_of(kShellSafe) == std::string::npos;
    if (plain) {
      line += a;
      continue;
    }
    line += '\'';
    for (char c : a) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += '\'';
  }
  return line;
}

// While mpirun runs, a SIGINT (Ctrl-C) or SIGTERM (a scheduler) to this process becomes a
// SIGUSR1 to mpirun, which forwards it to every rank: they finish the step, save a
// checkpoint and exit (util/stop_signals.h). mpirun answers SIGINT/SIGTERM itself by
// killing the ranks a second later, so it runs in its own process group, out of the
// terminal's reach (and, as a background group, it leaves the terminal's input alone). A
// second signal is passed on as SIGTERM: mpirun then stops the job at once. SIGQUIT is
// ignored here, as system() does.
volatile std::sig_atomic_t g_mpirun = 0;
volatile std::sig_atomic_t g_signals = 0;

void forward_stop(int) {
  const int first = g_signals == 0;
  g_signals = 1;
  if (g_mpirun > 0) ::kill(static_cast<pid_t>(g_mpirun), first ? SIGUSR1 : SIGTERM);
}

struct ForwardStops {
  struct sigaction old_int {
  }, old_term{}, old_quit{};
  ForwardStops() {
    g_signals = 0;
    struct sigaction fwd {};
    fwd.sa_handler = forward_stop;
    sigemptyset(&fwd.sa_mask);
    fwd.sa_flags = SA_RESTART;
    sigaction(SIGINT, &fwd, &old_int);
    sigaction(SIGTERM, &fwd, &old_term);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGQUIT, &ignore, &old_quit);
  }
  ~ForwardStops() {
    g_mpirun = 0;
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    sigaction(SIGQUIT, &old_quit, nullptr);
  }
};

}  // namespace

int launch(int n, const std::vector<std::string>& loom_args, const std::string& self_exe,
           const std::string& hostfile) {
  LOOM_CHECK(hostfile.empty() || std::filesystem::is_regular_file(hostfile),
             "launch: hostfile " + hostfile + " does not exist");
  std::vector<std::string> cmd =
      mpirun_command(n, loom_args, self_exe, hostfile, LaunchHost::current());
  std::cerr << "loom launch: " << shell_line(cmd) << std::endl;

  std::vector<char*> argv;
  for (auto& a : cmd) argv.push_back(a.data());
  argv.push_back(nullptr);

  ForwardStops forward;
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGQUIT);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);  // its own process group (see ForwardStops)
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, "mpirun", nullptr, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (rc == 0) g_mpirun = pid;
  LOOM_CHECK(rc != ENOENT,
             "launch: mpirun not found on PATH (OpenMPI's openmpi-bin package provides it; "
             "scripts/install_deps.sh installs it)");
  LOOM_CHECK(rc == 0, std::string("launch: cannot start mpirun: ") + std::strerror(rc));

  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    LOOM_CHECK(errno == EINTR, std::string("launch: waiting for mpirun: ") + std::strerror(errno));
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace loom::dist
