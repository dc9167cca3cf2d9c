// libFuzzer helper: the parsers under test read files, so each input is written to one
// per-process file in /dev/shm (or /tmp) and the parser opens that path.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace loom::fuzz {

// The file is removed when the fuzzer exits (libFuzzer ends a timed run with exit()).
inline std::filesystem::path input_file(const uint8_t* data, size_t size, const char* ext) {
  struct RemovedAtExit {
    std::filesystem::path path;
    ~RemovedAtExit() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  };
  static const RemovedAtExit file{(std::filesystem::exists("/dev/shm")
                                       ? std::filesystem::path("/dev/shm")
                                       : std::filesystem::temp_directory_path()) /
                                  ("loom-fuzz-" + std::to_string(::getpid()) + ext)};
  std::ofstream(file.path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return file.path;
}

}  // namespace loom::fuzz
