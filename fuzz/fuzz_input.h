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

inline std::filesystem::path input_file(const uint8_t* data, size_t size, const char* ext) {
  static const std::filesystem::path dir =
      std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
  const std::filesystem::path p = dir / ("loom-fuzz-" + std::to_string(::getpid()) + ext);
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return p;
}

}  // namespace loom::fuzz
