#include "loom/util/atomic_write.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "loom/util/error.h"

namespace loom {

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  const std::string tmp = path.string() + ".tmp-" + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  LOOM_CHECK(f, path.string() + ": cannot write: " + std::strerror(errno));
  const bool wrote = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int err = errno;
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !closed) {
    const int why = wrote ? errno : err;
    std::remove(tmp.c_str());
    throw Error(path.string() + ": write failed: " + std::strerror(why));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int why = errno;
    std::remove(tmp.c_str());
    throw Error(path.string() + ": cannot rename into place: " + std::strerror(why));
  }
}

}  // namespace loom
