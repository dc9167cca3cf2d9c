// The vectorisable exp/tanh against libm over their working range.
#include <gtest/gtest.h>

#include <cmath>

#include "loom/kernels/cpu/vec_math.h"

namespace loom {
namespace {

TEST(VecMath, ExpMatchesLibm) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.001953125f) {
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(kernels::vexp(x) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_LT(kernels::vexp(-INFINITY), 1e-37f);
  EXPECT_EQ(kernels::vexp(0.0f), 1.0f);
}

TEST(VecMath, TanhMatchesLibm) {
  double worst = 0;
  for (float x = -20.0f; x <= 20.0f; x += 0.0009765625f)
    worst = std::max(worst, std::fabs(kernels::vtanh(x) - std::tanh(static_cast<double>(x))));
  EXPECT_LT(worst, 2e-7);
}

}  // namespace
}  // namespace loom
