// Multi-process checks of dist::MpiComm and dist::ProcessMesh, run by ctest under mpirun
// (label dist). Every rank computes locally what each collective must produce from
// rank-dependent inputs and compares exactly (the inputs are multiples of 1/4 below 16, so
// sums are exact in f32 whatever the reduction order). A failed check prints the rank and
// the check; the exit status is non-zero when any rank saw one.
//   test_collectives             every collective, split, the mesh, the byte accounting
//   test_collectives die-kill    rank 1 SIGKILLs itself while the others wait in all_reduce
//   test_collectives die-abort   rank 1 calls std::abort() there instead
//   test_collectives comm-abort  rank 1 calls Communicator::abort(3) there instead
//   test_collectives launch N    not under mpirun: runs itself on N ranks via dist::launch
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "loom/dist/communicator.h"
#include "loom/dist/launch.h"
#include "loom/dist/mesh.h"
#include "loom/util/error.h"

namespace {

using loom::dist::CommStats;
using loom::dist::Communicator;
using loom::dist::MeshAxis;
using loom::dist::ProcessMesh;
using loom::dist::Request;

// Sizes that are multiples of nothing in particular, and the empty buffer.
const int64_t kSizes[] = {0, 1, 7, 1000003};

float value(int rank, int64_t i, int seed) {
  return static_cast<float>((rank * 7 + seed * 13 + i % 101) % 64) * 0.25f;
}

std::vector<float> values(int rank, int64_t n, int seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(rank, i, seed);
  return v;
}

class Checker {
 public:
  explicit Checker(Communicator& world) : world_(world) {}

  void expect(bool ok, const std::string& what) {
    ++checks_;
    if (ok) return;
    ++failures_;
    std::fprintf(stderr, "rank %d: FAILED %s\n", world_.rank(), what.c_str());
  }

  void expect_equal(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
    if (got.size() != want.size()) {
      expect(false,
             what + ": size " + std::to_string(got.size()) + " vs " + std::to_string(want.size()));
      return;
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i]) {
        expect(false, what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                          ", expected " + std::to_string(want[i]));
        return;
      }
    }
    expect(true, what);
  }

  // The stats delta of `comm` over fn() against the ring formula.
  void expect_bytes(Communicator& comm, int64_t bytes, const std::string& what,
                    const std::function<void()>& fn) {
    CommStats before = comm.stats();
    fn();
    CommStats after = comm.stats();
    expect(after.bytes_sent - before.bytes_sent == bytes,
           what + ": bytes_sent grew by " + std::to_string(after.bytes_sent - before.bytes_sent) +
               ", expected " + std::to_string(bytes));
    expect(after.collectives - before.collectives == 1,
           what + ": collectives grew by " +
               std::to_string(after.collectives - before.collectives) + ", expected 1");
  }

  void expect_error(const std::function<void()>& fn, const std::string& needle,
                    const std::string& what) {
    std::string msg = "<no error>";
    try {
      fn();
    } catch (const loom::Error& e) {
      msg = e.what();
    }
    expect(msg.find(needle) != std::string::npos,
           what + ": error \"" + msg + "\" does not mention \"" + needle + "\"");
  }

  int failures() const { return failures_; }
  int checks() const { return checks_; }

 private:
  Communicator& world_;
  int failures_ = 0;
  int checks_ = 0;
};

std::string at(const char* op, int64_t n) { return std::string(op) + " n=" + std::to_string(n); }

void check_reductions(Communicator& c, Checker& ck) {
  const int N = c.size(), r = c.rank();
  for (int64_t n : kSizes) {
    std::vector<float> want(static_cast<size_t>(n), 0.0f);
    for (int q = 0; q < N; ++q)
      for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] += value(q, i, 1);
    const int64_t bytes = 2 * (N - 1) * 4 * n / N;

    std::vector<float> buf = values(r, n, 1);
    ck.expect_bytes(c, bytes, at("all_reduce_sum", n), [&] { c.all_reduce_sum(buf.data(), n); });
    ck.expect_equal(buf, want, at("all_reduce_sum", n));

    buf = values(r, n, 1);
    Request req;
    ck.expect_bytes(c, bytes, at("iall_reduce_sum", n),
                    [&] { req = c.iall_reduce_sum(buf.data(), n); });
    while (!req.test()) {
    }
    req.wait();  // completed already: a no-op
    ck.expect_equal(buf, want, at("iall_reduce_sum (test loop)", n));
  }
}

void check_reduce_scatter(Communicator& c, Checker& ck) {
  const int N = c.size(), r = c.rank();
  for (int64_t n : kSizes) {
    std::vector<float> send = values(r, N * n, 2);
    std::vector<float> want(static_cast<size_t>(n), 0.0f);
    for (int q = 0; q < N; ++q)
      for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] += value(q, r * n + i, 2);
    const int64_t bytes = (N - 1) * 4 * n;

    std::vector<float> recv(static_cast<size_t>(n), -1.0f);
    ck.expect_bytes(c, bytes, at("reduce_scatter_sum", n),
                    [&] { c.reduce_scatter_sum(send.data(), recv.data(), n); });
    ck.expect_equal(recv, want, at("reduce_scatter_sum", n));

    std::fill(recv.begin(), recv.end(), -1.0f);
    Request req;
    ck.expect_bytes(c, bytes, at("ireduce_scatter_sum", n),
                    [&] { req = c.ireduce_scatter_sum(send.data(), recv.data(), n); });
    req.wait();
    ck.expect_equal(recv, want, at("ireduce_scatter_sum", n));
  }
}

// 16-bit payloads (mixed precision): the gather moves bits; the sums add pairs in fp32 and
// round each to the format. Values that are small multiples of 1/8 sum exactly in either
// format whatever the order, so the result is known: the exact sum, rounded once. A second
// case checks that the sum is rounded at all: 1 + N * 2^-10 is not a bf16 value (rounds
// to 1 pair by pair) while fp16 holds it.
void check_sixteen_bit(Communicator& c, Checker& ck) {
  const int N = c.size(), r = c.rank();
  for (loom::kernels::Half f : {loom::kernels::Half::bf16, loom::kernels::Half::f16}) {
    const std::string fmt = loom::kernels::half_name(f);
    auto h = [&](float x) {
      return f == loom::kernels::Half::bf16 ? loom::kernels::to_bf16(x) : loom::kernels::to_f16(x);
    };
    auto w = [&](uint16_t x) {
      return f == loom::kernels::Half::bf16 ? loom::kernels::from_bf16(x)
                                            : loom::kernels::from_f16(x);
    };
    auto v = [](int q, int64_t i) { return static_cast<float>((q + 1) * (i % 7 + 1)) / 8.0f; };
    for (int64_t n : kSizes) {
      std::vector<uint16_t> buf(static_cast<size_t>(N * n)), mine(static_cast<size_t>(n));
      std::vector<float> want(static_cast<size_t>(N * n)), got(static_cast<size_t>(N * n));
      for (int64_t i = 0; i < N * n; ++i) {
        buf[i] = h(v(r, i));
        float sum = 0;
        for (int q = 0; q < N; ++q) sum += v(q, i);
        want[i] = w(h(sum));
      }
      ck.expect_bytes(c, 2 * (N - 1) * 2 * N * n / N, at("iall_reduce_sum 16-bit", n),
                      [&] { c.iall_reduce_sum(f, buf.data(), N * n).wait(); });
      for (int64_t i = 0; i < N * n; ++i) got[i] = w(buf[i]);
      ck.expect_equal(got, want, fmt + " " + at("iall_reduce_sum", n));

      for (int64_t i = 0; i < N * n; ++i) buf[i] = h(v(r, i));
      ck.expect_bytes(c, (N - 1) * 2 * n, at("ireduce_scatter_sum 16-bit", n),
                      [&] { c.ireduce_scatter_sum(f, buf.data(), mine.data(), n).wait(); });
      std::vector<float> part(want.begin() + r * n, want.begin() + (r + 1) * n), gotp(n);
      for (int64_t i = 0; i < n; ++i) gotp[i] = w(mine[i]);
      ck.expect_equal(gotp, part, fmt + " " + at("ireduce_scatter_sum", n));

      for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<uint16_t>(r * 7919 + i);
      ck.expect_bytes(c, (N - 1) * 2 * n, at("iall_gather 16-bit", n),
                      [&] { c.iall_gather(mine.data(), buf.data(), n).wait(); });
      bool same = true;
      for (int q = 0; q < N; ++q)
        for (int64_t i = 0; i < n; ++i)
          same &= buf[q * n + i] == static_cast<uint16_t>(q * 7919 + i);
      ck.expect(same, fmt + " " + at("iall_gather 16-bit bits", n));
    }
    uint16_t x = h(r == 0 ? 1.0f : 0x1p-10f);
    c.iall_reduce_sum(f, &x, 1).wait();
    const float exact = 1.0f + (N - 1) * 0x1p-10f;
    const float expect = f == loom::kernels::Half::bf16 ? 1.0f : exact;
    ck.expect(N == 1 || w(x) == expect, fmt + " sum of 1 and 2^-10s: got " + std::to_string(w(x)));
  }
}

void check_all_gather(Communicator& c, Checker& ck) {
  const int N = c.size(), r = c.rank();
  for (int64_t n : kSizes) {
    std::vector<float> want;
    for (int q = 0; q < N; ++q) {
      std::vector<float> chunk = values(q, n, 3);
      want.insert(want.end(), chunk.begin(), chunk.end());
    }
    const int64_t bytes = (N - 1) * 4 * n;
    std::vector<float> send = values(r, n, 3);
    const size_t total = static_cast<size_t>(N * n);

    std::vector<float> recv(total, -1.0f);
    ck.expect_bytes(c, bytes, at("all_gather", n),
                    [&] { c.all_gather(send.data(), recv.data(), n); });
    ck.expect_equal(recv, want, at("all_gather", n));

    std::fill(recv.begin(), recv.end(), -1.0f);
    Request req;
    ck.expect_bytes(c, bytes, at("iall_gather", n),
                    [&] { req = c.iall_gather(send.data(), recv.data(), n); });
    req.wait();
    ck.expect_equal(recv, want, at("iall_gather", n));

    // In place, as ZeRO gathers: this rank's slice is already in the full buffer.
    std::vector<float> full(total, -1.0f);
    std::copy(send.begin(), send.end(), full.begin() + r * n);
    c.all_gather(full.data() + r * n, full.data(), n);
    ck.expect_equal(full, want, at("all_gather in place", n));

    std::fill(full.begin(), full.end(), -1.0f);
    std::copy(send.begin(), send.end(), full.begin() + r * n);
    c.iall_gather(full.data() + r * n, full.data(), n).wait();
    ck.expect_equal(full, want, at("iall_gather in place", n));
  }
}

void check_broadcast_and_scalars(Communicator& c, Checker& ck) {
  const int N = c.size(), r = c.rank();
  for (int root : {0, N - 1}) {
    for (int64_t n : kSizes) {
      std::vector<float> buf = r == root ? values(root, n, 4) : std::vector<float>(n, -1.0f);
      const int64_t bytes = 4 * n;
      ck.expect_bytes(c, (N - 1) * bytes / N, at("broadcast", n),
                      [&] { c.broadcast(buf.data(), bytes, root); });
      ck.expect_equal(buf, values(root, n, 4),
                      at("broadcast", n) + " root " + std::to_string(root));
    }
  }
  char text[13] = "not the root";
  if (r == N - 1) std::memcpy(text, "sent by root", sizeof(text));
  c.broadcast(text, sizeof(text), N - 1);
  ck.expect(std::string(text) == "sent by root",
            std::string("broadcast of 13 bytes: got \"") + text + "\"");

  double mx = 1.5 * r - 3.0;
  ck.expect_bytes(c, 2 * (N - 1) * 8 / N, "all_reduce_max", [&] { c.all_reduce_max(&mx); });
  ck.expect(mx == 1.5 * (N - 1) - 3.0, "all_reduce_max: got " + std::to_string(mx));

  double sums[3] = {1.0 * r, 0.125, -2.0 * r * r};
  double want[3] = {0, 0, 0};
  for (int q = 0; q < N; ++q) {
    want[0] += q;
    want[1] += 0.125;
    want[2] -= 2.0 * q * q;
  }
  ck.expect_bytes(c, 2 * (N - 1) * 24 / N, "all_reduce_sum(double)",
                  [&] { c.all_reduce_sum(sums, 3); });
  for (int i = 0; i < 3; ++i)
    ck.expect(sums[i] == want[i], "all_reduce_sum(double) [" + std::to_string(i) + "]: got " +
                                      std::to_string(sums[i]) + ", expected " +
                                      std::to_string(want[i]));

  ck.expect_bytes(c, 0, "barrier", [&] { c.barrier(); });
}

// Rank 0 sends each peer its buffer (tag 100 + peer); the peer answers with each value + 1.
void check_send_recv(Communicator& c, Checker& ck) {
  const int N = c.size(), r = c.rank();
  for (int64_t n : {int64_t{7}, int64_t{1000003}}) {
    if (r == 0) {
      for (int q = 1; q < N; ++q) {
        std::vector<float> out = values(q, n, 5);
        ck.expect_bytes(c, 4 * n, at("send", n), [&] { c.send(out.data(), n, q, 100 + q); });
        std::vector<float> back(static_cast<size_t>(n));
        ck.expect_bytes(c, 0, at("recv", n), [&] { c.recv(back.data(), n, q, 200 + q); });
        for (float& x : out) x += 1.0f;
        ck.expect_equal(back, out,
                        at("send/recv round trip", n) + " with rank " + std::to_string(q));
      }
    } else {
      std::vector<float> in(static_cast<size_t>(n));
      c.recv(in.data(), n, 0, 100 + r);
      ck.expect_equal(in, values(r, n, 5), at("recv from rank 0", n));
      for (float& x : in) x += 1.0f;
      c.send(in.data(), n, 0, 200 + r);
    }
  }
  // Errors of the engine become loom::Error naming the call: a message longer than the
  // receive buffer is MPI_ERR_TRUNCATE; a shorter one is caught by recv itself.
  if (N < 2) return;
  if (r == 0) {
    std::vector<float> eight(8, 1.0f);
    c.send(eight.data(), 8, 1, 7);
    c.send(eight.data(), 5, 1, 8);
  } else if (r == 1) {
    std::vector<float> seven(7);
    ck.expect_error([&] { c.recv(seven.data(), 7, 0, 7); }, "MPI recv failed",
                    "recv of a longer message");
    ck.expect_error([&] { c.recv(seven.data(), 7, 0, 8); }, "expected 7 floats from rank 0",
                    "recv of a shorter message");
  }
  c.barrier();
}

void check_argument_errors(Communicator& c, Checker& ck) {
  const int N = c.size();
  CommStats before = c.stats();
  const int64_t too_big = int64_t{std::numeric_limits<int>::max()} + 1;
  ck.expect_error([&] { c.all_reduce_sum(static_cast<float*>(nullptr), too_big); },
                  "MPI all_reduce_sum: count 2147483648 exceeds MPI's int limit",
                  "all_reduce_sum over the int limit");
  ck.expect_error([&] { c.all_gather(nullptr, nullptr, std::numeric_limits<int>::max() / N + 1); },
                  "MPI all_gather: " + std::to_string(N) + " x", "all_gather over the int limit");
  ck.expect_error([&] { c.broadcast(nullptr, 4, N); }, "broadcast: root " + std::to_string(N),
                  "broadcast from a rank outside");
  ck.expect_error([&] { c.iall_reduce_sum(nullptr, -1); }, "iall_reduce_sum: negative count",
                  "negative count");
  CommStats after = c.stats();
  ck.expect(after.bytes_sent == before.bytes_sent && after.collectives == before.collectives,
            "calls that threw are not counted");
  c.reset_stats();
  ck.expect(c.stats().bytes_sent == 0 && c.stats().collectives == 0, "reset_stats");
}

// The world ranks of `comm`'s members, in its rank order, gathered over it.
std::vector<float> members(Communicator& comm, int world_rank) {
  float me = static_cast<float>(world_rank);
  std::vector<float> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&me, all.data(), 1);
  return all;
}

void check_split(Communicator& world, Checker& ck) {
  const int N = world.size(), r = world.rank();
  // Odd and even ranks, each group in descending rank order (key -rank).
  auto sub = world.split(r % 2, -r);
  std::vector<float> want;
  for (int q = N - 1; q >= 0; --q)
    if (q % 2 == r % 2) want.push_back(static_cast<float>(q));
  ck.expect(sub->size() == static_cast<int>(want.size()), "split: size");
  ck.expect_equal(members(*sub, r), want, "split(rank % 2, -rank): members");
  float x = static_cast<float>(r);
  sub->all_reduce_sum(&x, 1);
  float sum = 0;
  for (float q : want) sum += q;
  ck.expect(x == sum, "split: all_reduce_sum over the group");
  ck.expect(sub->stats().collectives == 2 && world.stats().collectives == 0,
            "split: each communicator counts its own calls");
}

void check_mesh(Communicator& world, Checker& ck) {
  const int N = world.size(), r = world.rank();
  for (int tp = 1; tp <= N; ++tp) {
    for (int pp = 1; tp * pp <= N; ++pp) {
      if (N % (tp * pp) != 0) continue;
      ProcessMesh mesh(world, tp, pp);
      std::string name = "mesh dp" + std::to_string(N / (tp * pp)) + " pp" + std::to_string(pp) +
                         " tp" + std::to_string(tp);
      ck.expect(mesh.coord() == loom::dist::mesh_coord(r, mesh.shape()), name + ": coordinates");
      struct {
        MeshAxis axis;
        Communicator& comm;
        int coord;
        const char* what;
      } groups[] = {{MeshAxis::dp, mesh.dp(), mesh.dp_rank(), "dp"},
                    {MeshAxis::pp, mesh.pp(), mesh.pp_rank(), "pp"},
                    {MeshAxis::tp, mesh.tp(), mesh.tp_rank(), "tp"}};
      for (auto& g : groups) {
        std::vector<float> want;
        for (int q : loom::dist::mesh_group(g.axis, r, mesh.shape()))
          want.push_back(static_cast<float>(q));
        ck.expect(g.comm.rank() == g.coord, name + ": " + g.what + " rank");
        ck.expect_equal(members(g.comm, r), want, name + ": " + g.what + " group members");
      }
    }
  }
  ck.expect_error(
      [&] { ProcessMesh(world, N + 1, 1); },
      "world size " + std::to_string(N) + " is not divisible by tp=" + std::to_string(N + 1),
      "mesh with tp that does not divide the world");
}

int run_checks(Communicator& world) {
  Checker ck(world);
  check_reductions(world, ck);
  check_reduce_scatter(world, ck);
  check_all_gather(world, ck);
  check_sixteen_bit(world, ck);
  check_broadcast_and_scalars(world, ck);
  check_send_recv(world, ck);
  check_argument_errors(world, ck);
  check_split(world, ck);
  check_mesh(world, ck);

  double failed = ck.failures();
  world.all_reduce_sum(&failed, 1);
  if (world.rank() == 0)
    std::printf("%s: %d checks per rank on %d ranks, %d failed\n", failed == 0 ? "PASS" : "FAIL",
                ck.checks(), world.size(), static_cast<int>(failed));
  return failed == 0 ? 0 : 1;
}

// Rank 1 dies as `mode` says while every other rank waits for it in an all_reduce.
int die(Communicator& world, const std::string& mode) {
  if (world.size() < 2) {
    std::fprintf(stderr, "%s needs at least 2 ranks\n", mode.c_str());
    return 2;
  }
  world.barrier();
  if (world.rank() == 1) {
    std::fprintf(stderr, "rank 1: dying (%s)\n", mode.c_str());
    if (mode == "die-kill") std::raise(SIGKILL);
    if (mode == "die-abort") std::abort();
    world.abort(3);
  }
  std::vector<float> buf(1000003, 1.0f);
  std::fprintf(stderr, "rank %d: waiting in all_reduce_sum\n", world.rank());
  world.all_reduce_sum(buf.data(), static_cast<int64_t>(buf.size()));
  std::fprintf(stderr, "rank %d: all_reduce_sum returned without rank 1\n", world.rank());
  return 0;  // the wrapper fails the test on exit status 0
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "launch") {
    if (argc != 3) return 2;
    std::string self = std::filesystem::read_symlink("/proc/self/exe");
    return loom::dist::launch(std::atoi(argv[2]), {}, self);
  }
  if (!loom::dist::started_under_mpi()) {
    std::fprintf(stderr, "run under mpirun (or as: test_collectives launch N)\n");
    return 2;
  }
  auto world = loom::dist::MpiComm::world();
  try {
    if (mode.empty()) return run_checks(*world);
    if (mode == "die-kill" || mode == "die-abort" || mode == "comm-abort") return die(*world, mode);
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const loom::Error& e) {
    // The other ranks may be waiting in a collective with this one.
    std::fprintf(stderr, "rank %d: error: %s\n", world->rank(), e.what());
    world->abort(1);
  }
}
