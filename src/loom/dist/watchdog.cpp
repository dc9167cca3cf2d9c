#include "loom/dist/watchdog.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "loom/dist/communicator.h"

namespace loom::dist {

namespace fs = std::filesystem;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The call in flight on the communicating thread: since_ns 0 when none. The thread writes
// op/bytes/comm, then publishes since_ns; the watchdog reads since_ns, then the rest.
std::atomic<int64_t> g_since_ns{0};
std::atomic<const char*> g_op{nullptr};
std::atomic<int64_t> g_bytes{0};
std::atomic<const Communicator*> g_comm{nullptr};

struct Watchdog {
  double timeout_s = 0;
  fs::path dir;
  int rank = 0, size = 1;
  std::atomic<bool> stop{false};
  std::thread thread;
};
std::mutex g_mutex;
Watchdog* g_dog = nullptr;

std::string ranks_str(const std::set<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

[[noreturn]] void fire(const Watchdog& w, int64_t since, const char* op, int64_t bytes,
                       const Communicator* comm) {
  const double waited = (now_ns() - since) / 1e9;
  std::set<int> group;
  for (int r : comm->world_ranks()) group.insert(r);
  char line[512];
  std::snprintf(
      line, sizeof line, "%s (%lld bytes) over a group of %d ranks (world ranks %s), waited %.1f s",
      op ? op : "?", static_cast<long long>(bytes), comm->size(), ranks_str(group).c_str(), waited);
  std::fprintf(stderr, "loom: rank %d of %d: comm watchdog: %s, more than comm_timeout_s %g\n",
               w.rank, w.size, line, w.timeout_s);
  std::fflush(stderr);
  // This rank's report, then the others' for a few seconds.
  const fs::path mine = w.dir / ("rank" + std::to_string(w.rank));
  {
    std::ofstream(mine.string() + ".tmp") << line << "\n";
    std::error_code ec;
    fs::rename(mine.string() + ".tmp", mine, ec);
  }
  std::set<int> reported;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (true) {
    reported.clear();
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(w.dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.starts_with("rank") && n.find('.') == std::string::npos)
        reported.insert(std::atoi(n.c_str() + 4));
    }
    bool all = true;
    for (int r : group) all &= reported.count(r) > 0;
    if (all || std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::set<int> missing;
  for (int r : group)
    if (!reported.count(r)) missing.insert(r);
  if (reported.empty() || w.rank == *reported.begin())  // the lowest reporter speaks
    std::fprintf(stderr,
                 "loom: comm watchdog: %s did not arrive in %s; ending the job (ranks that "
                 "reported waiting: %s)\n",
                 missing.empty()       ? "no rank (all are waiting: a mismatched call order?)"
                 : missing.size() == 1 ? ("rank " + ranks_str(missing)).c_str()
                                       : ("ranks " + ranks_str(missing)).c_str(),
                 line, ranks_str(reported).c_str());
  std::fflush(stderr);
  _exit(1);
}

void watch(Watchdog* w) {
  while (!w->stop.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const int64_t since = g_since_ns.load(std::memory_order_acquire);
    if (since == 0 || (now_ns() - since) / 1e9 <= w->timeout_s) continue;
    const char* op = g_op.load();
    const int64_t bytes = g_bytes.load();
    const Communicator* comm = g_comm.load();
    if (g_since_ns.load(std::memory_order_acquire) != since || !comm) continue;  // moved on
    fire(*w, since, op, bytes, comm);
  }
}

}  // namespace

void start_watchdog(double timeout_s, const fs::path& dir, int world_rank, int world_size) {
  stop_watchdog();
  if (timeout_s <= 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_dog = new Watchdog;
  g_dog->timeout_s = timeout_s;
  g_dog->dir = dir;
  g_dog->rank = world_rank;
  g_dog->size = world_size;
  g_dog->thread = std::thread(watch, g_dog);
}

void stop_watchdog() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_dog) return;
  g_dog->stop = true;
  g_dog->thread.join();
  delete g_dog;
  g_dog = nullptr;
}

InFlight::InFlight(const char* op, int64_t bytes, const Communicator* comm) {
  if (!comm || comm->size() == 1 || g_since_ns.load(std::memory_order_relaxed) != 0) return;
  g_op.store(op);
  g_bytes.store(bytes);
  g_comm.store(comm);
  g_since_ns.store(now_ns(), std::memory_order_release);
  armed_ = true;
}

InFlight::~InFlight() {
  if (armed_) g_since_ns.store(0, std::memory_order_release);
}

}  // namespace loom::dist
