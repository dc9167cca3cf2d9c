// A progress bar for the long loops before and between training steps (tokenizing a data
// file, an evaluation pass):
//   "tokenizing zh_dialogue.json  [#########.........]  4,812/10,000  48%  ETA 3s"
// rewritten in place at most ten times a second and cleared when done. It shows only when
// enabled for the process (the trainer enables it on rank 0 when stderr is a terminal);
// otherwise it prints nothing, so logs and CI keep their plain lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace loom {

class Progress {
 public:
  static void enable(bool on);
  static bool enabled();

  Progress(std::string label, int64_t total);
  ~Progress();  // clears the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void update(int64_t done);

 private:
  std::string label_;
  int64_t total_;
  std::chrono::steady_clock::time_point start_, last_;
  bool drawn_ = false;
};

}  // namespace loom
