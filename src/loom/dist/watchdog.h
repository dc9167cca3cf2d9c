// The communication watchdog (comm_timeout_s; NCCL's watchdog and Megatron's hang detection
// do this job on GPUs). Every blocking call and every wait on a non-blocking one marks
// itself in flight (Communicator does it); a thread checks twice a second. When one call
// has waited longer than the timeout, the rank writes a one-line report (the call, its
// bytes, its group's world ranks, how long) into a folder every rank sees (a shared
// output_dir on several machines), waits a few seconds for the other ranks' reports, names
// the group's ranks that wrote none - the ones that did not arrive: stopped, hung in
// something else, or still computing - and ends the process with status 1, so mpirun stops
// the job. The thread never calls MPI (the communicators are single-threaded).
#pragma once

#include <cstdint>
#include <filesystem>

namespace loom::dist {

class Communicator;

// Starts (or re-arms) the watchdog of this process: `dir` must exist and be empty of
// reports (the caller clears it on one rank and waits for the others). timeout_s <= 0
// stops it.
void start_watchdog(double timeout_s, const std::filesystem::path& dir, int world_rank,
                    int world_size);
void stop_watchdog();

// RAII: the calling thread is inside `op` (bytes) on comm until the object goes.
class InFlight {
 public:
  InFlight(const char* op, int64_t bytes, const Communicator* comm);
  ~InFlight();
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  bool armed_ = false;
};

}  // namespace loom::dist
