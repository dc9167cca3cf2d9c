// Tensor: a shaped, typed view into reference-counted storage.
// Contract: tensors are contiguous row-major; a view shares storage with its parent
// (offset + shape), so slicing a flat parameter buffer costs nothing. Storage is either
// owned (64-byte aligned heap) or borrowed (e.g. an mmap kept alive by its owner).
// Only f32 has kernels today; bf16/f16 are storage types for I/O and later mixed precision.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom {

enum class DType : uint8_t { F32, BF16, F16, I32 };
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[3, 16, 256]"

// Bytes held by owned storage now, and the most held at once since the last reset (what
// the engine reports as its measured memory, beside the process's peak RSS).
struct StorageStats {
  int64_t live_bytes = 0, peak_bytes = 0;
};
StorageStats storage_stats();
void reset_storage_peak();

// A block of bytes. Owned storage is zero-initialised.
class Storage {
 public:
  explicit Storage(size_t nbytes);
  Storage(void* borrowed, size_t nbytes);  // not freed by us
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  std::byte* data() { return data_; }
  size_t nbytes() const { return nbytes_; }
  // Gives the whole pages inside bytes [begin, end) back to the kernel: they cost no memory
  // until written again and read as zeros (mmap'ed storage only; a no-op otherwise). For
  // contents that are dead while the rest of the buffer lives on.
  void release(size_t begin, size_t end);

 private:
  std::byte* data_;
  size_t nbytes_;
  bool owned_;
  bool mapped_ = false;  // from mmap (large buffers), else aligned_alloc
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor zeros(const Shape& shape, DType dt = DType::F32);
  // A view of `shape` starting `elem_offset` elements into `storage`.
  static Tensor view_of(std::shared_ptr<Storage> storage, size_t elem_offset, const Shape& shape,
                        DType dt = DType::F32);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return numel() * dtype_size(dtype_); }

  void* raw() const { return storage_->data() + offset_ * dtype_size(dtype_); }
  float* f32() const;  // checks dtype
  int32_t* i32() const;

  Tensor reshape(const Shape& shape) const;         // same numel, shares storage
  Tensor slice0(int64_t begin, int64_t end) const;  // rows [begin, end) of dim 0
  void zero_() const;
  void copy_from(const Tensor& src) const;  // same shape and dtype
  // The view's contents are dead: Storage::release of its bytes (the whole pages inside it).
  void release_pages() const;
  bool shares_storage(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace loom
