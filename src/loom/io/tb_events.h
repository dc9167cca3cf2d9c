// TensorBoard event files. A file is a sequence of TFRecords: uint64 length (little-endian),
// uint32 masked CRC-32C of those 8 bytes, the payload, uint32 masked CRC-32C of the payload;
// each payload is a serialized loom.tb.Event (tb_event.proto, TensorFlow's field numbers).
// The first record carries file_version "brain.Event:2". Protobuf (Debian's libprotobuf)
// encodes the events and Boost.CRC computes CRC-32C.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace loom::io {

uint32_t crc32c(const void* data, size_t n);
// TFRecord's mask: rotate right by 15 and add 0xa282ead8 (a CRC of data holding CRCs is weak).
uint32_t masked_crc32c(const void* data, size_t n);

class TbEventWriter {
 public:
  // Creates dir and dir/events.out.tfevents.<unix seconds>.<host>.<pid>, and writes the
  // version record. Errors name the file.
  explicit TbEventWriter(const std::filesystem::path& dir);
  ~TbEventWriter();
  TbEventWriter(const TbEventWriter&) = delete;
  TbEventWriter& operator=(const TbEventWriter&) = delete;

  // One event at `step` holding every (tag, value) as a scalar summary; flushed to the file.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // SessionLog START at `step`: TensorBoard's loader drops what earlier files recorded at
  // steps >= step (a resumed run replaces the steps after its checkpoint).
  void session_start(int64_t step);
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::filesystem::path path_;
  std::FILE* f_ = nullptr;
};

// A scalar read back from an event file.
struct TbScalar {
  int64_t step;
  double wall_time;
  std::string tag;
  float value;
};

// The raw payloads of a TFRecord file; every length and both CRCs are checked, and a
// truncated or corrupt record is an error naming the file and the record's offset.
std::vector<std::string> read_tfrecords(const std::filesystem::path& file);
// The scalar summaries of an event file, in file order.
std::vector<TbScalar> read_tb_scalars(const std::filesystem::path& file);

}  // namespace loom::io
