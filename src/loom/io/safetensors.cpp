#include "loom/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "loom/kernels/cpu/bf16.h"
#include "loom/util/error.h"
#include "loom/util/mapped_file.h"

namespace loom::io {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is viewed in place");

namespace {

// Real headers are a few MB at most (one entry per tensor); a bigger length is corruption
// and would otherwise make us parse gigabytes of garbage.
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

struct DTypeInfo {
  StDType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {StDType::F64, "F64", 8},   {StDType::F32, "F32", 4}, {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::I64, "I64", 8}, {StDType::I32, "I32", 4},
    {StDType::I16, "I16", 2},   {StDType::I8, "I8", 1},   {StDType::U8, "U8", 1},
    {StDType::BOOL, "BOOL", 1},
};

const DTypeInfo& info(StDType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i;
  throw Error("safetensors: invalid StDType value " + std::to_string(static_cast<int>(d)));
}

bool parse_dtype(const std::string& s, StDType* out) {
  for (const auto& i : kDTypes)
    if (s == i.name) {
      *out = i.dtype;
      return true;
    }
  return false;
}

std::string shape_str(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string errno_str() { return std::strerror(errno); }

// Bytes needed by a tensor of `shape` and `elem` bytes per element; false if a dim is
// negative or the count does not fit in int64. The product of the non-zero dims is what is
// checked, so every prefix product numel() computes also fits, whatever order zeros come in.
bool checked_nbytes(std::span<const int64_t> shape, size_t elem, uint64_t* nbytes,
                    std::string* why) {
  int64_t nonzero = 1;
  bool has_zero = false;
  for (int64_t d : shape) {
    if (d < 0) {
      *why = "negative dimension in shape " + shape_str(shape);
      return false;
    }
    if (d == 0) {
      has_zero = true;
      continue;
    }
    if (__builtin_mul_overflow(nonzero, d, &nonzero)) {
      *why = "element count of shape " + shape_str(shape) + " overflows";
      return false;
    }
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(nonzero, static_cast<int64_t>(elem), &bytes)) {
    *why = "byte size of shape " + shape_str(shape) + " overflows";
    return false;
  }
  *nbytes = has_zero ? 0 : static_cast<uint64_t>(bytes);
  return true;
}

// Non-negative JSON integer that fits in int64 (nlohmann stores those as unsigned).
bool as_index(const json& j, int64_t* out) {
  if (!j.is_number_unsigned()) return false;
  const uint64_t v = j.get<uint64_t>();
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), path.string() + ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  LOOM_CHECK(!in.bad(), path.string() + ": read error");
  return ss.str();
}

}  // namespace

size_t st_dtype_size(StDType dtype) { return info(dtype).size; }
const char* st_dtype_name(StDType dtype) { return info(dtype).name; }

int64_t StTensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_size_(std::exchange(o.map_size_, 0)),
      tensors_(std::move(o.tensors_)),
      index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() noexcept {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

const StTensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

SafetensorsFile SafetensorsFile::open(const fs::path& path) {
  const std::string f = path.string();
  SafetensorsFile st;  // owns the mapping from here on, so every throw below unmaps
  st.path_ = path;

  const Mapping mp = map_file_readonly(path, "safetensors", 8);
  st.map_ = mp.data;
  st.map_size_ = mp.size;
  const uint64_t file_size = mp.size;
  void* m = mp.data;
  const auto* base = static_cast<const std::byte*>(m);

  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian host (static_assert above)
  LOOM_CHECK(header_len <= kMaxHeaderBytes,
             f + ": header length " + std::to_string(header_len) + " is absurdly large (limit " +
                 std::to_string(kMaxHeaderBytes) + " bytes); not a safetensors file?");
  LOOM_CHECK(header_len <= file_size - 8, f + ": header length " + std::to_string(header_len) +
                                              " exceeds the " + std::to_string(file_size - 8) +
                                              " bytes after the length field (truncated?)");

  // nlohmann keeps the last of duplicate keys silently; a duplicated tensor name is a
  // corrupt file, so watch top-level keys (depth 1) as they are parsed.
  const char* hbegin = reinterpret_cast<const char*>(base + 8);
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 1 && ev == json::parse_event_t::key && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  // nlohmann's lexer takes a NUL byte as end of input, so "{}\0garbage" would parse; JSON
  // cannot contain a raw NUL, and the spec pads with spaces, so treat one as corruption.
  LOOM_CHECK(std::memchr(hbegin, 0, header_len) == nullptr,
             f + ": header is not valid JSON: it contains a NUL byte");
  json header;
  try {
    header = json::parse(hbegin, hbegin + header_len, cb);
  } catch (const json::exception& e) {
    throw Error(f + ": header is not valid JSON: " + e.what());
  }
  LOOM_CHECK(header.is_object(), f + ": header JSON is not an object");
  LOOM_CHECK(duplicate.empty(), f + ": header names '" + duplicate + "' twice");

  const uint64_t data_size = file_size - 8 - header_len;
  const std::byte* data = base + 8 + header_len;

  for (auto& [key, val] : header.items()) {
    if (key == "__metadata__") {
      LOOM_CHECK(val.is_object(), f + ": __metadata__ is not a JSON object");
      for (auto& [mk, mv] : val.items()) {
        LOOM_CHECK(mv.is_string(), f + ": __metadata__ value of '" + mk + "' is not a string");
        st.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string where = f + ": tensor '" + key + "': ";
    LOOM_CHECK(val.is_object(), where + "entry is not a JSON object");
    auto dt = val.find("dtype");
    auto sh = val.find("shape");
    auto off = val.find("data_offsets");
    LOOM_CHECK(dt != val.end(), where + "missing \"dtype\"");
    LOOM_CHECK(sh != val.end(), where + "missing \"shape\"");
    LOOM_CHECK(off != val.end(), where + "missing \"data_offsets\"");
    LOOM_CHECK(dt->is_string(), where + "\"dtype\" is not a string");
    StTensorView v;
    v.name = key;
    LOOM_CHECK(parse_dtype(dt->get<std::string>(), &v.dtype),
               where + "unknown dtype \"" + dt->get<std::string>() + "\"");
    LOOM_CHECK(sh->is_array(), where + "\"shape\" is not an array");
    for (const json& d : *sh) {
      LOOM_CHECK(d.is_number_integer(), where + "shape entry " + d.dump() + " is not an integer");
      // nlohmann stores non-negative integers as unsigned, so signed means negative.
      LOOM_CHECK(d.is_number_unsigned(), where + "negative dimension " + d.dump() + " in shape");
      int64_t dim = 0;
      LOOM_CHECK(as_index(d, &dim), where + "dimension " + d.dump() + " is too large");
      v.shape.push_back(dim);
    }
    uint64_t nbytes = 0;
    std::string why;
    LOOM_CHECK(checked_nbytes(v.shape, st_dtype_size(v.dtype), &nbytes, &why), where + why);

    LOOM_CHECK(off->is_array() && off->size() == 2,
               where + "\"data_offsets\" is not a [begin, end] pair: " + off->dump());
    int64_t b = 0, e = 0;
    LOOM_CHECK(as_index((*off)[0], &b) && as_index((*off)[1], &e),
               where + "\"data_offsets\" are not non-negative integers: " + off->dump());
    LOOM_CHECK(b <= e, where + "data_offsets " + off->dump() + " have begin > end");
    LOOM_CHECK(static_cast<uint64_t>(e) <= data_size,
               where + "data_offsets " + off->dump() + " run past the " +
                   std::to_string(data_size) + "-byte data section (truncated file?)");
    const uint64_t len = static_cast<uint64_t>(e - b);
    LOOM_CHECK(len == nbytes, where + "data_offsets " + off->dump() + " span " +
                                  std::to_string(len) + " bytes but " + st_dtype_name(v.dtype) +
                                  " " + shape_str(v.shape) + " needs " + std::to_string(nbytes));
    v.data = std::span<const std::byte>(data + b, len);
    st.tensors_.push_back(std::move(v));
  }

  // File order. Ties (zero-byte tensors) by name so the order does not depend on JSON order.
  const auto begin_of = [data](const StTensorView& v) { return v.data.data() - data; };
  std::sort(st.tensors_.begin(), st.tensors_.end(), [&](const auto& a, const auto& b) {
    const auto ka = std::make_tuple(begin_of(a), a.data.size(), std::string_view(a.name));
    const auto kb = std::make_tuple(begin_of(b), b.data.size(), std::string_view(b.name));
    return ka < kb;
  });
  // The spec wants the data section covered exactly once: tensors back to back, no holes.
  uint64_t covered = 0;
  const StTensorView* prev = nullptr;
  for (const auto& v : st.tensors_) {
    const uint64_t b = static_cast<uint64_t>(begin_of(v));
    LOOM_CHECK(b >= covered, f + ": tensors '" + (prev ? prev->name : "") + "' and '" + v.name +
                                 "' overlap in the data section");
    LOOM_CHECK(b == covered, f + ": hole in the data section: bytes [" + std::to_string(covered) +
                                 ", " + std::to_string(b) + ") before tensor '" + v.name +
                                 "' belong to no tensor");
    covered = b + v.data.size();
    prev = &v;
  }
  LOOM_CHECK(covered == data_size, f + ": data section is " + std::to_string(data_size) +
                                       " bytes but tensors cover " + std::to_string(covered) +
                                       " (trailing bytes belong to no tensor)");

  for (size_t i = 0; i < st.tensors_.size(); ++i) st.index_.emplace(st.tensors_[i].name, i);
  return st;
}

// ---------------------------------------------------------------------------------------
// SafetensorsCheckpoint

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
}

// A shard name from an index must stay inside the folder. Symlinked shards are fine (the HF
// hub cache links snapshot files to blobs), so only the name itself is checked.
bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const fs::path& file_or_dir) {
  SafetensorsCheckpoint ck;
  ck.path_ = file_or_dir;
  std::error_code ec;
  const fs::file_status status = fs::status(file_or_dir, ec);
  LOOM_CHECK(fs::exists(status),
             file_or_dir.string() + ": cannot open checkpoint: " +
                 (ec ? ec.message() : std::string("no such file or directory")));

  fs::path index_path;
  if (fs::is_directory(status)) {
    if (fs::exists(file_or_dir / "model.safetensors", ec)) {
      ck.files_.push_back(SafetensorsFile::open(file_or_dir / "model.safetensors"));
    } else if (fs::exists(file_or_dir / "model.safetensors.index.json", ec)) {
      index_path = file_or_dir / "model.safetensors.index.json";
    } else {
      throw Error(file_or_dir.string() +
                  ": folder holds neither model.safetensors nor model.safetensors.index.json");
    }
  } else if (ends_with(file_or_dir.filename().string(), ".index.json")) {
    index_path = file_or_dir;
  } else {
    ck.files_.push_back(SafetensorsFile::open(file_or_dir));
  }

  if (index_path.empty()) {
    for (const auto& v : ck.files_[0].tensors()) ck.entries_.emplace(v.name, Entry{0, &v});
    return ck;
  }

  const std::string fi = index_path.string();
  const std::string text = read_text_file(index_path);
  LOOM_CHECK(text.find('\0') == std::string::npos, fi + ": not valid JSON: contains a NUL byte");
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fi + ": not valid JSON: " + e.what());
  }
  LOOM_CHECK(index.is_object(), fi + ": index is not a JSON object");
  auto wm = index.find("weight_map");
  LOOM_CHECK(wm != index.end() && wm->is_object(), fi + ": missing \"weight_map\" object");
  const fs::path dir = index_path.parent_path();

  std::map<std::string, size_t> shard_index;  // shard file name -> files_ position
  for (auto& [tensor, shard_json] : wm->items()) {
    LOOM_CHECK(shard_json.is_string(),
               fi + ": weight_map entry of '" + tensor + "' is not a file name string");
    const std::string shard = shard_json.get<std::string>();
    LOOM_CHECK(plain_file_name(shard), fi + ": shard name '" + shard + "' for tensor '" + tensor +
                                           "' is not a plain file name inside the folder");
    auto it = shard_index.find(shard);
    if (it == shard_index.end()) {
      const fs::path shard_path = dir / shard;
      LOOM_CHECK(fs::exists(shard_path, ec), fi + ": shard file " + shard_path.string() +
                                                 " (listed for tensor '" + tensor +
                                                 "') does not exist");
      ck.files_.push_back(SafetensorsFile::open(shard_path));
      it = shard_index.emplace(shard, ck.files_.size() - 1).first;
    }
    const SafetensorsFile& sf = ck.files_[it->second];
    const StTensorView* v = sf.find(tensor);
    LOOM_CHECK(v, fi + ": tensor '" + tensor + "' is listed in shard " + sf.path().string() +
                      " but that file does not contain it");
    ck.entries_.emplace(tensor, Entry{it->second, v});
  }
  // Pointers into files_[i].tensors() survive the vector growing above: moving a
  // SafetensorsFile moves its tensors_ vector, which keeps its heap buffer.
  return ck;
}

const StTensorView* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.view;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

const fs::path& SafetensorsCheckpoint::file_of(std::string_view name) const {
  auto it = entries_.find(name);
  LOOM_CHECK(it != entries_.end(),
             path_.string() + ": tensor '" + std::string(name) + "' is not in the checkpoint");
  return files_[it->second.file].path();
}

void SafetensorsCheckpoint::read_f32(std::string_view name, std::span<const int64_t> expected,
                                     float* out) const {
  auto it = entries_.find(name);
  LOOM_CHECK(it != entries_.end(), path_.string() + ": tensor '" + std::string(name) +
                                       "' is missing from the checkpoint");
  const StTensorView& v = *it->second.view;
  const std::string where = files_[it->second.file].path().string() + ": tensor '" + v.name + "'";
  LOOM_CHECK(std::equal(v.shape.begin(), v.shape.end(), expected.begin(), expected.end()),
             where + " has shape " + shape_str(v.shape) + " vs expected " + shape_str(expected));
  const int64_t n = v.numel();
  LOOM_CHECK(n == 0 || out, where + ": read_f32 given a null output buffer");
  // The mapping is only byte-aligned in general (header length is not required to be a
  // multiple of 8), so elements are loaded with memcpy rather than through typed pointers.
  const std::byte* src = v.data.data();
  switch (v.dtype) {
    case StDType::F32:
      if (n) std::memcpy(out, src, static_cast<size_t>(n) * 4);
      break;
    case StDType::F64:
      for (int64_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, src + i * 8, 8);
        out[i] = static_cast<float>(d);
      }
      break;
    case StDType::F16:
    case StDType::BF16: {
      const bool half = v.dtype == StDType::F16;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + i * 2, 2);
        out[i] = half ? kernels::from_f16(h) : kernels::from_bf16(h);
      }
      break;
    }
    default:
      throw Error(where + " has dtype " + st_dtype_name(v.dtype) +
                  ", expected a floating dtype (F32, F16, BF16 or F64)");
  }
}

// ---------------------------------------------------------------------------------------
// write_safetensors

namespace {

void write_all(int fd, const void* buf, size_t n, const std::string& file) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(file + ": write failed: " + errno_str());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Owns the temporary file until it is renamed into place; otherwise closes and removes it.
struct TempFile {
  fs::path path;
  int fd = -1;
  bool committed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!committed && !path.empty()) ::unlink(path.c_str());
  }
};

}  // namespace

void write_safetensors(const fs::path& path, std::span<const StWriteTensor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string f = path.string();
  LOOM_CHECK(!path.filename().empty(), "write_safetensors: '" + f + "' is not a file path");

  // Validate and lay out everything before touching the filesystem.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::string where = f + ": tensor '" + t.name + "': ";
    LOOM_CHECK(!t.name.empty(), f + ": tensor with an empty name");
    LOOM_CHECK(t.name != "__metadata__", where + "name is reserved for metadata");
    LOOM_CHECK(names.insert(t.name).second, where + "name given twice");
    uint64_t nbytes = 0;
    std::string why;
    LOOM_CHECK(checked_nbytes(t.shape, st_dtype_size(t.dtype), &nbytes, &why), where + why);
    LOOM_CHECK(nbytes == t.nbytes, where + "nbytes is " + std::to_string(t.nbytes) + " but " +
                                       st_dtype_name(t.dtype) + " " + shape_str(t.shape) +
                                       " needs " + std::to_string(nbytes));
    LOOM_CHECK(t.nbytes == 0 || t.data, where + "data is null");
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not valid UTF-8
    throw Error(f + ": cannot encode header: " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  // Same folder as the target so rename() is atomic; pid + counter keep concurrent writers
  // apart, O_EXCL makes sure we never clobber someone else's file.
  static std::atomic<uint64_t> counter{0};
  TempFile tmp;
  for (int attempt = 0; tmp.fd < 0; ++attempt) {
    fs::path candidate = path;
    candidate += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    tmp.fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (tmp.fd >= 0) {
      tmp.path = candidate;
    } else if (errno != EEXIST || attempt > 100) {
      throw Error(f + ": cannot create temporary file " + candidate.string() + ": " + errno_str());
    }
  }
  write_all(tmp.fd, &header_len, 8, f);
  write_all(tmp.fd, text.data(), text.size(), f);
  for (const auto& t : tensors)
    if (t.nbytes) write_all(tmp.fd, t.data, t.nbytes, f);
  LOOM_CHECK(::fsync(tmp.fd) == 0, f + ": fsync failed: " + errno_str());
  const int fd = std::exchange(tmp.fd, -1);
  LOOM_CHECK(::close(fd) == 0, f + ": close failed: " + errno_str());
  LOOM_CHECK(::rename(tmp.path.c_str(), path.c_str()) == 0,
             f + ": cannot rename temporary file into place: " + errno_str());
  tmp.committed = true;

  // Make the rename itself durable. Best effort: the file is complete either way.
  fs::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace loom::io
