// The body of main() for a GoogleTest binary run under mpirun: every rank runs every test,
// only rank 0 prints, and the job fails when any rank's tests failed.
#pragma once

#include <gtest/gtest.h>

#include "loom/dist/communicator.h"

namespace loom::test {

inline int run_tests_on_every_rank(int argc, char** argv, dist::Communicator& world) {
  ::testing::InitGoogleTest(&argc, argv);
  if (world.rank() != 0) {  // one rank reports; the others' failures still fail the job
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  double worst = RUN_ALL_TESTS();
  world.all_reduce_max(&worst);
  return worst != 0 ? 1 : 0;
}

}  // namespace loom::test
