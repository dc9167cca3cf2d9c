#include "loom/io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "loom/util/error.h"
#include "loom/util/mapped_file.h"

namespace loom::io {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "GGUF data is little-endian and is viewed in place");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 4;        // arrays of arrays of ... this deep at most
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr uint64_t kMaxAlignment = 1ull << 30;
// Smallest encodings, used to bound counts by the bytes left before allocating anything.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                  // empty key, u8 value

std::string dims_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------------
// Bounds-checked cursor over the mapping. Every read checks the bytes left first.

class Cursor {
 public:
  Cursor(const std::byte* base, uint64_t size, const std::string& file)
      : base_(base), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what) const {
    if (n > left())
      throw Error(file_ + ": " + what + ": needs " + std::to_string(n) + " bytes at offset " +
                  std::to_string(pos_) + " but the file has " + std::to_string(left()) +
                  " left (truncated?)");
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " (string length)");
    if (n > left())
      throw Error(file_ + ": " + what + ": string length " + std::to_string(n) + " exceeds the " +
                  std::to_string(left()) + " bytes left in the file (truncated?)");
    std::string s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const std::byte* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

bool value_type_known(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
    case GgufType::STRING:
      return 8;
    case GgufType::ARRAY:
      return 12;
  }
  return 1;
}

bool is_unsigned(GgufType t) {
  return t == GgufType::U8 || t == GgufType::U16 || t == GgufType::U32 || t == GgufType::U64;
}
bool is_signed(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}
bool is_float(GgufType t) { return t == GgufType::F32 || t == GgufType::F64; }

// One scalar of integer/float/bool type, widened. `where` names the key for errors.
template <class Sink>
void read_scalar(Cursor& c, GgufType t, const std::string& file, const std::string& where,
                 Sink&& sink) {
  switch (t) {
    case GgufType::U8:
      return sink(static_cast<uint64_t>(c.read<uint8_t>(where)));
    case GgufType::U16:
      return sink(static_cast<uint64_t>(c.read<uint16_t>(where)));
    case GgufType::U32:
      return sink(static_cast<uint64_t>(c.read<uint32_t>(where)));
    case GgufType::U64:
      return sink(c.read<uint64_t>(where));
    case GgufType::I8:
      return sink(static_cast<int64_t>(c.read<int8_t>(where)));
    case GgufType::I16:
      return sink(static_cast<int64_t>(c.read<int16_t>(where)));
    case GgufType::I32:
      return sink(static_cast<int64_t>(c.read<int32_t>(where)));
    case GgufType::I64:
      return sink(c.read<int64_t>(where));
    case GgufType::F32:
      return sink(static_cast<double>(c.read<float>(where)));
    case GgufType::F64:
      return sink(c.read<double>(where));
    case GgufType::BOOL: {
      const uint8_t b = c.read<uint8_t>(where);
      if (b > 1)
        throw Error(file + ": " + where + ": bool value is " + std::to_string(b) +
                    " (must be 0 or 1)");
      return sink(b == 1);
    }
    default:
      throw Error(file + ": " + where + ": internal: not a scalar type");
  }
}

GgufValue read_value(Cursor& c, GgufType t, int depth, const std::string& file,
                     const std::string& where) {
  GgufValue v;
  v.type = t;
  if (t == GgufType::STRING) {
    v.data = c.read_string(where);
    return v;
  }
  if (t != GgufType::ARRAY) {
    read_scalar(c, t, file, where, [&](auto x) { v.data = x; });
    return v;
  }
  if (depth >= kMaxArrayDepth)
    throw Error(file + ": " + where + ": arrays nested more than " +
                std::to_string(kMaxArrayDepth) + " deep");
  const uint32_t et = c.read<uint32_t>(where + " (array element type)");
  if (!value_type_known(et))
    throw Error(file + ": " + where + ": unknown array element type " + std::to_string(et));
  const GgufType elem = static_cast<GgufType>(et);
  v.elem_type = elem;
  const uint64_t n = c.read<uint64_t>(where + " (array length)");
  if (n > c.left() / min_value_bytes(elem))
    throw Error(file + ": " + where + ": array of " + std::to_string(n) + " " +
                gguf_type_name(elem) + " values cannot fit in the " + std::to_string(c.left()) +
                " bytes left in the file (truncated?)");
  if (elem == GgufType::STRING) {
    std::vector<std::string> out;
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i)
      out.push_back(c.read_string(where + "[" + std::to_string(i) + "]"));
    v.data = std::move(out);
  } else if (elem == GgufType::ARRAY) {
    std::vector<GgufValue> out;
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i)
      out.push_back(read_value(c, elem, depth + 1, file, where + "[" + std::to_string(i) + "]"));
    v.data = std::move(out);
  } else if (is_unsigned(elem)) {
    std::vector<uint64_t> out;
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i)
      read_scalar(c, elem, file, where, [&](auto x) { out.push_back(static_cast<uint64_t>(x)); });
    v.data = std::move(out);
  } else if (is_signed(elem)) {
    std::vector<int64_t> out;
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i)
      read_scalar(c, elem, file, where, [&](auto x) { out.push_back(static_cast<int64_t>(x)); });
    v.data = std::move(out);
  } else if (is_float(elem)) {
    std::vector<double> out;
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i)
      read_scalar(c, elem, file, where, [&](auto x) { out.push_back(static_cast<double>(x)); });
    v.data = std::move(out);
  } else {  // BOOL
    std::vector<bool> out;
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i)
      read_scalar(c, elem, file, where, [&](auto x) { out.push_back(static_cast<bool>(x)); });
    v.data = std::move(out);
  }
  return v;
}

// ---------------------------------------------------------------------------------------
// Names

bool parse_block_name(const std::string& s, int64_t* layer, std::string* part,
                      std::string* suffix) {
  if (s.rfind("blk.", 0) != 0) return false;
  size_t i = 4;
  const size_t digits_begin = i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == digits_begin || i - digits_begin > 9 || i >= s.size() || s[i] != '.') return false;
  *layer = std::stoll(s.substr(digits_begin, i - digits_begin));
  const std::string rest = s.substr(i + 1);
  const size_t dot = rest.rfind('.');
  if (dot == std::string::npos) return false;
  *part = rest.substr(0, dot);
  *suffix = rest.substr(dot + 1);
  return true;
}

// f32 as the shortest decimal that reads back as the same float, widened to double.
double f32_json(float f) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f);
  *res.ptr = '\0';
  return std::strtod(buf, nullptr);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// GgufValue

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8:
      return "u8";
    case GgufType::I8:
      return "i8";
    case GgufType::U16:
      return "u16";
    case GgufType::I16:
      return "i16";
    case GgufType::U32:
      return "u32";
    case GgufType::I32:
      return "i32";
    case GgufType::F32:
      return "f32";
    case GgufType::BOOL:
      return "bool";
    case GgufType::STRING:
      return "string";
    case GgufType::ARRAY:
      return "array";
    case GgufType::U64:
      return "u64";
    case GgufType::I64:
      return "i64";
    case GgufType::F64:
      return "f64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const { return is_unsigned(type) || is_signed(type); }

size_t GgufValue::size() const {
  if (!is_array()) return 1;
  return std::visit(
      [](const auto& x) -> size_t {
        using T = std::decay_t<decltype(x)>;
        if constexpr (requires { x.size(); } && !std::is_same_v<T, std::string>)
          return x.size();
        else
          return 1;
      },
      data);
}

std::string GgufValue::type_str() const {
  if (!is_array()) return gguf_type_name(type);
  if (elem_type == GgufType::ARRAY) {
    const auto* inner = std::get_if<std::vector<GgufValue>>(&data);
    if (inner && !inner->empty()) return "array[" + inner->front().type_str() + "]";
    return "array[array]";
  }
  return std::string("array[") + gguf_type_name(elem_type) + "]";
}

std::optional<int64_t> GgufValue::to_i64() const {
  if (const auto* u = std::get_if<uint64_t>(&data); u && is_unsigned(type)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&data); i && is_signed(type)) return *i;
  return std::nullopt;
}

std::optional<uint64_t> GgufValue::to_u64() const {
  if (const auto* u = std::get_if<uint64_t>(&data); u && is_unsigned(type)) return *u;
  if (const auto* i = std::get_if<int64_t>(&data); i && is_signed(type) && *i >= 0)
    return static_cast<uint64_t>(*i);
  return std::nullopt;
}

std::optional<double> GgufValue::to_f64() const {
  if (const auto* d = std::get_if<double>(&data); d && is_float(type)) return *d;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------
// Tensor infos

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}
int64_t GgufTensorInfo::n_rows() const { return ne.empty() ? 0 : numel() / ne[0]; }
uint64_t GgufTensorInfo::row_bytes() const {
  return static_cast<uint64_t>(ne[0] / ggml_block_size(type) * ggml_type_size(type));
}
std::vector<int64_t> GgufTensorInfo::hf_shape() const { return {ne.rbegin(), ne.rend()}; }

// ---------------------------------------------------------------------------------------
// GgufFile

GgufFile::GgufFile(GgufFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_size_(std::exchange(o.map_size_, 0)),
      version_(o.version_),
      alignment_(o.alignment_),
      data_offset_(o.data_offset_),
      metadata_(std::move(o.metadata_)),
      tensors_(std::move(o.tensors_)),
      index_(std::move(o.index_)) {}

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    metadata_ = std::move(o.metadata_);
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
  }
  return *this;
}

GgufFile::~GgufFile() { unmap(); }

void GgufFile::unmap() noexcept {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

GgufFile GgufFile::open(const fs::path& path) {
  const std::string f = path.string();
  GgufFile g;  // owns the mapping from here on, so every throw below unmaps
  g.path_ = path;

  const Mapping mp = map_file_readonly(path, "GGUF", 24);
  g.map_ = mp.data;
  g.map_size_ = mp.size;
  const uint64_t file_size = mp.size;
  void* m = mp.data;
  const auto* base = static_cast<const std::byte*>(m);
  Cursor c(base, file_size, f);

  // Header.
  const uint32_t magic = c.read<uint32_t>("magic");
  LOOM_CHECK(magic == kMagic, f + ": not a GGUF file (magic bytes are not \"GGUF\")");
  g.version_ = c.read<uint32_t>("version");
  if (g.version_ != 2 && g.version_ != 3) {
    std::string hint;
    if (g.version_ == 1) hint = " (version 1, with 32-bit counts, is obsolete)";
    if (__builtin_bswap32(g.version_) == 2 || __builtin_bswap32(g.version_) == 3)
      hint = " (a big-endian file?)";
    throw Error(f + ": GGUF version " + std::to_string(g.version_) +
                " is not supported (only 2 and 3)" + hint);
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  LOOM_CHECK(n_tensors <= c.left() / kMinTensorInfoBytes,
             f + ": tensor count " + std::to_string(n_tensors) + " cannot fit in a file of " +
                 std::to_string(file_size) + " bytes (corrupt header?)");
  LOOM_CHECK(n_kv <= c.left() / kMinKvBytes,
             f + ": metadata count " + std::to_string(n_kv) + " cannot fit in a file of " +
                 std::to_string(file_size) + " bytes (corrupt header?)");

  // Metadata.
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata entry #" + std::to_string(i) + " key");
    const std::string where = "metadata key '" + key + "'";
    const uint32_t t = c.read<uint32_t>(where + " (value type)");
    LOOM_CHECK(value_type_known(t), f + ": " + where + ": unknown value type " + std::to_string(t));
    GgufValue v = read_value(c, static_cast<GgufType>(t), 0, f, where);
    LOOM_CHECK(!g.metadata_.count(key), f + ": " + where + " appears twice");
    g.metadata_.emplace(std::move(key), std::move(v));
  }
  if (const GgufValue* a = g.find("general.alignment")) {
    const std::optional<uint64_t> al = a->to_u64();
    LOOM_CHECK(al, f + ": metadata key 'general.alignment' is " + a->type_str() +
                       ", expected a non-negative integer");
    LOOM_CHECK(*al > 0 && *al <= kMaxAlignment && std::has_single_bit(*al),
               f + ": general.alignment " + std::to_string(*al) +
                   " is not a power of two between 1 and 2^30");
    g.alignment_ = *al;
  }

  // Tensor infos.
  g.tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.file = f;
    t.name = c.read_string("tensor #" + std::to_string(i) + " name");
    const std::string where = f + ": tensor '" + t.name + "': ";
    const uint32_t n_dims = c.read<uint32_t>("tensor '" + t.name + "' n_dims");
    LOOM_CHECK(n_dims >= 1 && n_dims <= kMaxDims,
               where + "n_dims is " + std::to_string(n_dims) + " (must be 1..4)");
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>("tensor '" + t.name + "' dims");
      LOOM_CHECK(ne >= 1 && ne <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 where + "dimension " + std::to_string(d) + " is " + std::to_string(ne) +
                     " (must be positive)");
      t.ne.push_back(static_cast<int64_t>(ne));
      LOOM_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(ne), &numel),
                 where + "element count of dims " + dims_str(t.ne) + " overflows");
    }
    const uint32_t type = c.read<uint32_t>("tensor '" + t.name + "' type");
    LOOM_CHECK(ggml_type_known(type), where + "unknown ggml type " + std::to_string(type));
    t.type = static_cast<GgmlType>(type);
    const int64_t block = ggml_block_size(t.type);
    LOOM_CHECK(t.ne[0] % block == 0, where + "row length ne[0] = " + std::to_string(t.ne[0]) +
                                         " is not a multiple of the " + ggml_type_name(t.type) +
                                         " block size " + std::to_string(block));
    int64_t nbytes = 0;
    LOOM_CHECK(!__builtin_mul_overflow(numel / block, ggml_type_size(t.type), &nbytes),
               where + "byte size of dims " + dims_str(t.ne) + " overflows");
    t.nbytes = static_cast<uint64_t>(nbytes);
    t.offset = c.read<uint64_t>("tensor '" + t.name + "' offset");
    LOOM_CHECK(!g.index_.count(t.name), where + "name appears twice");
    g.index_.emplace(t.name, g.tensors_.size());
    g.tensors_.push_back(std::move(t));
  }

  // Data section: starts at the next multiple of the alignment.
  const uint64_t al = g.alignment_;
  g.data_offset_ = (c.pos() + al - 1) / al * al;  // pos < 2^63 and al <= 2^30: no overflow
  const uint64_t data_size = g.data_offset_ <= file_size ? file_size - g.data_offset_ : 0;
  for (auto& t : g.tensors_) {
    const std::string where = f + ": tensor '" + t.name + "': ";
    LOOM_CHECK(t.offset % al == 0, where + "data offset " + std::to_string(t.offset) +
                                       " is not a multiple of the alignment " + std::to_string(al));
    LOOM_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset,
               where + "data [" + std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
                   ") extends past the end of the file's " + std::to_string(data_size) +
                   "-byte data section (truncated?)");
    t.data = base + g.data_offset_ + t.offset;
  }
  std::vector<size_t> order(g.tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return g.tensors_[a].offset < g.tensors_[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = g.tensors_[order[k - 1]];
    const GgufTensorInfo& cur = g.tensors_[order[k]];
    LOOM_CHECK(cur.offset >= prev.offset + prev.nbytes,
               f + ": tensors '" + prev.name + "' and '" + cur.name + "' overlap");
  }
  return g;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufValue& GgufFile::at(std::string_view key) const {
  const GgufValue* v = find(key);
  LOOM_CHECK(v, path_.string() + ": metadata key '" + std::string(key) + "' is missing");
  return *v;
}

void GgufFile::type_error(std::string_view key, const GgufValue& v, const char* want) const {
  throw Error(path_.string() + ": metadata key '" + std::string(key) + "' is " + v.type_str() +
              ", expected " + want);
}

namespace {
template <class T>
T narrow_int(const GgufValue& v, const std::string& file, std::string_view key, const char* want) {
  if (!v.is_integer())
    throw Error(file + ": metadata key '" + std::string(key) + "' is " + v.type_str() +
                ", expected " + want);
  if constexpr (std::is_signed_v<T>) {
    const std::optional<int64_t> x = v.to_i64();
    if (x && *x >= std::numeric_limits<T>::min() && *x <= std::numeric_limits<T>::max())
      return static_cast<T>(*x);
  } else {
    const std::optional<uint64_t> x = v.to_u64();
    if (x && *x <= std::numeric_limits<T>::max()) return static_cast<T>(*x);
  }
  const std::string val = is_unsigned(v.type) ? std::to_string(std::get<uint64_t>(v.data))
                                              : std::to_string(std::get<int64_t>(v.data));
  throw Error(file + ": metadata key '" + std::string(key) + "' (" + v.type_str() + ") holds " +
              val + ", which does not fit in " + want);
}

template <class T>
std::vector<T> int_array(const GgufValue& v, const std::string& file, std::string_view key,
                         const char* want) {
  const std::string k(key);
  std::vector<T> out;
  auto put = [&](auto x) {
    if (!std::in_range<T>(x))
      throw Error(file + ": metadata key '" + k + "' element " + std::to_string(out.size()) +
                  " = " + std::to_string(x) + " does not fit in " + want);
    out.push_back(static_cast<T>(x));
  };
  if (const auto* u = std::get_if<std::vector<uint64_t>>(&v.data); u && v.is_array()) {
    out.reserve(u->size());
    for (uint64_t x : *u) put(x);
  } else if (const auto* s = std::get_if<std::vector<int64_t>>(&v.data); s && v.is_array()) {
    out.reserve(s->size());
    for (int64_t x : *s) put(x);
  } else {
    throw Error(file + ": metadata key '" + k + "' is " + v.type_str() + ", expected " + want);
  }
  return out;
}
}  // namespace

uint64_t GgufFile::get_u64(std::string_view key) const {
  return narrow_int<uint64_t>(at(key), path_.string(), key, "u64");
}
int64_t GgufFile::get_i64(std::string_view key) const {
  return narrow_int<int64_t>(at(key), path_.string(), key, "i64");
}
uint32_t GgufFile::get_u32(std::string_view key) const {
  return narrow_int<uint32_t>(at(key), path_.string(), key, "u32");
}
int32_t GgufFile::get_i32(std::string_view key) const {
  return narrow_int<int32_t>(at(key), path_.string(), key, "i32");
}
double GgufFile::get_f64(std::string_view key) const {
  const GgufValue& v = at(key);
  const std::optional<double> d = v.to_f64();
  if (!d) type_error(key, v, "f32 or f64");
  return *d;
}
float GgufFile::get_f32(std::string_view key) const { return static_cast<float>(get_f64(key)); }
bool GgufFile::get_bool(std::string_view key) const {
  const GgufValue& v = at(key);
  if (v.type != GgufType::BOOL) type_error(key, v, "bool");
  return std::get<bool>(v.data);
}
const std::string& GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = at(key);
  if (v.type != GgufType::STRING) type_error(key, v, "string");
  return std::get<std::string>(v.data);
}
const std::vector<std::string>& GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = at(key);
  if (!v.is_array() || v.elem_type != GgufType::STRING) type_error(key, v, "array[string]");
  return std::get<std::vector<std::string>>(v.data);
}
std::vector<float> GgufFile::get_f32_array(std::string_view key) const {
  const GgufValue& v = at(key);
  if (!v.is_array() || !is_float(v.elem_type)) type_error(key, v, "array[f32]");
  const auto& d = std::get<std::vector<double>>(v.data);
  return std::vector<float>(d.begin(), d.end());
}
std::vector<int32_t> GgufFile::get_i32_array(std::string_view key) const {
  return int_array<int32_t>(at(key), path_.string(), key, "array[i32]");
}
std::vector<int64_t> GgufFile::get_i64_array(std::string_view key) const {
  return int_array<int64_t>(at(key), path_.string(), key, "array[i64]");
}
uint64_t GgufFile::get_u64_or(std::string_view key, uint64_t dflt) const {
  return has(key) ? get_u64(key) : dflt;
}
float GgufFile::get_f32_or(std::string_view key, float dflt) const {
  return has(key) ? get_f32(key) : dflt;
}
std::string GgufFile::get_string_or(std::string_view key, const std::string& dflt) const {
  return has(key) ? get_string(key) : dflt;
}
bool GgufFile::get_bool_or(std::string_view key, bool dflt) const {
  return has(key) ? get_bool(key) : dflt;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  LOOM_CHECK(t, path_.string() + ": tensor '" + std::string(name) + "' is not in the file");
  return *t;
}

void dequantize_rows(const GgufTensorInfo& t, int64_t row_begin, int64_t row_end, float* dst) {
  const std::string where = t.file + ": tensor '" + t.name + "'";
  LOOM_CHECK(ggml_can_dequantize(t.type), where + " has ggml type " + ggml_type_name(t.type) +
                                              ", which cannot be dequantized (supported: F32, "
                                              "F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)");
  const int64_t rows = t.n_rows();
  LOOM_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= rows,
             where + ": rows [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
                 ") out of range for " + std::to_string(rows) + " rows");
  const uint64_t rb = t.row_bytes();
  dequantize(t.type, t.data + static_cast<uint64_t>(row_begin) * rb,
             (row_end - row_begin) * t.ne[0], dst);
}

// ---------------------------------------------------------------------------------------
// Hugging Face view

std::string gguf_to_hf_name(const std::string& g) {
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  int64_t layer = 0;
  std::string part, suffix;
  if (!parse_block_name(g, &layer, &part, &suffix)) return "";
  if (suffix != "weight" && suffix != "bias") return "";
  static const std::pair<const char*, const char*> kParts[] = {
      {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"},
      {"ffn_gate", "mlp.gate_proj"},
      {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
      {"attn_norm", "input_layernorm"},
      {"ffn_norm", "post_attention_layernorm"},
      // deepseek2: MLA, the router and its bias, the shared experts
      {"attn_q_a", "self_attn.q_a_proj"},
      {"attn_q_a_norm", "self_attn.q_a_layernorm"},
      {"attn_q_b", "self_attn.q_b_proj"},
      {"attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"},
      {"attn_kv_a_norm", "self_attn.kv_a_layernorm"},
      {"attn_kv_b", "self_attn.kv_b_proj"},
      {"ffn_gate_inp", "mlp.gate"},
      {"ffn_gate_shexp", "mlp.shared_experts.gate_proj"},
      {"ffn_up_shexp", "mlp.shared_experts.up_proj"},
      {"ffn_down_shexp", "mlp.shared_experts.down_proj"},
  };
  const std::string blk = "model.layers." + std::to_string(layer) + ".";
  if (part == "exp_probs_b" && suffix == "bias") return blk + "mlp.gate.e_score_correction_bias";
  for (const auto& [gg, hf] : kParts)
    if (part == gg) return blk + hf + "." + suffix;
  return "";
}

std::vector<std::string> gguf_stacked_hf_names(const GgufTensorInfo& t) {
  int64_t layer = 0;
  std::string part, suffix;
  if (!parse_block_name(t.name, &layer, &part, &suffix) || suffix != "weight") return {};
  std::string proj;
  if (part == "ffn_gate_exps") proj = "gate_proj";
  if (part == "ffn_up_exps") proj = "up_proj";
  if (part == "ffn_down_exps") proj = "down_proj";
  if (proj.empty()) return {};
  LOOM_CHECK(t.ne.size() == 3, t.file + ": tensor '" + t.name + "' has dims " + dims_str(t.ne) +
                                   ", expected [cols, rows, experts]");
  std::vector<std::string> out;
  for (int64_t e = 0; e < t.ne[2]; ++e)
    out.push_back("model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e) +
                  "." + proj + ".weight");
  return out;
}

std::string read_split_kv_b(const GgufFile& f, const GgufTensorInfo& k_b, std::vector<float>* kv) {
  int64_t layer = 0;
  std::string part, suffix;
  if (!parse_block_name(k_b.name, &layer, &part, &suffix) || part != "attn_k_b" ||
      suffix != "weight")
    return "";
  const std::string where = f.path().string() + ": tensor '" + k_b.name + "'";
  const std::string v_name = "blk." + std::to_string(layer) + ".attn_v_b.weight";
  const GgufTensorInfo* v_b = f.find_tensor(v_name);
  LOOM_CHECK(v_b, where + " has no " + v_name + " beside it (kv_b_proj is split in two)");
  LOOM_CHECK(k_b.ne.size() == 3 && v_b->ne.size() == 3 && k_b.ne[2] == v_b->ne[2] &&
                 k_b.ne[1] == v_b->ne[0],
             where + " " + dims_str(k_b.ne) + " and " + v_name + " " + dims_str(v_b->ne) +
                 " are not [Dn, R, H] and [R, Dv, H]");
  const int64_t Dn = k_b.ne[0], R = k_b.ne[1], H = k_b.ne[2], Dv = v_b->ne[1];
  std::vector<float> k(static_cast<size_t>(k_b.numel())), v(static_cast<size_t>(v_b->numel()));
  dequantize_rows(k_b, 0, k_b.n_rows(), k.data());           // [H][R][Dn]
  dequantize_rows(*v_b, 0, v_b->n_rows(), v.data());         // [H][Dv][R]
  kv->assign(static_cast<size_t>(H * (Dn + Dv) * R), 0.0f);  // [H*(Dn+Dv)][R]
  for (int64_t h = 0; h < H; ++h) {
    float* rows = kv->data() + h * (Dn + Dv) * R;
    for (int64_t i = 0; i < Dn; ++i)
      for (int64_t r = 0; r < R; ++r) rows[i * R + r] = k[(h * R + r) * Dn + i];
    std::copy_n(v.data() + h * Dv * R, Dv * R, rows + Dn * R);
  }
  return "model.layers." + std::to_string(layer) + ".self_attn.kv_b_proj.weight";
}

void unpermute_qk(float* w, int64_t rows, int64_t cols, int64_t n_head) {
  LOOM_CHECK(n_head > 0 && rows > 0 && cols > 0 && rows % (2 * n_head) == 0,
             "unpermute_qk: " + std::to_string(rows) + " rows is not a multiple of 2 * n_head (" +
                 std::to_string(n_head) + " heads)");
  const int64_t hd = rows / n_head, half = hd / 2;
  std::vector<float> head(static_cast<size_t>(hd * cols));
  for (int64_t h = 0; h < n_head; ++h) {
    float* base = w + h * hd * cols;
    std::memcpy(head.data(), base, head.size() * sizeof(float));
    // GGUF row 2*i + j  ->  HF row j*half + i
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(base + (j * half + i) * cols, head.data() + (2 * i + j) * cols,
                    static_cast<size_t>(cols) * sizeof(float));
  }
}

int64_t qk_permute_heads(const GgufFile& f, const std::string& gguf_name) {
  if (f.get_string_or("general.architecture", "") != "llama") return 0;
  int64_t layer = 0;
  std::string part, suffix;
  if (!parse_block_name(gguf_name, &layer, &part, &suffix)) return 0;
  if (suffix != "weight" && suffix != "bias") return 0;
  const int64_t n_head = static_cast<int64_t>(f.get_u32("llama.attention.head_count"));
  if (part == "attn_q") return n_head;
  if (part == "attn_k")
    return static_cast<int64_t>(f.get_u64_or("llama.attention.head_count_kv", n_head));
  return 0;
}

void read_hf_tensor(const GgufFile& f, const GgufTensorInfo& t, float* dst) {
  dequantize_rows(t, 0, t.n_rows(), dst);
  const int64_t heads = qk_permute_heads(f, t.name);
  if (heads == 0) return;
  const std::string where = f.path().string() + ": tensor '" + t.name + "'";
  LOOM_CHECK(t.ne.size() <= 2, where + ": q/k projection with " + std::to_string(t.ne.size()) +
                                   " dims " + dims_str(t.ne));
  const int64_t rows = t.ne.size() == 2 ? t.ne[1] : t.ne[0];
  const int64_t cols = t.ne.size() == 2 ? t.ne[0] : 1;
  LOOM_CHECK(rows % (2 * heads) == 0, where + ": " + std::to_string(rows) +
                                          " rows do not split into " + std::to_string(heads) +
                                          " heads of an even size");
  unpermute_qk(dst, rows, cols, heads);
}

QuantMatrix read_quant_rows(const GgufFile& f, const GgufTensorInfo& t, int64_t r0, int64_t r1) {
  const std::string where = f.path().string() + ": tensor '" + t.name + "'";
  LOOM_CHECK(ggml_can_dequantize(t.type),
             where + " has ggml type " + ggml_type_name(t.type) + ", which cannot be dequantized");
  LOOM_CHECK(r0 >= 0 && r0 <= r1 && r1 <= t.n_rows(),
             where + ": rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                 ") outside its " + std::to_string(t.n_rows()));
  QuantMatrix q = QuantMatrix::empty(t.type, r1 - r0, t.ne[0]);
  const uint64_t rb = q.row_bytes();
  LOOM_CHECK(rb == t.row_bytes() && rb * static_cast<uint64_t>(t.n_rows()) == t.nbytes,
             where + ": byte size does not match its dims");
  std::memcpy(q.bytes.data(), t.data + r0 * rb, (r1 - r0) * rb);
  return q;
}

QuantMatrix read_hf_quant(const GgufFile& f, const GgufTensorInfo& t) {
  const std::string where = f.path().string() + ": tensor '" + t.name + "'";
  LOOM_CHECK(t.ne.size() == 2,
             where + ": only 2-D weights stay quantized, this one has dims " + dims_str(t.ne));
  LOOM_CHECK(ggml_can_dequantize(t.type),
             where + " has ggml type " + ggml_type_name(t.type) + ", which cannot be dequantized");
  QuantMatrix q = QuantMatrix::empty(t.type, t.ne[1], t.ne[0]);
  const uint64_t rb = q.row_bytes();
  LOOM_CHECK(rb == t.row_bytes() && rb * static_cast<uint64_t>(q.rows) == t.nbytes,
             where + ": byte size does not match its dims");
  const int64_t heads = qk_permute_heads(f, t.name);
  if (heads == 0) {
    std::memcpy(q.bytes.data(), t.data, t.nbytes);
    return q;
  }
  LOOM_CHECK(q.rows % (2 * heads) == 0, where + ": " + std::to_string(q.rows) +
                                            " rows do not split into " + std::to_string(heads) +
                                            " heads of an even size");
  // As unpermute_qk: HF row h*hd + j*half + i comes from GGUF row h*hd + 2*i + j.
  const int64_t hd = q.rows / heads, half = hd / 2;
  for (int64_t r = 0; r < q.rows; ++r) {
    const int64_t h = r / hd, j = (r % hd) / half, i = r % half;
    std::memcpy(q.bytes.data() + r * rb, t.data + (h * hd + 2 * i + j) * rb, rb);
  }
  return q;
}

namespace {
json deepseek2_hf_config(const GgufFile& f) {
  const std::string p = "deepseek2.";
  auto req = [&](const std::string& k) { return static_cast<int64_t>(f.get_u64(p + k)); };
  auto opt = [&](const std::string& k, int64_t d) {
    return static_cast<int64_t>(f.get_u64_or(p + k, static_cast<uint64_t>(d)));
  };
  // Sigmoid gating (and the correction bias) is V3's; softmax V2's.
  bool v3 = opt("expert_gating_func", 1) == 2;
  for (const GgufTensorInfo& t : f.tensors()) v3 = v3 || t.name.ends_with(".exp_probs_b.bias");
  json j;
  j["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  j["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "float32";
  const int64_t heads = req("attention.head_count"), dr = req("rope.dimension_count");
  j["hidden_size"] = req("embedding_length");
  j["intermediate_size"] = req("feed_forward_length");
  j["num_hidden_layers"] = req("block_count");
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = heads;  // stored as 1: llama.cpp's MQA view of MLA
  j["max_position_embeddings"] = req("context_length");
  j["rms_norm_eps"] = f32_json(f.get_f32(p + "attention.layer_norm_rms_epsilon"));
  j["rope_theta"] = f.has(p + "rope.freq_base") ? f32_json(f.get_f32(p + "rope.freq_base")) : 1e4;
  const int64_t q_lora = opt("attention.q_lora_rank", 0);
  j["q_lora_rank"] = q_lora > 0 ? json(q_lora) : json(nullptr);
  j["kv_lora_rank"] = req("attention.kv_lora_rank");
  j["qk_rope_head_dim"] = dr;
  const bool mla = f.has(p + "attention.key_length_mla");  // since the absorption split
  const int64_t dq = mla ? req("attention.key_length_mla") : req("attention.key_length");
  LOOM_CHECK(dq > dr, f.path().string() + ": key length " + std::to_string(dq) +
                          " is not more than rope.dimension_count " + std::to_string(dr));
  j["qk_nope_head_dim"] = dq - dr;
  j["v_head_dim"] = mla ? req("attention.value_length_mla") : req("attention.value_length");
  j["moe_intermediate_size"] = req("expert_feed_forward_length");
  j["n_routed_experts"] = req("expert_count");
  j["num_experts_per_tok"] = req("expert_used_count");
  j["n_shared_experts"] = opt("expert_shared_count", 0);
  j["first_k_dense_replace"] = opt("leading_dense_block_count", 0);
  j["routed_scaling_factor"] =
      f.has(p + "expert_weights_scale") ? f32_json(f.get_f32(p + "expert_weights_scale")) : 1.0;
  j["norm_topk_prob"] = f.get_bool_or(p + "expert_weights_norm", false);
  const int64_t groups = opt("expert_group_count", 1), used = opt("expert_group_used_count", 1);
  j["n_group"] = groups;
  j["topk_group"] = used;
  j["topk_method"] = v3 ? "noaux_tc" : groups > 1 ? "group_limited_greedy" : "greedy";
  j["scoring_func"] = v3 ? "sigmoid" : "softmax";
  if (v3) j["rope_interleave"] = true;  // ggml's rope on deepseek2 rotates adjacent pairs
  if (f.get_string_or(p + "rope.scaling.type", "") == "yarn") {
    json rs;
    rs["rope_type"] = "yarn";
    rs["factor"] = f32_json(f.get_f32(p + "rope.scaling.factor"));
    rs["original_max_position_embeddings"] = req("rope.scaling.original_context_length");
    if (f.has(p + "rope.scaling.yarn_log_multiplier")) {
      const double m = f32_json(f.get_f32(p + "rope.scaling.yarn_log_multiplier")) / 0.1;
      rs["mscale"] = rs["mscale_all_dim"] = m;
    }
    j["rope_scaling"] = rs;
  }
  int64_t vocab = 0;
  if (const GgufTensorInfo* emb = f.find_tensor("token_embd.weight"); emb && emb->ne.size() == 2)
    vocab = emb->ne[1];
  else
    vocab = req("vocab_size");
  j["vocab_size"] = vocab;
  j["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  for (const auto& [gk, hk] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                               std::pair{"tokenizer.ggml.eos_token_id", "eos_token_id"}})
    if (f.has(gk)) j[hk] = static_cast<int64_t>(f.get_u64(gk));
  return j;
}
}  // namespace

json gguf_hf_config(const GgufFile& f) {
  const std::string file = f.path().string();
  const std::string arch = f.architecture();
  if (arch == "deepseek2") return deepseek2_hf_config(f);
  LOOM_CHECK(arch == "llama" || arch == "qwen2",
             file + ": architecture '" + arch + "' is not supported (llama, qwen2, deepseek2)");
  const std::string p = arch + ".";
  auto req_int = [&](const std::string& k) { return static_cast<int64_t>(f.get_u64(p + k)); };

  json j;
  j["model_type"] = arch;
  j["architectures"] = {arch == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "float32";
  const int64_t hidden = req_int("embedding_length");
  const int64_t heads = req_int("attention.head_count");
  j["hidden_size"] = hidden;
  j["intermediate_size"] = req_int("feed_forward_length");
  j["num_hidden_layers"] = req_int("block_count");
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = static_cast<int64_t>(
      f.get_u64_or(p + "attention.head_count_kv", static_cast<uint64_t>(heads)));
  LOOM_CHECK(heads > 0, file + ": " + p + "attention.head_count is 0");
  if (f.has(p + "attention.key_length")) {
    const int64_t hd = req_int("attention.key_length");
    if (hd * heads != hidden) j["head_dim"] = hd;
  }
  j["rms_norm_eps"] = f32_json(f.get_f32(p + "attention.layer_norm_rms_epsilon"));
  j["rope_theta"] =
      f.has(p + "rope.freq_base") ? f32_json(f.get_f32(p + "rope.freq_base")) : 10000.0;
  j["max_position_embeddings"] = req_int("context_length");

  int64_t vocab = 0;
  if (const GgufTensorInfo* emb = f.find_tensor("token_embd.weight"); emb && emb->ne.size() == 2)
    vocab = emb->ne[1];
  else if (f.has("tokenizer.ggml.tokens"))
    vocab = static_cast<int64_t>(f.get_string_array("tokenizer.ggml.tokens").size());
  else
    vocab = req_int("vocab_size");
  j["vocab_size"] = vocab;
  j["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  if (arch == "llama") j["attention_bias"] = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  j["mlp_bias"] = false;

  LOOM_CHECK(!f.find_tensor("rope_freqs.weight"),
             file +
                 ": has a rope_freqs.weight tensor (llama3-style RoPE scaling), whose HF "
                 "rope_scaling parameters cannot be recovered from a GGUF; not supported");
  std::string scaling = f.get_string_or(p + "rope.scaling.type", "");
  std::optional<double> factor;
  if (f.has(p + "rope.scaling.factor")) factor = f32_json(f.get_f32(p + "rope.scaling.factor"));
  if (scaling.empty() && f.has(p + "rope.scale_linear")) {  // older files
    scaling = "linear";
    factor = f32_json(f.get_f32(p + "rope.scale_linear"));
  }
  if (scaling.empty() && factor) scaling = "linear";
  if (!scaling.empty() && scaling != "none") {
    json rs;
    rs["rope_type"] = scaling;
    rs["type"] = scaling;
    rs["factor"] = factor.value_or(1.0);
    if (f.has(p + "rope.scaling.original_context_length"))
      rs["original_max_position_embeddings"] =
          static_cast<int64_t>(f.get_u64(p + "rope.scaling.original_context_length"));
    j["rope_scaling"] = rs;
  }
  static const std::pair<const char*, const char*> kTokenIds[] = {
      {"tokenizer.ggml.bos_token_id", "bos_token_id"},
      {"tokenizer.ggml.eos_token_id", "eos_token_id"},
      {"tokenizer.ggml.padding_token_id", "pad_token_id"},
  };
  for (const auto& [gk, hk] : kTokenIds)
    if (f.has(gk)) j[hk] = static_cast<int64_t>(f.get_u64(gk));
  return j;
}

}  // namespace loom::io
