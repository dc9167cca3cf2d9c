// The vectorisable exp/tanh against libm over their working range; the vector exp against
// the scalar one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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

// The vector exp is the scalar one lane by lane, bit for bit (attention's forward uses one
// and its tests the other): over the working range, past both clamps, at the infinities,
// NaN and where 2^n is smallest (p 2^-126 is subnormal for p < 1).
TEST(VecMath, VectorExpIsTheScalarBitForBit) {
  std::vector<float> xs = {-INFINITY, INFINITY, std::numeric_limits<float>::quiet_NaN(),
                           -1e30f,    1e30f,    -87.0f,
                           -86.99f,   -87.3f,   88.0f,
                           88.7f,     -0.0f,    0.0f};
  for (float x = -90.0f; x <= 90.0f; x += 0.000977f) xs.push_back(x);
  while (xs.size() % kernels::kVecWidth) xs.push_back(1.0f);
  for (size_t i = 0; i < xs.size(); i += kernels::kVecWidth) {
    float got[kernels::kVecWidth];
    kernels::storev(got, kernels::vexp(kernels::loadv(xs.data() + i)));
    for (int l = 0; l < kernels::kVecWidth; ++l) {
      const float want = kernels::vexp(xs[i + l]);
      EXPECT_EQ(std::memcmp(&got[l], &want, sizeof want), 0)
          << "x = " << xs[i + l] << ": vector " << got[l] << ", scalar " << want;
    }
  }
}

TEST(VecMath, TanhMatchesLibm) {
  double worst = 0;
  for (float x = -20.0f; x <= 20.0f; x += 0.0009765625f)
    worst = std::max(worst, std::fabs(kernels::vtanh(x) - std::tanh(static_cast<double>(x))));
  EXPECT_LT(worst, 2e-7);
}

}  // namespace
}  // namespace loom
