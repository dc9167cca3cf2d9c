// The body of main() for a GoogleTest binary run under mpirun: every rank runs every test,
// rank 0 prints the run, the other ranks only their failed assertions (tagged with the rank),
// and the job fails when any rank's tests failed.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

#include "loom/dist/communicator.h"

namespace loom::test {

// A non-zero rank's failures: "rank 2: file:line: message".
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }

 private:
  int rank_;
};

inline int run_tests_on_every_rank(int argc, char** argv, dist::Communicator& world) {
  ::testing::InitGoogleTest(&argc, argv);
  if (world.rank() != 0) {  // one rank reports; the others' failures still fail the job
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(world.rank()));
  }
  double worst = RUN_ALL_TESTS();
  world.all_reduce_max(&worst);
  return worst != 0 ? 1 : 0;
}

}  // namespace loom::test
