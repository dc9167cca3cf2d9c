// Read-only mmap of a whole regular file, for the bounds-checked readers in io/.
// Throws loom::Error naming the file when it cannot be opened, is not a regular file, or is
// shorter than min_size ("too short for a <kind> header"). The caller owns the mapping and
// releases it with munmap(data, size).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "loom/util/error.h"

namespace loom {

struct Mapping {
  void* data = nullptr;
  uint64_t size = 0;
};

inline Mapping map_file_readonly(const std::filesystem::path& path, const std::string& kind,
                                 uint64_t min_size) {
  const std::string f = path.string();
  auto err = [] { return std::string(std::strerror(errno)); };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOOM_CHECK(fd >= 0, f + ": cannot open " + kind + " file: " + err());
  struct stat sb {};
  std::string problem;
  if (::fstat(fd, &sb) != 0) {
    problem = "cannot stat: " + err();
  } else if (!S_ISREG(sb.st_mode)) {
    problem = "not a regular file";
  } else if (static_cast<uint64_t>(sb.st_size) < min_size) {
    problem = "file is " + std::to_string(sb.st_size) + " bytes, too short for a " + kind +
              " header (need at least " + std::to_string(min_size) + ")";
  }
  if (!problem.empty()) {
    ::close(fd);
    throw Error(f + ": " + problem);
  }
  const uint64_t size = static_cast<uint64_t>(sb.st_size);
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string map_err = err();
  ::close(fd);  // the mapping keeps the file alive
  LOOM_CHECK(m != MAP_FAILED, f + ": mmap failed: " + map_err);
  return {m, size};
}

}  // namespace loom
