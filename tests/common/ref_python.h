// Running the reference scripts (scripts/check_*.py) from a test: the reference
// environment's python (LOOM_REF_PYTHON, else ~/.cache/loom/ref-venv, made by
// scripts/ref_venv.sh; tests skip where it is absent) and a command's exit code and output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>

namespace loom::test {

inline std::filesystem::path ref_python() {
  if (const char* p = std::getenv("LOOM_REF_PYTHON")) return p;
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : "/root") / ".cache/loom/ref-venv/bin/python";
}

// Exit code (-1 if it did not exit normally) and stdout + stderr of a shell command.
inline std::pair<int, std::string> run_command(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed: " + cmd};
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace loom::test
