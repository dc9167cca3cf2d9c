// Error type for every failure at a boundary (files, configs, shapes).
// Contract: the message names the file, key or tensor and what is wrong; callers
// at the top (cli/) print it and exit non-zero. Inner code throws, never exits.
#pragma once

#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// LOOM_CHECK(cond, msg): throws loom::Error(msg) when cond is false. msg is any
// expression convertible to std::string, evaluated only on failure.
#define LOOM_CHECK(cond, msg)                           \
  do {                                                  \
    if (!(cond)) throw ::loom::Error(std::string(msg)); \
  } while (0)

}  // namespace loom
