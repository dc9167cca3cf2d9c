#include "loom/util/progress.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <utility>

#include "loom/util/format.h"

namespace loom {

namespace {
std::atomic<bool> g_enabled{false};
}  // namespace

void Progress::enable(bool on) { g_enabled = on; }
bool Progress::enabled() { return g_enabled; }

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (drawn_) std::fputs("\r\033[2K", stderr);
}

void Progress::update(int64_t done) {
  if (!g_enabled || total_ <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  drawn_ = true;
  constexpr int kWidth = 24;
  const double f = std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
  std::string bar(kWidth, '.');
  for (int i = 0; i < static_cast<int>(f * kWidth); ++i) bar[i] = '#';
  const double secs = std::chrono::duration<double>(now - start_).count();
  char eta[32] = "";
  if (done > 0 && done < total_) std::snprintf(eta, sizeof eta, "  ETA %.0fs", secs / f - secs);
  std::fprintf(stderr, "\r\033[2K%s  [%s]  %s/%s  %3.0f%%%s", label_.c_str(), bar.c_str(),
               with_thousands(done).c_str(), with_thousands(total_).c_str(), 100.0 * f, eta);
  std::fflush(stderr);
}

}  // namespace loom
