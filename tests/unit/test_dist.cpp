// dist/ without MPI: LocalComm (world size 1), the byte accounting for any world size
// (through a communicator whose engine does nothing), Request's completion rules, the
// mesh's rank <-> (dp, pp, tp) arithmetic for many shapes, and the mpirun command that
// launch builds. The collectives on real processes are in tests/dist (label dist).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "loom/dist/communicator.h"
#include "loom/dist/launch.h"
#include "loom/dist/mesh.h"
#include "loom/nn/moe.h"
#include "loom/train/config.h"
#include "loom/util/error.h"

namespace loom::dist {
namespace {

using loom::test::error_of;

// Rank `rank` of a world of `size` whose engine does nothing: the accounting and the
// argument checks are Communicator's own, so they can be checked for any size.
class NullComm final : public Communicator {
 public:
  NullComm(int rank, int size) : Communicator(rank, size) {}
  std::unique_ptr<Communicator> split(int, int) const override { return nullptr; }
  [[noreturn]] void abort(int code) override { std::exit(code); }

 protected:
  void do_all_reduce_sum(float*, int64_t) override {}
  void do_reduce_scatter_sum(const float*, float*, int64_t) override {}
  void do_all_gather(const float*, float*, int64_t) override {}
  void do_broadcast(void*, int64_t, int) override {}
  void do_send(const float*, int64_t, int, int) override {}
  void do_recv(float*, int64_t, int, int) override {}
  void do_barrier() override {}
  void do_all_to_all_counts(const int64_t*, int64_t*, int64_t) override {}
  void do_all_to_all(const float*, const int64_t*, float*, const int64_t*) override {}
  void do_all_reduce_max(double*, int64_t) override {}
  void do_all_reduce_sum(double*, int64_t) override {}
  Request do_iall_reduce_sum(float*, int64_t) override { return {}; }
  Request do_ireduce_scatter_sum(const float*, float*, int64_t) override { return {}; }
  Request do_iall_gather(const float*, float*, int64_t) override { return {}; }
  Request do_iall_gather(const uint16_t*, uint16_t*, int64_t) override { return {}; }
  Request do_iall_reduce_sum(kernels::Half, uint16_t*, int64_t) override { return {}; }
  Request do_ireduce_scatter_sum(kernels::Half, const uint16_t*, uint16_t*, int64_t) override {
    return {};
  }
  Request do_isend(const float*, int64_t, int, int) override { return {}; }
  Request do_irecv(float*, int64_t, int, int) override { return {}; }
};

TEST(DistLocalComm, CollectivesOnOneRankAreCopies) {
  LocalComm c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  std::vector<float> a = {1, 2, 3}, b(3, 0.0f);
  c.all_reduce_sum(a.data(), 3);
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  c.reduce_scatter_sum(a.data(), b.data(), 3);
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.0f);
  c.all_gather(a.data(), b.data(), 3);
  EXPECT_EQ(b, a);
  c.all_gather(b.data(), b.data(), 3);  // in place
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.0f);
  c.ireduce_scatter_sum(a.data(), b.data(), 3).wait();
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.0f);
  Request r = c.iall_gather(a.data(), b.data(), 3);
  EXPECT_TRUE(r.test());
  EXPECT_EQ(b, a);
  EXPECT_TRUE(c.iall_reduce_sum(a.data(), 3).test());
  double x = 2.5, s[2] = {1.0, -1.0};
  c.all_reduce_max(&x);
  c.all_reduce_sum(s, 2);
  EXPECT_EQ(x, 2.5);
  EXPECT_EQ(s[1], -1.0);
  c.broadcast(a.data(), 12, 0);
  c.barrier();
  // Every call is counted; one rank sends nothing.
  EXPECT_EQ(c.stats().collectives, 11);
  EXPECT_EQ(c.stats().bytes_sent, 0);
  c.reset_stats();
  EXPECT_EQ(c.stats().collectives, 0);
}

TEST(DistLocalComm, ErrorsNameTheOperation) {
  LocalComm c;
  float f = 0;
  EXPECT_EQ(error_of([&] { c.all_reduce_sum(&f, -1); }), "all_reduce_sum: negative count -1");
  EXPECT_EQ(error_of([&] { c.broadcast(&f, 4, 1); }),
            "broadcast: root 1 is not a rank of a communicator of size 1");
  EXPECT_EQ(error_of([&] { c.send(&f, 1, 0, 0); }),
            "send: a communicator of size 1 has no other rank to send to");
  EXPECT_EQ(error_of([&] { c.recv(&f, 1, 0, -2); }), "recv: negative tag -2");
  EXPECT_EQ(error_of([&] { c.isend(&f, 1, 0, 0); }),
            "isend: a communicator of size 1 has no other rank to send to");
  EXPECT_EQ(error_of([&] { c.irecv(&f, 1, 1, 0); }),
            "irecv: source 1 is not a rank of a communicator of size 1");
  EXPECT_EQ(error_of([&] { c.split(-1, 0); }), "split: negative color -1");
  EXPECT_EQ(c.stats().collectives, 0);  // calls that threw are not counted
  auto sub = c.split(3, 7);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
}

TEST(DistLocalComm, WorldWithoutMpirunIsLocal) {
  if (started_under_mpi()) GTEST_SKIP() << "running under mpirun";
  auto world = make_world_communicator();
  EXPECT_NE(dynamic_cast<LocalComm*>(world.get()), nullptr);
}

TEST(DistCommStats, RingVolumesForAnyWorldSize) {
  for (int N = 1; N <= 8; ++N) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000003}}) {
      NullComm c(N - 1, N);
      auto bytes = [&](auto call) {
        c.reset_stats();
        call();
        EXPECT_EQ(c.stats().collectives, 1);
        return c.stats().bytes_sent;
      };
      const int64_t ring = (N - 1) * 4 * n;
      EXPECT_EQ(bytes([&] { c.all_reduce_sum(static_cast<float*>(nullptr), n); }),
                2 * (N - 1) * 4 * n / N);
      EXPECT_EQ(bytes([&] { c.iall_reduce_sum(nullptr, n); }), 2 * (N - 1) * 4 * n / N);
      EXPECT_EQ(bytes([&] { c.reduce_scatter_sum(nullptr, nullptr, n); }), ring);
      EXPECT_EQ(bytes([&] { c.ireduce_scatter_sum(nullptr, nullptr, n); }), ring);
      EXPECT_EQ(bytes([&] { c.all_gather(nullptr, nullptr, n); }), ring);
      const float* none = nullptr;
      EXPECT_EQ(bytes([&] { c.iall_gather(none, nullptr, n); }), ring);
      const uint16_t* none16 = nullptr;  // 16-bit payloads count 2 bytes an element
      EXPECT_EQ(bytes([&] { c.iall_gather(none16, nullptr, n); }), (N - 1) * 2 * n);
      EXPECT_EQ(bytes([&] { c.broadcast(nullptr, n, 0); }), (N - 1) * n / N);
      EXPECT_EQ(bytes([&] { c.all_reduce_sum(static_cast<double*>(nullptr), n); }),
                2 * (N - 1) * 8 * n / N);
      EXPECT_EQ(bytes([&] { c.all_reduce_max(nullptr); }), 2 * (N - 1) * 8 / N);
      EXPECT_EQ(bytes([&] { c.send(nullptr, n, 0, 0); }), 4 * n);
      EXPECT_EQ(bytes([&] { c.recv(nullptr, n, 0, 0); }), 0);
      EXPECT_EQ(bytes([&] { c.isend(nullptr, n, 0, 0); }), 4 * n);
      EXPECT_EQ(bytes([&] { c.irecv(nullptr, n, 0, 0); }), 0);
      EXPECT_EQ(bytes([&] { c.barrier(); }), 0);
    }
  }
  // The ZeRO paper's accounting: reduce-scatter + all-gather moves what one all-reduce does.
  NullComm c(0, 4);
  c.reduce_scatter_sum(nullptr, nullptr, 250);
  c.all_gather(nullptr, nullptr, 250);
  const int64_t split_bytes = c.stats().bytes_sent;
  c.reset_stats();
  c.all_reduce_sum(static_cast<float*>(nullptr), 1000);
  EXPECT_EQ(c.stats().bytes_sent, split_bytes);
}

// A pending operation that completes on the second test() or on wait().
struct FakePending : Request::Pending {
  int* waits;
  int tests = 0;
  explicit FakePending(int* w) : waits(w) {}
  void wait() override { ++*waits; }
  bool test() override { return ++tests >= 2; }
};

TEST(DistRequest, WaitTestMoveAndDestroy) {
  Request none;
  none.wait();
  EXPECT_TRUE(none.test());

  int waits = 0;
  Request r(std::make_unique<FakePending>(&waits));
  EXPECT_FALSE(r.test());
  EXPECT_TRUE(r.test());
  r.wait();  // already complete: the engine is not asked again
  EXPECT_EQ(waits, 0);

  {
    Request pending(std::make_unique<FakePending>(&waits));
    Request moved = std::move(pending);
    pending.wait();  // moved-from: nothing to wait for
    EXPECT_EQ(waits, 0);
  }
  EXPECT_EQ(waits, 1);  // destroying a pending request waits for it

  Request a(std::make_unique<FakePending>(&waits));
  a = Request(std::make_unique<FakePending>(&waits));  // the overwritten one is waited for
  EXPECT_EQ(waits, 2);
  a.wait();
  a.wait();
  EXPECT_EQ(waits, 3);
}

TEST(DistMesh, MegatronOrderTpFastest) {
  MeshShape s = mesh_shape(8, /*tp=*/2, /*pp=*/2);
  EXPECT_EQ(s.dp, 2);
  EXPECT_EQ(s.pp, 2);
  EXPECT_EQ(s.tp, 2);
  EXPECT_EQ(mesh_coord(5, s), (MeshCoord{1, 0, 1}));
  EXPECT_EQ(mesh_rank(MeshCoord{1, 1, 0}, s), 6);
  EXPECT_EQ(mesh_group(MeshAxis::tp, 5, s), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh_group(MeshAxis::pp, 5, s), (std::vector<int>{5, 7}));
  EXPECT_EQ(mesh_group(MeshAxis::dp, 5, s), (std::vector<int>{1, 5}));
}

TEST(DistMesh, CoordinatesAndGroupsForManyShapes) {
  for (int world : {1, 2, 3, 4, 6, 8, 12, 16, 24}) {
    for (int tp = 1; tp <= world; ++tp) {
      for (int pp = 1; tp * pp <= world; ++pp) {
        if (world % (tp * pp) != 0) continue;
        MeshShape s = mesh_shape(world, tp, pp);
        ASSERT_EQ(s.world(), world);
        for (int r = 0; r < world; ++r) {
          MeshCoord c = mesh_coord(r, s);
          ASSERT_EQ(mesh_rank(c, s), r);
          ASSERT_EQ(r, (c.dp * pp + c.pp) * tp + c.tp);
        }
        for (MeshAxis axis : {MeshAxis::dp, MeshAxis::pp, MeshAxis::tp}) {
          // The groups along an axis partition the world; members differ only along it, and
          // member i has coordinate i there.
          std::set<int> seen;
          for (int r = 0; r < world; ++r) {
            std::vector<int> g = mesh_group(axis, r, s);
            ASSERT_NE(std::find(g.begin(), g.end(), r), g.end());
            ASSERT_EQ(mesh_group(axis, g.front(), s), g);
            if (r != g.front()) continue;
            for (int i = 0; i < static_cast<int>(g.size()); ++i) {
              MeshCoord a = mesh_coord(g[i], s), b = mesh_coord(g.front(), s);
              int& ai = axis == MeshAxis::dp ? a.dp : axis == MeshAxis::pp ? a.pp : a.tp;
              int& bi = axis == MeshAxis::dp ? b.dp : axis == MeshAxis::pp ? b.pp : b.tp;
              ASSERT_EQ(ai, i);
              bi = i;
              ASSERT_EQ(a, b);
              ASSERT_TRUE(seen.insert(g[i]).second);
            }
          }
          ASSERT_EQ(static_cast<int>(seen.size()), world);
        }
      }
    }
  }
}

TEST(DistMesh, SizesThatDoNotDivideAreErrors) {
  EXPECT_EQ(error_of([] { mesh_shape(6, 4, 1); }),
            "mesh: world size 6 is not divisible by tp=4 x pp=1");
  EXPECT_EQ(error_of([] { mesh_shape(8, 2, 0); }), "mesh: tp and pp must be >= 1, got tp=2 pp=0");
  EXPECT_EQ(error_of([] {
              mesh_coord(4, MeshShape{2, 1, 2});
            }),
            "mesh: rank 4 is outside dp=2 pp=1 tp=2");
  EXPECT_EQ(error_of([] {
              mesh_rank(MeshCoord{0, 1, 0}, MeshShape{2, 1, 2});
            }),
            "mesh: coordinate (dp=0, pp=1, tp=0) is outside dp=2 pp=1 tp=2");
  LocalComm world;
  EXPECT_EQ(error_of([&] { ProcessMesh(world, 2, 1); }),
            "mesh: world size 1 is not divisible by tp=2 x pp=1");
}

TEST(DistMesh, OneProcess) {
  LocalComm world;
  ProcessMesh mesh(world, 1, 1);
  EXPECT_EQ(mesh.coord(), (MeshCoord{0, 0, 0}));
  EXPECT_EQ(mesh.dp().size(), 1);
  EXPECT_EQ(mesh.pp().size(), 1);
  EXPECT_EQ(mesh.tp().size(), 1);
}

TEST(DistLaunch, MpirunCommand) {
  LaunchHost host{/*cores=*/16, /*root=*/false, /*omp_num_threads_set=*/false,
                  /*omp_wait_policy_set=*/false};
  EXPECT_EQ(mpirun_command(4, {"train", "c.json"}, "/bin/loom", "", host),
            (std::vector<std::string>{"mpirun", "-np", "4", "--bind-to", "none", "-x",
                                      "OMP_NUM_THREADS=4", "-x", "OMP_WAIT_POLICY=PASSIVE",
                                      "/bin/loom", "train", "c.json"}));
  // More ranks than cores, as root, the user's own thread settings.
  host = LaunchHost{2, true, true, true};
  EXPECT_EQ(mpirun_command(3, {"x"}, "/bin/loom", "", host),
            (std::vector<std::string>{"mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none",
                                      "--allow-run-as-root", "-x", "OMP_NUM_THREADS", "-x",
                                      "OMP_WAIT_POLICY", "/bin/loom", "x"}));
  // A hostfile decides placement; local cores say nothing about the other hosts.
  host = LaunchHost{2, false, false, false};
  EXPECT_EQ(mpirun_command(8, {}, "/bin/loom", "hosts.txt", host),
            (std::vector<std::string>{"mpirun", "-np", "8", "--hostfile", "hosts.txt", "--bind-to",
                                      "none", "-x", "OMP_WAIT_POLICY=PASSIVE", "/bin/loom"}));
  EXPECT_EQ(error_of([&] { mpirun_command(0, {}, "/bin/loom", "", host); }),
            "launch: the number of processes must be >= 1, got 0");
}

TEST(DistLaunch, MissingMpirunOrHostfile) {
  loom::test::TempDir empty;
  std::string old_path = getenv("PATH") ? getenv("PATH") : "";
  setenv("PATH", empty.path.c_str(), 1);
  std::string err = error_of([] { launch(2, {}, "/bin/true"); });
  setenv("PATH", old_path.c_str(), 1);
  EXPECT_NE(err.find("launch: mpirun not found on PATH"), std::string::npos) << err;
  EXPECT_EQ(error_of([&] { launch(2, {}, "/bin/true", (empty.path / "hosts").string()); }),
            "launch: hostfile " + (empty.path / "hosts").string() + " does not exist");
}

TEST(DistAllToAll, CountsTheRowsSentToOtherRanks) {
  NullComm c(1, 3);
  std::vector<float> send(10), recv(10);
  const int64_t sc[3] = {2, 5, 3}, rc[3] = {4, 5, 1};
  c.all_to_all(send.data(), sc, recv.data(), rc);
  EXPECT_EQ(c.stats().bytes_sent, (2 + 3) * 4);  // not the 5 kept by rank 1
  int64_t a[6] = {}, b[6] = {};
  c.all_to_all_counts(a, b, 2);
  EXPECT_EQ(c.stats().bytes_sent, 5 * 4 + 2 * 2 * 8);
  const int64_t bad[3] = {1, -1, 0};
  EXPECT_NE(error_of([&] { c.all_to_all(send.data(), bad, recv.data(), rc); }).find("all_to_all"),
            std::string::npos);
}

TEST(DistExpertParallel, SizeMustDivideTheExpertsAndTheDataParallelRanks) {
  NullComm three(0, 3);
  nn::ParamStore ps;
  nn::MoeSpec s;
  s.hidden = 4;
  s.inter = 2;
  s.router = {.hidden = 4, .n_experts = 8, .top_k = 2};
  s.ep_size = 3;
  EXPECT_EQ(error_of([&] { nn::MoE(ps, "model.layers.1.mlp", s, 0.02f); }),
            "expert_parallel.size 3 does not divide n_routed_experts 8");
  // A layer declared whole does not run as one rank's slice.
  s.ep_size = 1;
  nn::MoE moe(ps, "model.layers.1.mlp", s, 0.02f);
  EXPECT_NE(error_of([&] { moe.set_expert_parallel({&three}); }).find("internal"),
            std::string::npos);
  const nlohmann::json j = {{"model", {{"arch", "gpt2"}}},
                            {"data", {{"path", "x.jsonl"}}},
                            {"train_micro_batch_size_per_gpu", 1},
                            {"expert_parallel", {{"size", 3}}}};
  EXPECT_NE(error_of([&] {
              train::parse_config(j, "c.json", 4);
            }).find("expert_parallel.size' 3 does not divide the world size 4"),
            std::string::npos)
      << error_of([&] { train::parse_config(j, "c.json", 4); });
}

}  // namespace
}  // namespace loom::dist
