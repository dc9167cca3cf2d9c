#include "loom/dist/job_trace.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "loom/util/atomic_write.h"
#include "loom/util/error.h"
#include "loom/util/trace.h"

namespace loom::dist {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One rank's events as bytes for the gather: [dropped, [kind, op, micro, step, bytes, peer,
// start_ns, end_ns, chunk]...] in JSON (the ops are literals, so they travel as text).
std::string serialize(const std::vector<trace::Event>& events, int64_t dropped) {
  json rows = json::array();
  for (const trace::Event& e : events)
    rows.push_back({static_cast<int>(e.kind), e.op ? e.op : "", e.micro, e.step, e.bytes, e.peer,
                    e.start_ns, e.end_ns, e.chunk});
  return json::array({dropped, std::move(rows)}).dump();
}

// "F3", and "F3.1" for model chunk 1 (as parallel::schedule_str): appended, not "F" + ...,
// which trips GCC 12's -Wrestrict false positive.
std::string pass_name(const char* letter, int micro, int chunk) {
  std::string s = letter;
  s += std::to_string(micro);
  if (chunk > 0) {
    s += '.';
    s += std::to_string(chunk);
  }
  return s;
}

std::string display_name(trace::Kind kind, const json& row) {
  const std::string op = row[1];
  const int micro = row[2], chunk = row[8];
  switch (kind) {
    case trace::Kind::Forward:
      return micro >= 0 ? pass_name("F", micro, chunk) : "forward";
    case trace::Kind::Backward:
      return micro >= 0 ? pass_name("B", micro, chunk) : "backward";
    case trace::Kind::Comm:
      return op;
    case trace::Kind::Wait:
      return "wait " + op;
    case trace::Kind::Step:
      return "step " + std::to_string(row[3].get<int64_t>());
    default:
      return trace::kind_name(kind);
  }
}

// The Chrome trace of every rank's rows (rank order), times from the earliest span.
void write_chrome(std::ostream& out, const std::vector<json>& ranks, const MeshShape& shape) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const json& r : ranks)
    for (const json& row : r[1]) origin = std::min(origin, row[6].get<int64_t>());
  const int world = static_cast<int>(ranks.size());
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out << json{{"ph", "M"},
              {"pid", 1},
              {"name", "process_name"},
              {"args", {{"name", "loom job, " + std::to_string(world) + " ranks"}}}}
             .dump();
  for (int r = 0; r < world; ++r) {
    const MeshCoord c = mesh_coord(r, shape);
    const std::string track = "rank " + std::to_string(r) + " (dp " + std::to_string(c.dp) +
                              ", pp " + std::to_string(c.pp) + ", tp " + std::to_string(c.tp) + ")";
    out << ",\n"
        << json{{"ph", "M"},
                {"pid", 1},
                {"tid", r},
                {"name", "thread_name"},
                {"args", {{"name", track}}}}
               .dump();
    out << ",\n"
        << json{{"ph", "M"},
                {"pid", 1},
                {"tid", r},
                {"name", "thread_sort_index"},
                {"args", {{"sort_index", r}}}}
               .dump();
    // Outer spans first (they ended last): viewers that read in order then nest correctly.
    std::vector<const json*> rows;
    for (const json& row : ranks[r][1]) rows.push_back(&row);
    std::stable_sort(rows.begin(), rows.end(), [](const json* a, const json* b) {
      const int64_t sa = (*a)[6], sb = (*b)[6];
      return sa != sb ? sa < sb : (*a)[7].get<int64_t>() > (*b)[7].get<int64_t>();
    });
    for (const json* rp : rows) {
      const json& row = *rp;
      const auto kind = static_cast<trace::Kind>(row[0].get<int>());
      const int64_t start = row[6], end = row[7];
      json args = json::object();
      if (row[2].get<int>() >= 0) args["micro"] = row[2];
      if (row[3].get<int64_t>() >= 0) args["step"] = row[3];
      if (row[4].get<int64_t>() >= 0) args["bytes"] = row[4];
      if (row[5].get<int>() >= 0) args["peer"] = row[5];
      if (row[8].get<int>() >= 0) args["chunk"] = row[8];
      out << ",\n"
          << json{{"ph", "X"},
                  {"pid", 1},
                  {"tid", r},
                  {"name", display_name(kind, row)},
                  {"cat", trace::kind_name(kind)},
                  {"ts", static_cast<double>(start - origin) / 1e3},
                  {"dur", static_cast<double>(end - start) / 1e3},
                  {"args", args}}
                 .dump();
    }
  }
  out << "\n]}\n";
}

}  // namespace

void write_job_trace(ProcessMesh& mesh, const fs::path& path) {
  Communicator& world = mesh.world();
  const bool was = trace::enabled();
  trace::enable(false);
  const int64_t dropped = trace::dropped();
  std::string mine = serialize(trace::take(), dropped);
  // Rank by rank: each broadcasts its size, then its bytes (as verify's gather does).
  std::vector<json> ranks;
  for (int r = 0; r < world.size(); ++r) {
    int64_t bytes = static_cast<int64_t>(mine.size());
    world.broadcast(&bytes, sizeof bytes, r);
    std::string blob = world.rank() == r ? mine : std::string(bytes, '\0');
    world.broadcast(blob.data(), bytes, r);
    if (world.rank() == 0) ranks.push_back(json::parse(blob));
  }
  trace::enable(was);
  if (world.rank() != 0) return;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r][0].get<int64_t>() > 0)
      std::fprintf(stderr, "loom: trace: rank %zu recorded more than %lld spans; %lld dropped\n", r,
                   static_cast<long long>(trace::kMaxEvents), ranks[r][0].get<long long>());
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  std::ostringstream out;
  write_chrome(out, ranks, mesh.shape());
  write_file_atomically(path, out.str());
}

}  // namespace loom::dist
