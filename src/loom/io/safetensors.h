// Hugging Face safetensors: read (mmap, read-only) and atomic write.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data section.
// Contract: open() validates every length and offset before anything is dereferenced, so a
// corrupt or truncated file throws loom::Error (naming the file, and the tensor where there
// is one) instead of crashing. Views point into the mapping and live as long as the owning
// SafetensorsFile / SafetensorsCheckpoint. Shrinking a file while it is mapped is outside
// this contract (the kernel answers with SIGBUS). Little-endian hosts only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::io {

enum class StDType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

size_t st_dtype_size(StDType dtype);
const char* st_dtype_name(StDType dtype);  // "F32", "BF16", ...

struct StTensorView {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // exactly numel() * st_dtype_size(dtype) bytes
  int64_t numel() const;            // 1 for a 0-d tensor
};

// One .safetensors file mapped read-only (MAP_PRIVATE). Move-only; the destructor unmaps.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::vector<StTensorView>& tensors() const { return tensors_; }  // by data offset
  const StTensorView* find(std::string_view name) const;                 // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  void unmap() noexcept;

  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<StTensorView> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// A model's weights: a single .safetensors file, a folder holding model.safetensors, or a
// folder holding model.safetensors.index.json plus its shards (the index file itself may
// also be passed). A folder with both prefers model.safetensors, as transformers does.
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open(const std::filesystem::path& file_or_dir);

  const StTensorView* find(std::string_view name) const;  // nullptr if absent
  std::vector<std::string> names() const;                 // sorted
  // The file holding `name`, for error messages; throws loom::Error if absent.
  const std::filesystem::path& file_of(std::string_view name) const;
  const std::filesystem::path& path() const { return path_; }  // what open() was given

  // Copies tensor `name` into out (numel floats) as float32, converting from
  // F32/F16/BF16/F64. Throws loom::Error naming the tensor and its file if it is missing,
  // not floating, or its shape differs ("[64, 192] vs expected [192, 64]").
  void read_f32(std::string_view name, std::span<const int64_t> expected_shape, float* out) const;

 private:
  struct Entry {
    size_t file;
    const StTensorView* view;  // points into files_[file].tensors(); stable across moves
  };
  std::filesystem::path path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

struct StWriteTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes a safetensors file atomically: to a temporary file beside `path`, fsync, then
// rename, so a failure leaves neither a half-written file at `path` nor the temporary.
// Header JSON (tensors in the order given, "__metadata__" first when non-empty) is padded
// with spaces to a multiple of 8 bytes so data starts aligned; data offsets follow the
// order given. Checks, before creating anything: unique non-empty names (not
// "__metadata__"), non-negative dims, nbytes == numel * dtype size.
void write_safetensors(const std::filesystem::path& path, std::span<const StWriteTensor> tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace loom::io
