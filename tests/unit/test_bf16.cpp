// bf16 conversion (round to nearest even, NaN, infinities) and bf16 GEMM with fp32
// accumulation on both backends (oneDNN where the CPU has native bf16, the widening
// fallback everywhere) against a double-precision reference of the same bf16 values.
// Products of bf16 values are exact in fp32, so the only error allowed is fp32 summation
// order: |C - ref| <= K * 2^-23 * sum_k |a_k b_k| per element (plus beta * C's rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "loom/kernels/cpu/bf16.h"
#include "loom/kernels/cpu/matmul.h"
#include "loom/kernels/cpu/matmul_bf16.h"

namespace loom {
namespace {

using kernels::bf16;

float bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(kernels::to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even mantissa (1.0).
  EXPECT_EQ(kernels::to_bf16(bits(0x3f808000u)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even one.
  EXPECT_EQ(kernels::to_bf16(bits(0x3f818000u)), 0x3f82);
  EXPECT_EQ(kernels::to_bf16(bits(0x3f808001u)), 0x3f81);  // just above halfway: up
  EXPECT_EQ(kernels::to_bf16(bits(0x3f807fffu)), 0x3f80);  // just below: down
  EXPECT_EQ(kernels::to_bf16(-2.5f), 0xc020);
  // Overflow past bf16's largest finite value rounds to infinity, as in fp32.
  EXPECT_EQ(kernels::to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(kernels::to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(kernels::to_bf16(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(kernels::from_bf16(kernels::to_bf16(NAN))));
  // A NaN whose payload sits only in the dropped bits stays NaN (rounding would make it inf).
  EXPECT_TRUE(std::isnan(kernels::from_bf16(kernels::to_bf16(bits(0x7f800001u)))));
  // Subnormals round like any other value.
  EXPECT_EQ(kernels::to_bf16(bits(0x00008000u)), 0x0000);
  EXPECT_EQ(kernels::to_bf16(bits(0x00018000u)), 0x0002);
}

TEST(Bf16, WideningIsExactAndRoundTrips) {
  std::vector<bf16> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<bf16>(i);
  std::vector<float> wide(all.size());
  kernels::from_bf16(all.data(), wide.data(), static_cast<int64_t>(all.size()));
  std::vector<bf16> back(all.size());
  kernels::to_bf16(wide.data(), back.data(), static_cast<int64_t>(wide.size()));
  for (uint32_t i = 0; i < 65536; ++i) {
    if (std::isnan(wide[i])) continue;  // NaNs come back quieted
    ASSERT_EQ(back[i], all[i]) << i;
    uint32_t u;
    std::memcpy(&u, &wide[i], 4);
    ASSERT_EQ(u, i << 16);
  }
}

// C = op(A) op(B) + beta C with leading dimensions wider than the rows, every transpose;
// the shapes after the first each cross one of the fallback's block edges (1024 rows of C,
// 4096 columns, 1024 of K), so partial blocks and the K blocks' accumulation are checked.
void check_gemm(kernels::Bf16Gemm backend) {
  kernels::set_bf16_gemm_backend(backend);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  struct Dims {
    int64_t M, N, K;
  };
  for (const Dims d : {Dims{37, 53, 300}, Dims{1030, 7, 20}, Dims{5, 4100, 20}, Dims{5, 7, 2100}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          const int64_t M = d.M, N = d.N, K = d.K, pad = 5;
          const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
          std::vector<bf16> A((ta ? K : M) * lda), B((tb ? N : K) * ldb);
          for (bf16& a : A) a = kernels::to_bf16(dist(rng));
          for (bf16& b : B) b = kernels::to_bf16(dist(rng));
          std::vector<float> C(M * ldc);
          for (float& c : C) c = dist(rng);
          const std::vector<float> C0 = C;
          kernels::gemm_bf16(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double ref = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double a = kernels::from_bf16(ta ? A[k * lda + i] : A[i * lda + k]);
                const double b = kernels::from_bf16(tb ? B[j * ldb + k] : B[k * ldb + j]);
                ref += a * b;
                mag += std::fabs(a * b);
              }
              ref += beta * C0[i * ldc + j];
              const double tol = K * std::ldexp(1.0, -23) * mag + 1e-6 * std::fabs(ref);
              ASSERT_NEAR(C[i * ldc + j], ref, tol)
                  << "ta " << ta << " tb " << tb << " beta " << beta << " at " << i << "," << j;
            }
          for (int64_t i = 0; i < M; ++i)  // the padding columns are not written
            for (int64_t j = N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], C0[i * ldc + j]);
        }
}

TEST(Bf16, GemmFallbackMatchesReference) {
  const kernels::Bf16Gemm was = kernels::bf16_gemm_backend();
  check_gemm(kernels::Bf16Gemm::fallback);
  kernels::set_bf16_gemm_backend(was);
}

TEST(Bf16, GemmOneDnnMatchesReference) {
  if (!kernels::bf16_native())
    GTEST_SKIP() << "no native bf16 here: " << kernels::bf16_gemm_description();
  const kernels::Bf16Gemm was = kernels::bf16_gemm_backend();
  check_gemm(kernels::Bf16Gemm::onednn);
  kernels::set_bf16_gemm_backend(was);
}

// The Linear layer's three products in bf16 equal the fp32 ones on the same (bf16-rounded)
// values, to fp32 summation order.
TEST(Bf16, LinearProductsMatchFp32OnRoundedValues) {
  const int64_t N = 24, C = 96, OC = 40;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const kernels::Bf16Gemm was = kernels::bf16_gemm_backend();
  std::vector<float> x(N * C), w(OC * C), dy(N * OC), b(OC);
  for (auto* v : {&x, &w, &dy, &b})
    for (float& e : *v) e = kernels::from_bf16(kernels::to_bf16(dist(rng)));
  std::vector<bf16> xb(x.size()), wb(w.size()), dyb(dy.size());
  kernels::to_bf16(x.data(), xb.data(), N * C);
  kernels::to_bf16(w.data(), wb.data(), OC * C);
  kernels::to_bf16(dy.data(), dyb.data(), N * OC);
  for (auto backend : {kernels::Bf16Gemm::fallback, kernels::Bf16Gemm::onednn}) {
    if (backend == kernels::Bf16Gemm::onednn && !kernels::bf16_native()) continue;
    kernels::set_bf16_gemm_backend(backend);
    std::vector<float> out32(N * OC), out16(N * OC), dx32(N * C, 0.25f), dx16(N * C, 0.25f),
        dw32(OC * C, -1.0f), dw16(OC * C, -1.0f), db32(OC, 2.0f), db16(OC, 2.0f);
    kernels::matmul_forward(out32.data(), x.data(), w.data(), b.data(), N, C, OC);
    kernels::matmul_forward_half(kernels::Half::bf16, out16.data(), xb.data(), wb.data(), b.data(),
                                 N, C, OC);
    kernels::matmul_backward(dx32.data(), dw32.data(), db32.data(), dy.data(), x.data(), w.data(),
                             N, C, OC);
    kernels::matmul_backward_half(kernels::Half::bf16, dx16.data(), dw16.data(), db16.data(),
                                  dyb.data(), xb.data(), wb.data(), N, C, OC);
    for (size_t i = 0; i < out32.size(); ++i) ASSERT_NEAR(out16[i], out32[i], 2e-4f) << i;
    for (size_t i = 0; i < dx32.size(); ++i) ASSERT_NEAR(dx16[i], dx32[i], 2e-4f) << i;
    for (size_t i = 0; i < dw32.size(); ++i) ASSERT_NEAR(dw16[i], dw32[i], 2e-4f) << i;
    for (size_t i = 0; i < db32.size(); ++i) ASSERT_NEAR(db16[i], db32[i], 2e-4f) << i;
  }
  kernels::set_bf16_gemm_backend(was);
}

}  // namespace
}  // namespace loom
