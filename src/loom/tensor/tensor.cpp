#include "loom/tensor/tensor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "loom/util/error.h"

namespace loom {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
  }
  return "?";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

namespace {
// Buffers this large come straight from mmap: the kernel hands out zero pages lazily, so
// a buffer costs resident memory only where it is written (a frozen quantized weight's
// f32 slot that is never filled costs nothing).
constexpr size_t kMmapBytes = size_t{1} << 20;
std::atomic<int64_t> g_live{0}, g_peak{0};

void account(int64_t delta) {
  const int64_t now = g_live.fetch_add(delta) + delta;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

StorageStats storage_stats() { return {g_live.load(), g_peak.load()}; }
void reset_storage_peak() { g_peak.store(g_live.load()); }

Storage::Storage(size_t nbytes) : nbytes_(nbytes), owned_(true) {
  const size_t padded = nbytes == 0 ? 64 : (nbytes + 63) / 64 * 64;
  if (padded >= kMmapBytes) {
    void* p = ::mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw Error("out of memory allocating " + std::to_string(nbytes) + " bytes");
    data_ = static_cast<std::byte*>(p);
    mapped_ = true;
  } else {
    data_ = static_cast<std::byte*>(std::aligned_alloc(64, padded));
    if (!data_) throw Error("out of memory allocating " + std::to_string(nbytes) + " bytes");
    std::memset(data_, 0, padded);
  }
  account(static_cast<int64_t>(nbytes_));
}

void Storage::release(size_t begin, size_t end) {
  if (!mapped_ || end > nbytes_) return;
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (first < last) ::madvise(data_ + first, last - first, MADV_DONTNEED);
}

Storage::Storage(void* borrowed, size_t nbytes)
    : data_(static_cast<std::byte*>(borrowed)), nbytes_(nbytes), owned_(false) {}

Storage::~Storage() {
  if (!owned_) return;
  account(-static_cast<int64_t>(nbytes_));
  if (mapped_)
    ::munmap(data_, nbytes_ == 0 ? 64 : (nbytes_ + 63) / 64 * 64);
  else
    std::free(data_);
}

Tensor Tensor::zeros(const Shape& shape, DType dt) {
  for (int64_t d : shape) LOOM_CHECK(d >= 0, "negative dimension in shape " + shape_str(shape));
  auto st = std::make_shared<Storage>(shape_numel(shape) * dtype_size(dt));
  return view_of(std::move(st), 0, shape, dt);
}

Tensor Tensor::view_of(std::shared_ptr<Storage> storage, size_t elem_offset, const Shape& shape,
                       DType dt) {
  size_t end = (elem_offset + shape_numel(shape)) * dtype_size(dt);
  LOOM_CHECK(end <= storage->nbytes(), "tensor view " + shape_str(shape) + " at offset " +
                                           std::to_string(elem_offset) + " exceeds its storage");
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = elem_offset;
  t.shape_ = shape;
  t.dtype_ = dt;
  return t;
}

float* Tensor::f32() const {
  LOOM_CHECK(dtype_ == DType::F32,
             std::string("expected an f32 tensor, got ") + dtype_name(dtype_));
  return static_cast<float*>(raw());
}

int32_t* Tensor::i32() const {
  LOOM_CHECK(dtype_ == DType::I32,
             std::string("expected an i32 tensor, got ") + dtype_name(dtype_));
  return static_cast<int32_t*>(raw());
}

Tensor Tensor::reshape(const Shape& shape) const {
  LOOM_CHECK(shape_numel(shape) == numel(),
             "cannot reshape " + shape_str(shape_) + " to " + shape_str(shape));
  return view_of(storage_, offset_, shape, dtype_);
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  LOOM_CHECK(
      ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
      "slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + shape_str(shape_));
  Shape s = shape_;
  s[0] = end - begin;
  int64_t row = shape_numel(shape_) / (shape_[0] == 0 ? 1 : shape_[0]);
  return view_of(storage_, offset_ + begin * row, s, dtype_);
}

void Tensor::zero_() const { std::memset(raw(), 0, nbytes()); }

void Tensor::copy_from(const Tensor& src) const {
  LOOM_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_,
             "copy from " + shape_str(src.shape_) + " into " + shape_str(shape_));
  std::memcpy(raw(), src.raw(), nbytes());
}

void Tensor::release_pages() const {
  if (!storage_) return;
  const size_t begin = offset_ * dtype_size(dtype_);
  storage_->release(begin, begin + nbytes());
}

}  // namespace loom
