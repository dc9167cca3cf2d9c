#include "loom/dist/communicator.h"

#include "loom/dist/watchdog.h"

// OpenMPI's mpi.h pulls in its deprecated C++ bindings under C++ unless told not to; they
// would need libmpi_cxx. We use the C API only.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "loom/util/error.h"
#include "loom/util/trace.h"

namespace loom::dist {

// ---- Request ----

// Both noexcept: a failure while waiting here terminates, as the header says.
Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    wait();
    pending_ = std::move(other.pending_);
    op_ = other.op_;
    bytes_ = other.bytes_;
    peer_ = other.peer_;
    comm_ = other.comm_;
  }
  return *this;
}

Request::~Request() { wait(); }

// The engine's handle is taken out first, so an operation that failed is not waited for
// again when the Request is destroyed.
void Request::wait() {
  if (!pending_) return;
  std::unique_ptr<Pending> p = std::move(pending_);
  trace::Span span(trace::Kind::Wait, op_, bytes_, peer_);
  const InFlight watch(op_, bytes_, comm_);
  p->wait();
}

bool Request::test() {
  if (!pending_) return true;
  std::unique_ptr<Pending> p = std::move(pending_);
  if (p->test()) return true;
  pending_ = std::move(p);
  return false;
}

// ---- Communicator: argument checks and byte accounting shared by every engine ----
// A call is counted once it has completed (blocking) or started (non-blocking), so one that
// throws leaves the stats as they were.

namespace {

void check_count(int64_t n, const char* op) {
  LOOM_CHECK(n >= 0, std::string(op) + ": negative count " + std::to_string(n));
}

void check_peer(int peer, int size, const char* op, const char* what) {
  LOOM_CHECK(peer >= 0 && peer < size, std::string(op) + ": " + what + " " + std::to_string(peer) +
                                           " is not a rank of a " + "communicator of size " +
                                           std::to_string(size));
}

constexpr int64_t kF32 = sizeof(float), kF64 = sizeof(double);

}  // namespace

Communicator::Communicator(int rank, int size) : rank_(rank), size_(size) {
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size,
             "communicator: rank " + std::to_string(rank) + " of size " + std::to_string(size));
  world_ranks_.assign(1, rank);  // an engine with other ranks fills them in
}

Request Communicator::named(Request req, const char* op, int64_t bytes, int peer) const {
  req.op_ = op;
  req.bytes_ = bytes;
  req.peer_ = peer;
  req.comm_ = this;
  return req;
}

// Ring all-reduce = reduce-scatter + all-gather: each rank sends 2(N-1) chunks of 1/N.
int64_t Communicator::all_reduce_bytes(int64_t payload_bytes) const {
  return 2 * (size_ - 1) * payload_bytes / size_;
}

int64_t Communicator::ring_bytes(int64_t n_per_rank, int64_t elem) const {
  return (size_ - 1) * n_per_rank * elem;
}

void Communicator::all_reduce_sum(float* buf, int64_t n) {
  check_count(n, "all_reduce_sum");
  trace::Span span(trace::Kind::Comm, "all_reduce_sum", n * kF32);
  const InFlight watch("all_reduce_sum", n * kF32, this);
  do_all_reduce_sum(buf, n);
  count(all_reduce_bytes(n * kF32));
}

void Communicator::reduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) {
  check_count(n_per_rank, "reduce_scatter_sum");
  trace::Span span(trace::Kind::Comm, "reduce_scatter_sum", size_ * n_per_rank * kF32);
  const InFlight watch("reduce_scatter_sum", size_ * n_per_rank * kF32, this);
  do_reduce_scatter_sum(send, recv, n_per_rank);
  count(ring_bytes(n_per_rank));
}

void Communicator::all_gather(const float* send, float* recv, int64_t n_per_rank) {
  check_count(n_per_rank, "all_gather");
  trace::Span span(trace::Kind::Comm, "all_gather", size_ * n_per_rank * kF32);
  const InFlight watch("all_gather", size_ * n_per_rank * kF32, this);
  do_all_gather(send, recv, n_per_rank);
  count(ring_bytes(n_per_rank));
}

void Communicator::broadcast(void* buf, int64_t bytes, int root) {
  check_count(bytes, "broadcast");
  check_peer(root, size_, "broadcast", "root");
  trace::Span span(trace::Kind::Comm, "broadcast", bytes, root);
  const InFlight watch("broadcast", bytes, this);
  do_broadcast(buf, bytes, root);
  count((size_ - 1) * bytes / size_);  // scatter + all-gather: (N-1)/N of it from each rank
}

void Communicator::send(const float* buf, int64_t n, int dest, int tag) {
  check_count(n, "send");
  check_peer(dest, size_, "send", "destination");
  LOOM_CHECK(tag >= 0, "send: negative tag " + std::to_string(tag));
  trace::Span span(trace::Kind::Comm, "send", n * kF32, dest);
  const InFlight watch("send", n * kF32, this);
  do_send(buf, n, dest, tag);
  count(n * kF32);
}

void Communicator::recv(float* buf, int64_t n, int src, int tag) {
  check_count(n, "recv");
  check_peer(src, size_, "recv", "source");
  LOOM_CHECK(tag >= 0, "recv: negative tag " + std::to_string(tag));
  trace::Span span(trace::Kind::Comm, "recv", n * kF32, src);
  const InFlight watch("recv", n * kF32, this);
  do_recv(buf, n, src, tag);
  count(0);
}

Request Communicator::isend(const float* buf, int64_t n, int dest, int tag) {
  check_count(n, "isend");
  check_peer(dest, size_, "isend", "destination");
  LOOM_CHECK(tag >= 0, "isend: negative tag " + std::to_string(tag));
  trace::Span span(trace::Kind::Comm, "isend", n * kF32, dest);
  Request req = do_isend(buf, n, dest, tag);
  count(n * kF32);
  return named(std::move(req), "isend", n * kF32, dest);
}

Request Communicator::irecv(float* buf, int64_t n, int src, int tag) {
  check_count(n, "irecv");
  check_peer(src, size_, "irecv", "source");
  LOOM_CHECK(tag >= 0, "irecv: negative tag " + std::to_string(tag));
  trace::Span span(trace::Kind::Comm, "irecv", n * kF32, src);
  Request req = do_irecv(buf, n, src, tag);
  count(0);
  return named(std::move(req), "irecv", n * kF32, src);
}

void Communicator::barrier() {
  trace::Span span(trace::Kind::Comm, "barrier", 0);
  const InFlight watch("barrier", 0, this);
  do_barrier();
  count(0);
}

void Communicator::all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n_per_rank) {
  check_count(n_per_rank, "all_to_all_counts");
  constexpr int64_t kI64 = sizeof(int64_t);
  trace::Span span(trace::Kind::Comm, "all_to_all_counts", size_ * n_per_rank * kI64);
  const InFlight watch("all_to_all_counts", size_ * n_per_rank * kI64, this);
  do_all_to_all_counts(send, recv, n_per_rank);
  count((size_ - 1) * n_per_rank * kI64);
}

void Communicator::all_to_all(const float* send, const int64_t* send_counts, float* recv,
                              const int64_t* recv_counts) {
  int64_t total = 0, away = 0;
  for (int r = 0; r < size_; ++r) {
    check_count(send_counts[r], "all_to_all");
    check_count(recv_counts[r], "all_to_all");
    total += send_counts[r];
    if (r != rank_) away += send_counts[r];
  }
  trace::Span span(trace::Kind::Comm, "all_to_all", total * kF32);
  const InFlight watch("all_to_all", total * kF32, this);
  do_all_to_all(send, send_counts, recv, recv_counts);
  count(away * kF32);
}

void Communicator::all_reduce_max(double* buf, int64_t n) {
  check_count(n, "all_reduce_max");
  trace::Span span(trace::Kind::Comm, "all_reduce_max", n * kF64);
  const InFlight watch("all_reduce_max", n * kF64, this);
  do_all_reduce_max(buf, n);
  count(all_reduce_bytes(n * kF64));
}

void Communicator::all_reduce_sum(double* buf, int64_t n) {
  check_count(n, "all_reduce_sum");
  trace::Span span(trace::Kind::Comm, "all_reduce_sum", n * kF64);
  const InFlight watch("all_reduce_sum", n * kF64, this);
  do_all_reduce_sum(buf, n);
  count(all_reduce_bytes(n * kF64));
}

Request Communicator::iall_reduce_sum(float* buf, int64_t n) {
  check_count(n, "iall_reduce_sum");
  trace::Span span(trace::Kind::Comm, "iall_reduce_sum", n * kF32);
  Request req = do_iall_reduce_sum(buf, n);
  count(all_reduce_bytes(n * kF32));
  return named(std::move(req), "iall_reduce_sum", n * kF32);
}

Request Communicator::ireduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) {
  check_count(n_per_rank, "ireduce_scatter_sum");
  const int64_t bytes = size_ * n_per_rank * kF32;
  trace::Span span(trace::Kind::Comm, "ireduce_scatter_sum", bytes);
  Request req = do_ireduce_scatter_sum(send, recv, n_per_rank);
  count(ring_bytes(n_per_rank));
  return named(std::move(req), "ireduce_scatter_sum", bytes);
}

Request Communicator::iall_gather(const float* send, float* recv, int64_t n_per_rank) {
  check_count(n_per_rank, "iall_gather");
  const int64_t bytes = size_ * n_per_rank * kF32;
  trace::Span span(trace::Kind::Comm, "iall_gather", bytes);
  Request req = do_iall_gather(send, recv, n_per_rank);
  count(ring_bytes(n_per_rank));
  return named(std::move(req), "iall_gather", bytes);
}

Request Communicator::iall_gather(const uint16_t* send, uint16_t* recv, int64_t n_per_rank) {
  check_count(n_per_rank, "iall_gather");
  const int64_t bytes = size_ * n_per_rank * 2;
  trace::Span span(trace::Kind::Comm, "iall_gather", bytes);
  Request req = do_iall_gather(send, recv, n_per_rank);
  count(ring_bytes(n_per_rank, 2));
  return named(std::move(req), "iall_gather", bytes);
}

Request Communicator::iall_reduce_sum(kernels::Half f, uint16_t* buf, int64_t n) {
  check_count(n, "iall_reduce_sum");
  trace::Span span(trace::Kind::Comm, "iall_reduce_sum", n * 2);
  Request req = do_iall_reduce_sum(f, buf, n);
  count(all_reduce_bytes(n * 2));
  return named(std::move(req), "iall_reduce_sum", n * 2);
}

Request Communicator::ireduce_scatter_sum(kernels::Half f, const uint16_t* send, uint16_t* recv,
                                          int64_t n_per_rank) {
  check_count(n_per_rank, "ireduce_scatter_sum");
  const int64_t bytes = size_ * n_per_rank * 2;
  trace::Span span(trace::Kind::Comm, "ireduce_scatter_sum", bytes);
  Request req = do_ireduce_scatter_sum(f, send, recv, n_per_rank);
  count(ring_bytes(n_per_rank, 2));
  return named(std::move(req), "ireduce_scatter_sum", bytes);
}

// ---- LocalComm ----

std::unique_ptr<Communicator> LocalComm::split(int color, int) const {
  LOOM_CHECK(color >= 0, "split: negative color " + std::to_string(color));
  return std::make_unique<LocalComm>();
}

void LocalComm::abort(int code) { std::exit(code); }

void LocalComm::do_reduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) {
  std::copy_n(send, n_per_rank, recv);
}

void LocalComm::do_all_gather(const float* send, float* recv, int64_t n_per_rank) {
  if (send != recv) std::copy_n(send, n_per_rank, recv);
}

void LocalComm::do_all_to_all(const float* send, const int64_t* send_counts, float* recv,
                              const int64_t*) {
  std::copy_n(send, send_counts[0], recv);
}

void LocalComm::do_send(const float*, int64_t, int, int) {
  throw Error("send: a communicator of size 1 has no other rank to send to");
}

void LocalComm::do_recv(float*, int64_t, int, int) {
  throw Error("recv: a communicator of size 1 has no other rank to receive from");
}

Request LocalComm::do_iall_reduce_sum(float*, int64_t) { return {}; }

Request LocalComm::do_iall_reduce_sum(kernels::Half, uint16_t*, int64_t) { return {}; }

Request LocalComm::do_ireduce_scatter_sum(kernels::Half, const uint16_t* send, uint16_t* recv,
                                          int64_t n_per_rank) {
  std::copy_n(send, n_per_rank, recv);
  return {};
}

Request LocalComm::do_isend(const float*, int64_t, int, int) {
  throw Error("isend: a communicator of size 1 has no other rank to send to");
}

Request LocalComm::do_irecv(float*, int64_t, int, int) {
  throw Error("irecv: a communicator of size 1 has no other rank to receive from");
}

Request LocalComm::do_ireduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) {
  do_reduce_scatter_sum(send, recv, n_per_rank);
  return {};
}

Request LocalComm::do_iall_gather(const float* send, float* recv, int64_t n_per_rank) {
  do_all_gather(send, recv, n_per_rank);
  return {};
}

Request LocalComm::do_iall_gather(const uint16_t* send, uint16_t* recv, int64_t n_per_rank) {
  if (send != recv) std::copy_n(send, n_per_rank, recv);
  return {};
}

// ---- MpiComm ----

namespace {

// MPI's error string for rc, as loom::Error naming the operation.
void check_mpi(int rc, const char* op) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw Error(
      std::string("MPI ") + op + " failed: " +
      (len > 0 ? std::string(text, static_cast<size_t>(len)) : "error code " + std::to_string(rc)));
}

int to_int(int64_t n, const char* op) {
  LOOM_CHECK(n <= std::numeric_limits<int>::max(),
             std::string("MPI ") + op + ": count " + std::to_string(n) +
                 " exceeds MPI's int limit (2147483647); split the buffer");
  return static_cast<int>(n);
}

// reduce_scatter/all_gather: the per-rank count is what MPI is passed, but some of its
// algorithms count the whole size()*n buffer in an int too, so both must fit.
int to_int_per_rank(int64_t n_per_rank, int size, const char* op) {
  LOOM_CHECK(n_per_rank <= std::numeric_limits<int>::max() / size,
             std::string("MPI ") + op + ": " + std::to_string(size) + " x " +
                 std::to_string(n_per_rank) + " elements exceed MPI's int limit (2147483647)" +
                 "; split the buffer");
  return static_cast<int>(n_per_rank);
}

class MpiPending final : public Request::Pending {
 public:
  MpiPending(MPI_Request req, const char* op) : req_(req), op_(op) {}
  void wait() override { check_mpi(MPI_Wait(&req_, MPI_STATUS_IGNORE), op_); }
  bool test() override {
    int done = 0;
    check_mpi(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), op_);
    return done != 0;
  }

 private:
  MPI_Request req_;
  const char* op_;
};

// A receive: complete only once the message is known to be exactly the n floats expected.
class MpiRecvPending final : public Request::Pending {
 public:
  MpiRecvPending(MPI_Request req, int64_t n, int src, int tag)
      : req_(req), n_(n), src_(src), tag_(tag) {}
  void wait() override {
    MPI_Status status;
    check_mpi(MPI_Wait(&req_, &status), "irecv");
    check(status);
  }
  bool test() override {
    int done = 0;
    MPI_Status status;
    check_mpi(MPI_Test(&req_, &done, &status), "irecv");
    if (done) check(status);
    return done != 0;
  }

 private:
  void check(const MPI_Status& status) const {
    int got = 0;
    check_mpi(MPI_Get_count(&status, MPI_FLOAT, &got), "irecv");
    LOOM_CHECK(got == n_, "MPI irecv: expected " + std::to_string(n_) + " floats from rank " +
                              std::to_string(src_) + " (tag " + std::to_string(tag_) + "), got " +
                              std::to_string(got));
  }
  MPI_Request req_;
  int64_t n_;
  int src_, tag_;
};

Request pending(MPI_Request req, const char* op) {
  return Request(std::make_unique<MpiPending>(req, op));
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void init_mpi_once() {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "Initialized");
  if (initialized) {
    int provided = 0;
    check_mpi(MPI_Query_thread(&provided), "Query_thread");
    LOOM_CHECK(provided >= MPI_THREAD_FUNNELED,
               "MPI was initialised below MPI_THREAD_FUNNELED; Loom needs at least that");
    return;
  }
  int provided = 0;
  // MPI_Init_thread's errors are fatal (no communicator exists yet to return them on).
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  std::atexit(finalize_at_exit);
  LOOM_CHECK(provided >= MPI_THREAD_FUNNELED,
             "MPI_Init_thread: this MPI library does not provide MPI_THREAD_FUNNELED");
}

}  // namespace

// A constructor rather than an aggregate: std::make_unique<Handle>(comm) initialises with
// parentheses, which for aggregates is C++20 (P0960) that clang 14 does not implement.
struct MpiComm::Handle {
  explicit Handle(MPI_Comm c) : comm(c) {}
  MPI_Comm comm;
};

MpiComm::MpiComm(std::unique_ptr<Handle> handle, int rank, int size)
    : Communicator(rank, size), handle_(std::move(handle)) {}

// Errors on our communicators come back as return codes (turned into loom::Error) instead of
// MPI's default of aborting the job.
std::unique_ptr<MpiComm> MpiComm::adopt(std::unique_ptr<Handle> handle) {
  MPI_Comm comm = handle->comm;
  check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "Comm_set_errhandler");
  int rank = 0, size = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "Comm_size");
  std::unique_ptr<MpiComm> c(new MpiComm(std::move(handle), rank, size));
  // The members' world ranks, for the watchdog's report.
  MPI_Group group, world;
  check_mpi(MPI_Comm_group(comm, &group), "Comm_group");
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "Comm_group");
  std::vector<int> mine(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) mine[r] = r;
  c->world_ranks_.resize(static_cast<size_t>(size));
  check_mpi(MPI_Group_translate_ranks(group, size, mine.data(), world, c->world_ranks_.data()),
            "Group_translate_ranks");
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return c;
}

std::unique_ptr<MpiComm> MpiComm::world() {
  init_mpi_once();
  MPI_Comm comm;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "Comm_dup");
  return adopt(std::make_unique<Handle>(comm));
}

MpiComm::~MpiComm() {
  // A communicator that outlives MPI_Finalize (say, held in a static) was freed with it.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&handle_->comm);
}

std::unique_ptr<Communicator> MpiComm::split(int color, int key) const {
  LOOM_CHECK(color >= 0, "split: negative color " + std::to_string(color));
  MPI_Comm comm;
  check_mpi(MPI_Comm_split(handle_->comm, color, key, &comm), "Comm_split");
  return adopt(std::make_unique<Handle>(comm));
}

void MpiComm::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest if it did
}

void MpiComm::do_all_reduce_sum(float* buf, int64_t n) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, to_int(n, "all_reduce_sum"), MPI_FLOAT, MPI_SUM,
                          handle_->comm),
            "all_reduce_sum");
}

void MpiComm::do_reduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) {
  int n = to_int_per_rank(n_per_rank, size(), "reduce_scatter_sum");
  check_mpi(MPI_Reduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, handle_->comm),
            "reduce_scatter_sum");
}

// MPI forbids aliased buffers; the in-place gather is spelled MPI_IN_PLACE.
template <typename T>
static const void* gather_source(const T* send, T* recv, int64_t n_per_rank, int rank) {
  return send == recv + rank * n_per_rank ? MPI_IN_PLACE : send;
}

void MpiComm::do_all_gather(const float* send, float* recv, int64_t n_per_rank) {
  int n = to_int_per_rank(n_per_rank, size(), "all_gather");
  check_mpi(MPI_Allgather(gather_source(send, recv, n_per_rank, rank()), n, MPI_FLOAT, recv, n,
                          MPI_FLOAT, handle_->comm),
            "all_gather");
}

void MpiComm::do_broadcast(void* buf, int64_t bytes, int root) {
  check_mpi(MPI_Bcast(buf, to_int(bytes, "broadcast"), MPI_BYTE, root, handle_->comm), "broadcast");
}

void MpiComm::do_send(const float* buf, int64_t n, int dest, int tag) {
  check_mpi(MPI_Send(buf, to_int(n, "send"), MPI_FLOAT, dest, tag, handle_->comm), "send");
}

void MpiComm::do_recv(float* buf, int64_t n, int src, int tag) {
  MPI_Status status;
  check_mpi(MPI_Recv(buf, to_int(n, "recv"), MPI_FLOAT, src, tag, handle_->comm, &status), "recv");
  // A shorter message is not an MPI error, but it is a schedule bug on one side.
  int got = 0;
  check_mpi(MPI_Get_count(&status, MPI_FLOAT, &got), "recv");
  LOOM_CHECK(got == n, "MPI recv: expected " + std::to_string(n) + " floats from rank " +
                           std::to_string(src) + " (tag " + std::to_string(tag) + "), got " +
                           std::to_string(got));
}

void MpiComm::do_barrier() { check_mpi(MPI_Barrier(handle_->comm), "barrier"); }

void MpiComm::do_all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n_per_rank) {
  const int n = to_int_per_rank(n_per_rank, size(), "all_to_all_counts");
  check_mpi(MPI_Alltoall(send, n, MPI_INT64_T, recv, n, MPI_INT64_T, handle_->comm),
            "all_to_all_counts");
}

void MpiComm::do_all_to_all(const float* send, const int64_t* send_counts, float* recv,
                            const int64_t* recv_counts) {
  // MPI's counts and displacements are ints: every one, and each buffer's total, must fit.
  const int n = size();
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  int64_t s_at = 0, r_at = 0;
  for (int r = 0; r < n; ++r) {
    sc[r] = to_int(send_counts[r], "all_to_all");
    rc[r] = to_int(recv_counts[r], "all_to_all");
    sd[r] = to_int(s_at, "all_to_all");
    rd[r] = to_int(r_at, "all_to_all");
    s_at += send_counts[r];
    r_at += recv_counts[r];
  }
  to_int(s_at, "all_to_all");
  to_int(r_at, "all_to_all");
  check_mpi(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(),
                          MPI_FLOAT, handle_->comm),
            "all_to_all");
}

void MpiComm::do_all_reduce_max(double* buf, int64_t n) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, to_int(n, "all_reduce_max"), MPI_DOUBLE, MPI_MAX,
                          handle_->comm),
            "all_reduce_max");
}

void MpiComm::do_all_reduce_sum(double* buf, int64_t n) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, to_int(n, "all_reduce_sum"), MPI_DOUBLE, MPI_SUM,
                          handle_->comm),
            "all_reduce_sum");
}

Request MpiComm::do_iall_reduce_sum(float* buf, int64_t n) {
  MPI_Request req;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(n, "iall_reduce_sum"), MPI_FLOAT, MPI_SUM,
                           handle_->comm, &req),
            "iall_reduce_sum");
  return pending(req, "iall_reduce_sum");
}

Request MpiComm::do_ireduce_scatter_sum(const float* send, float* recv, int64_t n_per_rank) {
  int n = to_int_per_rank(n_per_rank, size(), "ireduce_scatter_sum");
  MPI_Request req;
  check_mpi(MPI_Ireduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, handle_->comm, &req),
            "ireduce_scatter_sum");
  return pending(req, "ireduce_scatter_sum");
}

// MPI_Iallgather of either element type.
static Request start_all_gather(const void* send, void* recv, int n, MPI_Datatype type,
                                MPI_Comm comm) {
  MPI_Request req;
  check_mpi(MPI_Iallgather(send, n, type, recv, n, type, comm, &req), "iall_gather");
  return pending(req, "iall_gather");
}

Request MpiComm::do_iall_gather(const float* send, float* recv, int64_t n_per_rank) {
  return start_all_gather(gather_source(send, recv, n_per_rank, rank()), recv,
                          to_int_per_rank(n_per_rank, size(), "iall_gather"), MPI_FLOAT,
                          handle_->comm);
}

Request MpiComm::do_iall_gather(const uint16_t* send, uint16_t* recv, int64_t n_per_rank) {
  return start_all_gather(gather_source(send, recv, n_per_rank, rank()), recv,
                          to_int_per_rank(n_per_rank, size(), "iall_gather"), MPI_UINT16_T,
                          handle_->comm);
}

// MPI has no 16-bit float types: the values travel as MPI_UINT16_T and these user
// operations add them (commutative: MPI may pair them in any order).
template <kernels::Half F>
static void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = F == kernels::Half::bf16
               ? kernels::to_bf16(kernels::from_bf16(a[i]) + kernels::from_bf16(b[i]))
               : kernels::to_f16(kernels::from_f16(a[i]) + kernels::from_f16(b[i]));
}

static MPI_Op sum16_op(kernels::Half f) {
  static MPI_Op ops[2] = {MPI_OP_NULL, MPI_OP_NULL};  // made on first use, after MPI_Init
  MPI_Op& op = ops[f == kernels::Half::bf16 ? 0 : 1];
  if (op == MPI_OP_NULL)
    check_mpi(MPI_Op_create(f == kernels::Half::bf16 ? &sum16<kernels::Half::bf16>
                                                     : &sum16<kernels::Half::f16>,
                            1, &op),
              "Op_create");
  return op;
}

Request MpiComm::do_iall_reduce_sum(kernels::Half f, uint16_t* buf, int64_t n) {
  MPI_Request req;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(n, "iall_reduce_sum"), MPI_UINT16_T,
                           sum16_op(f), handle_->comm, &req),
            "iall_reduce_sum");
  return pending(req, "iall_reduce_sum");
}

Request MpiComm::do_ireduce_scatter_sum(kernels::Half f, const uint16_t* send, uint16_t* recv,
                                        int64_t n_per_rank) {
  int n = to_int_per_rank(n_per_rank, size(), "ireduce_scatter_sum");
  MPI_Request req;
  check_mpi(
      MPI_Ireduce_scatter_block(send, recv, n, MPI_UINT16_T, sum16_op(f), handle_->comm, &req),
      "ireduce_scatter_sum");
  return pending(req, "ireduce_scatter_sum");
}

Request MpiComm::do_isend(const float* buf, int64_t n, int dest, int tag) {
  MPI_Request req;
  check_mpi(MPI_Isend(buf, to_int(n, "isend"), MPI_FLOAT, dest, tag, handle_->comm, &req), "isend");
  return pending(req, "isend");
}

Request MpiComm::do_irecv(float* buf, int64_t n, int src, int tag) {
  MPI_Request req;
  check_mpi(MPI_Irecv(buf, to_int(n, "irecv"), MPI_FLOAT, src, tag, handle_->comm, &req), "irecv");
  return Request(std::make_unique<MpiRecvPending>(req, n, src, tag));
}

// ---- choosing the world ----

bool started_under_mpi() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK")) return true;
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

std::unique_ptr<Communicator> make_world_communicator() {
  if (started_under_mpi()) return MpiComm::world();
  return std::make_unique<LocalComm>();
}

}  // namespace loom::dist
