#include "loom/io/tb_events.h"

#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>

#include "loom/io/tb_event.pb.h"
#include "loom/util/error.h"

namespace loom::io {

namespace fs = std::filesystem;

namespace {

// CRC-32C (Castagnoli): reflected polynomial 0x1EDC6F41, initial and final XOR all ones.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  Crc32c crc;
  crc.process_bytes(data, n);
  return crc.checksum();
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TbEventWriter::TbEventWriter(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOOM_CHECK(!ec, dir.string() + ": cannot create the TensorBoard folder: " + ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto secs = static_cast<long long>(now_seconds());
  path_ = dir / ("events.out.tfevents." + std::to_string(secs) + "." + host + "." +
                 std::to_string(::getpid()));
  f_ = std::fopen(path_.c_str(), "wb");
  LOOM_CHECK(f_, path_.string() + ": cannot write: " + std::strerror(errno));
  loom::tb::Event e;
  e.set_wall_time(now_seconds());
  e.set_file_version("brain.Event:2");
  write_record(e.SerializeAsString());
}

TbEventWriter::~TbEventWriter() {
  if (f_) std::fclose(f_);
}

void TbEventWriter::write_record(const std::string& payload) {
  std::string rec;
  rec.reserve(payload.size() + 16);
  const uint64_t n = payload.size();
  for (int i = 0; i < 8; ++i) rec.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  put_u32(rec, masked_crc32c(rec.data(), 8));
  rec += payload;
  put_u32(rec, masked_crc32c(payload.data(), payload.size()));
  const bool ok = std::fwrite(rec.data(), 1, rec.size(), f_) == rec.size() && std::fflush(f_) == 0;
  LOOM_CHECK(ok, path_.string() + ": write failed: " + std::strerror(errno));
}

void TbEventWriter::scalars(int64_t step,
                            const std::vector<std::pair<std::string, double>>& values) {
  loom::tb::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  loom::tb::Summary* s = e.mutable_summary();
  for (const auto& [tag, v] : values) {
    loom::tb::SummaryValue* sv = s->add_value();
    sv->set_tag(tag);
    sv->set_simple_value(static_cast<float>(v));
  }
  write_record(e.SerializeAsString());
}

void TbEventWriter::session_start(int64_t step) {
  loom::tb::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  e.mutable_session_log()->set_status(loom::tb::SessionLog::START);
  write_record(e.SerializeAsString());
}

std::vector<std::string> read_tfrecords(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  LOOM_CHECK(in, file.string() + ": cannot read");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    const std::string where = file.string() + ": record at byte " + std::to_string(at);
    LOOM_CHECK(bytes.size() - at >= 12, where + " is truncated (no room for its length)");
    const uint64_t n = get_le(p + at, 8);
    LOOM_CHECK(get_le(p + at + 8, 4) == masked_crc32c(p + at, 8),
               where + ": the length's CRC does not match");
    LOOM_CHECK(n <= bytes.size() - at - 12 && bytes.size() - at - 12 - n >= 4,
               where + " is truncated (length " + std::to_string(n) + ")");
    const unsigned char* data = p + at + 12;
    LOOM_CHECK(get_le(data + n, 4) == masked_crc32c(data, n),
               where + ": the payload's CRC does not match");
    out.emplace_back(reinterpret_cast<const char*>(data), n);
    at += 12 + n + 4;
  }
  return out;
}

std::vector<TbScalar> read_tb_scalars(const fs::path& file) {
  std::vector<TbScalar> out;
  const std::vector<std::string> recs = read_tfrecords(file);
  for (size_t i = 0; i < recs.size(); ++i) {
    loom::tb::Event e;
    LOOM_CHECK(e.ParseFromString(recs[i]),
               file.string() + ": record " + std::to_string(i) + " is not an Event");
    if (!e.has_summary()) continue;
    for (const auto& v : e.summary().value())
      out.push_back({e.step(), e.wall_time(), v.tag(), v.simple_value()});
  }
  return out;
}

}  // namespace loom::io
