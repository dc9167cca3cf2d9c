// "~/x" -> "$HOME/x" for paths in configs and on the command line (shells expand ~ only
// in unquoted words, and never inside JSON).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace loom {

inline std::filesystem::path expand_user(const std::filesystem::path& p) {
  const std::string s = p.string();
  if (s.rfind("~/", 0) != 0) return p;
  const char* home = std::getenv("HOME");
  return home ? std::filesystem::path(home) / s.substr(2) : p;
}

}  // namespace loom
