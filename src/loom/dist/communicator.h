// Communicator: the collectives the engine calls for data parallelism and ZeRO, over f32
// buffers with counts in elements. One interface, several engines behind it: MpiComm
// (OpenMPI, processes started by mpirun), LocalComm (world size 1, no MPI at all), and later
// NCCL. Contract: every rank of a communicator makes the same calls in the same order with
// the same counts (as in MPI); argument errors and failures of the engine throw loom::Error
// naming the operation; buffers are caller-owned and must stay alive until the call (or the
// Request of a non-blocking call) completes. Only the thread that created the world
// communicator may call it (MPI_THREAD_FUNNELED); OpenMP threads inside a rank never do.
// Sub-communicators come from split(), and in the engine only through dist::ProcessMesh.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "loom/kernels/cpu/bf16.h"

namespace loom::dist {

class Communicator;

// Every public call below is also a trace span (util/trace.h: the call's name, its payload
// in bytes: the whole buffer reduced, gathered or broadcast, or the message; the peer of a
// point-to-point call, a broadcast's root), and so is every wait on the Request of a
// non-blocking one: one place counts and traces all communication.
// Bytes this rank sends, counted as the bandwidth-optimal (ring) algorithms send them: the
// algorithmic volume of each call, the quantity the ZeRO paper counts, not the bytes MPI
// actually puts on the wire (which depend on its algorithm choice and are not measured).
// With N ranks: all_reduce of n values of s bytes 2(N-1)/N * s*n; reduce_scatter and
// all_gather of n_per_rank elements of s bytes (N-1) * s*n_per_rank; broadcast of b bytes
// (N-1)/N * b; send of n floats 4n; barrier and recv 0 (fractions rounded down). N = 1
// sends nothing. A call counts once it completed (a non-blocking one once it started); one
// that threw does not. Each communicator counts its own calls: the engine sums over its
// groups.
struct CommStats {
  int64_t bytes_sent = 0;
  int64_t collectives = 0;  // calls of every kind (send/recv and barrier included)
};

// The handle of a non-blocking call. Move-only. wait() blocks until the call has completed
// (a no-op when it already has, or for a default-constructed Request); test() says whether
// it has, without blocking; once either has thrown, the Request counts as complete.
// Destroying or assigning over a pending Request waits for it, so buffers are never left in
// flight; a failure at that point terminates the process. A wait that finds the call still
// pending is a trace span (util/trace.h) named after the call ("wait irecv").
class Request {
 public:
  // What an engine implements for its pending operation.
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;  // blocks until complete; throws loom::Error on failure
    virtual bool test() = 0;  // true when complete; throws loom::Error on failure
  };

  Request() = default;
  explicit Request(std::unique_ptr<Pending> pending) : pending_(std::move(pending)) {}
  Request(Request&& other) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  void wait();
  bool test();

 private:
  friend class Communicator;          // names the call for the trace
  std::unique_ptr<Pending> pending_;  // null once complete
  const char* op_ = "";
  int64_t bytes_ = 0;
  int peer_ = -1;
  const Communicator* comm_ = nullptr;  // for the watchdog (dist/watchdog.h)
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  // The members' ranks in the world communicator, by rank here (for the watchdog's report).
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  int size() const { return size_; }

  // Blocking collectives. n, n_per_rank >= 0.
  void all_reduce_sum(float* buf, int64_t n);  // in place
  // send holds size() * n_per_rank floats; recv (n_per_rank) gets the sum of chunk rank().
  // send and recv must not overlap.
  void reduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank);
  // recv holds size() * n_per_rank floats; chunk r comes from rank r. send may be
  // recv + rank() * n_per_rank (in place: ZeRO gathers into the full buffer it owns a
  // slice of); otherwise send and recv must not overlap.
  void all_gather(const float* send, float* recv, int64_t n_per_rank);
  void broadcast(void* buf, int64_t bytes, int root);
  void send(const float* buf, int64_t n, int dest, int tag);  // tag >= 0
  void recv(float* buf, int64_t n, int src, int tag);         // exactly n floats expected
  void barrier();
  // Expert parallelism's exchange (MPI_Alltoall / MPI_Alltoallv). all_to_all_counts:
  // send[r n .. (r+1) n) goes to rank r, recv[r n .. (r+1) n) comes from rank r (n =
  // n_per_rank values). all_to_all:
  // send holds send_counts[r] floats for each rank r back to back, recv gets recv_counts[r]
  // floats from each rank r back to back (the counts exchanged first); buffers must not
  // overlap. Bytes counted: what goes to other ranks.
  void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n_per_rank);
  void all_to_all(const float* send, const int64_t* send_counts, float* recv,
                  const int64_t* recv_counts);
  // Scalars (loss sums, squared norms), in double so the sum of many ranks stays exact
  // enough for the equivalence checks.
  void all_reduce_max(double* value) { all_reduce_max(value, 1); }
  void all_reduce_max(double* buf, int64_t n);  // elementwise, in place
  void all_reduce_sum(double* buf, int64_t n);

  // Non-blocking forms of the three gradient/parameter collectives (MPI-3 Iallreduce,
  // Ireduce_scatter_block, Iallgather), so communication can overlap backward.
  Request iall_reduce_sum(float* buf, int64_t n);
  Request ireduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank);
  Request iall_gather(const float* send, float* recv, int64_t n_per_rank);
  // The same gather of 16-bit values (bf16 or fp16 bits, moved unchanged): mixed
  // precision's working weights.
  Request iall_gather(const uint16_t* send, uint16_t* recv, int64_t n_per_rank);
  // Sums of 16-bit values in format f (DeepSpeed's communication_data_type bf16/fp16): each
  // pairwise sum is taken in fp32 and rounded back to f, so the result depends on the
  // reduction's order as the 16-bit sums of NCCL's do (fixed for a given communicator).
  Request iall_reduce_sum(kernels::Half f, uint16_t* buf, int64_t n);
  Request ireduce_scatter_sum(kernels::Half f, const uint16_t* send, uint16_t* recv,
                              int64_t n_per_rank);
  // Non-blocking point-to-point (MPI_Isend / MPI_Irecv), for pipeline stages: the buffer
  // must stay untouched until the Request completes; irecv's wait() throws when the message
  // that arrived is not exactly n floats.
  Request isend(const float* buf, int64_t n, int dest, int tag);
  Request irecv(float* buf, int64_t n, int src, int tag);

  // Collective over this communicator: ranks with the same color form a new communicator,
  // ordered by key (ties by rank). color >= 0: every rank gets a communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key) const = 0;

  // Ends every process of the job with exit status `code` (MPI_Abort on MPI_COMM_WORLD;
  // exit(code) for world size 1). A rank that fails while others may be waiting in a
  // collective with it must call this: returning from main instead would finalize MPI,
  // which waits for every rank, and the others wait for this one.
  [[noreturn]] virtual void abort(int code) = 0;

  CommStats stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  Communicator(int rank, int size);
  std::vector<int> world_ranks_;  // set by the engine (world_ranks())

  // The engine's side: arguments are already checked (counts >= 0, ranks in range, tag >= 0);
  // the caller counts the call in stats when it returns.
  virtual void do_all_reduce_sum(float* buf, int64_t n) = 0;
  virtual void do_reduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) = 0;
  virtual void do_all_gather(const float* send, float* recv, int64_t n_per_rank) = 0;
  virtual void do_broadcast(void* buf, int64_t bytes, int root) = 0;
  virtual void do_send(const float* buf, int64_t n, int dest, int tag) = 0;
  virtual void do_recv(float* buf, int64_t n, int src, int tag) = 0;
  virtual void do_barrier() = 0;
  virtual void do_all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n_per_rank) = 0;
  virtual void do_all_to_all(const float* send, const int64_t* send_counts, float* recv,
                             const int64_t* recv_counts) = 0;
  virtual void do_all_reduce_max(double* buf, int64_t n) = 0;
  virtual void do_all_reduce_sum(double* buf, int64_t n) = 0;
  virtual Request do_iall_reduce_sum(float* buf, int64_t n) = 0;
  virtual Request do_ireduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) = 0;
  virtual Request do_iall_gather(const float* send, float* recv, int64_t n_per_rank) = 0;
  virtual Request do_iall_gather(const uint16_t* send, uint16_t* recv, int64_t n_per_rank) = 0;
  virtual Request do_iall_reduce_sum(kernels::Half f, uint16_t* buf, int64_t n) = 0;
  virtual Request do_ireduce_scatter_sum(kernels::Half f, const uint16_t* send, uint16_t* recv,
                                         int64_t n_per_rank) = 0;
  virtual Request do_isend(const float* buf, int64_t n, int dest, int tag) = 0;
  virtual Request do_irecv(float* buf, int64_t n, int src, int tag) = 0;

 private:
  void count(int64_t bytes) {
    stats_.bytes_sent += bytes;
    stats_.collectives += 1;
  }
  // Names a non-blocking call's Request for the trace of its wait.
  Request named(Request req, const char* op, int64_t bytes, int peer = -1) const;
  int64_t all_reduce_bytes(int64_t payload_bytes) const;
  // reduce_scatter / all_gather of n_per_rank elements of `elem` bytes
  int64_t ring_bytes(int64_t n_per_rank, int64_t elem = sizeof(float)) const;

  int rank_;
  int size_;
  CommStats stats_;
};

// World size 1: collectives are copies (or nothing), and MPI is never touched.
class LocalComm final : public Communicator {
 public:
  LocalComm() : Communicator(0, 1) {}
  std::unique_ptr<Communicator> split(int color, int key) const override;
  [[noreturn]] void abort(int code) override;

 protected:
  void do_all_reduce_sum(float*, int64_t) override {}
  void do_reduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) override;
  void do_all_gather(const float* send, float* recv, int64_t n_per_rank) override;
  void do_broadcast(void*, int64_t, int) override {}
  void do_send(const float* buf, int64_t n, int dest, int tag) override;
  void do_recv(float* buf, int64_t n, int src, int tag) override;
  void do_barrier() override {}
  void do_all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) override {
    std::copy_n(send, n, recv);
  }
  void do_all_to_all(const float* send, const int64_t* send_counts, float* recv,
                     const int64_t*) override;
  void do_all_reduce_max(double*, int64_t) override {}
  void do_all_reduce_sum(double*, int64_t) override {}
  Request do_iall_reduce_sum(float* buf, int64_t n) override;
  Request do_ireduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) override;
  Request do_iall_gather(const float* send, float* recv, int64_t n_per_rank) override;
  Request do_iall_gather(const uint16_t* send, uint16_t* recv, int64_t n_per_rank) override;
  Request do_iall_reduce_sum(kernels::Half f, uint16_t* buf, int64_t n) override;
  Request do_ireduce_scatter_sum(kernels::Half f, const uint16_t* send, uint16_t* recv,
                                 int64_t n_per_rank) override;
  Request do_isend(const float* buf, int64_t n, int dest, int tag) override;
  Request do_irecv(float* buf, int64_t n, int src, int tag) override;
};

// An MPI communicator. The MPI_Comm stays inside communicator.cpp, so including this header
// never needs <mpi.h>. Counts are checked to fit MPI's int (with the whole size()*n_per_rank
// buffer for reduce_scatter/all_gather); larger calls throw instead of being split.
class MpiComm final : public Communicator {
 public:
  // A communicator over every process of the job (a duplicate of MPI_COMM_WORLD, errors
  // returned rather than fatal). The first call initialises MPI (MPI_Init_thread with
  // MPI_THREAD_FUNNELED) and registers MPI_Finalize to run at exit; when MPI was already
  // initialised (by a host program) its owner finalizes it. Collective: every rank calls it.
  static std::unique_ptr<MpiComm> world();

  ~MpiComm() override;
  std::unique_ptr<Communicator> split(int color, int key) const override;
  [[noreturn]] void abort(int code) override;

 protected:
  void do_all_reduce_sum(float* buf, int64_t n) override;
  void do_reduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) override;
  void do_all_gather(const float* send, float* recv, int64_t n_per_rank) override;
  void do_broadcast(void* buf, int64_t bytes, int root) override;
  void do_send(const float* buf, int64_t n, int dest, int tag) override;
  void do_recv(float* buf, int64_t n, int src, int tag) override;
  void do_barrier() override;
  void do_all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n_per_rank) override;
  void do_all_to_all(const float* send, const int64_t* send_counts, float* recv,
                     const int64_t* recv_counts) override;
  void do_all_reduce_max(double* buf, int64_t n) override;
  void do_all_reduce_sum(double* buf, int64_t n) override;
  Request do_iall_reduce_sum(float* buf, int64_t n) override;
  Request do_ireduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) override;
  Request do_iall_gather(const float* send, float* recv, int64_t n_per_rank) override;
  Request do_iall_gather(const uint16_t* send, uint16_t* recv, int64_t n_per_rank) override;
  Request do_iall_reduce_sum(kernels::Half f, uint16_t* buf, int64_t n) override;
  Request do_ireduce_scatter_sum(kernels::Half f, const uint16_t* send, uint16_t* recv,
                                 int64_t n_per_rank) override;
  Request do_isend(const float* buf, int64_t n, int dest, int tag) override;
  Request do_irecv(float* buf, int64_t n, int src, int tag) override;

 private:
  struct Handle;  // the MPI_Comm
  MpiComm(std::unique_ptr<Handle> handle, int rank, int size);
  static std::unique_ptr<MpiComm> adopt(std::unique_ptr<Handle> handle);  // a new MPI_Comm

  std::unique_ptr<Handle> handle_;
};

// True when this process was started by mpirun (OMPI_COMM_WORLD_SIZE or PMIX_RANK is set)
// or MPI is already initialised.
bool started_under_mpi();

// The world communicator for the engine: MpiComm::world() when started_under_mpi(),
// otherwise a LocalComm, so `loom train` without mpirun never initialises MPI.
std::unique_ptr<Communicator> make_world_communicator();

}  // namespace loom::dist
