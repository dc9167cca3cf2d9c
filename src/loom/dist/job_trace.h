// The job's schedule trace as one file: every rank's spans (util/trace.h) gathered to world
// rank 0, which writes a Chrome trace-event JSON that Perfetto (ui.perfetto.dev) and
// chrome://tracing open: {"traceEvents": [...]}, one track per rank (pid 1, tid = world
// rank) named "rank R (dp d, pp s, tp t)", each span a complete event ("ph": "X", "ts" and
// "dur" in microseconds from the job's first span) whose category is its kind (forward,
// backward, optimizer, comm, wait, step, eval) and whose args carry what is known of micro,
// step, bytes and peer. Names: F<i> / B<i> for micro-batch i's forward / backward, the
// Communicator call for comm ("all_gather", "isend"), "wait <call>" for waits, "step <n>".
// Times are each machine's steady clock: ranks on one machine are on one time line, ranks
// on different machines are not aligned.
#pragma once

#include <filesystem>

#include "loom/dist/mesh.h"

namespace loom::dist {

// Collective over mesh.world(). Takes every rank's recorded spans (the recorder is left
// empty, recording as it was; the gather itself is not recorded); world rank 0 writes
// `path` through a temporary file renamed into place, and prints a warning when a rank's
// recorder was full (util/trace.h kMaxEvents). Throws loom::Error on rank 0 when the file
// cannot be written.
void write_job_trace(ProcessMesh& mesh, const std::filesystem::path& path);

}  // namespace loom::dist
