// Writes a whole file through a temporary beside it (path.tmp-<pid>) and a rename, so a
// reader, or a crash, sees the old file or the new one, never part of one. A failed write
// (disk full, file-size limit) removes the temporary and throws naming the file and why.
#pragma once

#include <filesystem>
#include <string_view>

namespace loom {

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

}  // namespace loom
