// Numbers for people: 1234567 -> "1,234,567" (progress bars, `loom report`).
#pragma once

#include <cstdint>
#include <string>

namespace loom {

inline std::string with_thousands(int64_t v) {
  const std::string s = std::to_string(v);
  const size_t start = v < 0 ? 1 : 0;
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > start && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

}  // namespace loom
