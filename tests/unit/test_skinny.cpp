// kernels/cpu/skinny.h against cblas_sgemm, over ranks that exercise the blocks of eight and
// their remainders, widths with and without a tail of W % 8 columns, and row counts below
// and above the kernels' threshold for threads and their chunk of 64 rows.
#include <cblas.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "common/test_util.h"
#include "loom/kernels/cpu/skinny.h"

namespace loom {
namespace {

std::vector<float> normal(int64_t n, uint64_t seed) {
  Tensor t = Tensor::zeros({n});
  test::fill_normal(t, seed);
  return {t.f32(), t.f32() + n};
}

// |a - b| within 1e-5 of the sum of |terms| (the reference sums in another order).
void expect_close(const std::vector<float>& a, const std::vector<float>& b,
                  const std::vector<float>& scale, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-5f * (1.0f + scale[i])) << what << " element " << i;
}

// Row n's transform in the tests: scale by (n % 3) - 1 and zero every fifth element.
void test_op(int64_t n, float* v, int64_t W) {
  for (int64_t c = 0; c < W; ++c) v[c] = c % 5 == 0 ? 0.0f : v[c] * static_cast<float>(n % 3 - 1);
}

TEST(Skinny, EqualsBlas) {
  for (const int64_t r : {1, 3, 8, 13, 16})
    for (const int64_t W : {5, 37, 576})
      for (const int64_t N : {1, 9, 300}) {
        SCOPED_TRACE(testing::Message() << "r " << r << " W " << W << " N " << N);
        const std::vector<float> X = normal(N * W, 1), M = normal(r * W, 2), U = normal(N * r, 3),
                                 Y0 = normal(N * W, 4), G0 = normal(r * W, 5);
        std::vector<float> absX(X.size()), absU(U.size()), absM(M.size());
        for (size_t i = 0; i < X.size(); ++i) absX[i] = std::fabs(X[i]);
        for (size_t i = 0; i < U.size(); ++i) absU[i] = std::fabs(U[i]);
        for (size_t i = 0; i < M.size(); ++i) absM[i] = std::fabs(M[i]);
        const float alpha = 0.75f;

        // Y = alpha X M^T, with and without a transform of X's rows.
        std::vector<float> y(N * r), ref(N * r), scale(N * r);
        kernels::skinny_nt(y.data(), X.data(), M.data(), N, W, r, alpha);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, W, alpha, X.data(), W, M.data(),
                    W, 0.0f, ref.data(), r);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, W, alpha, absX.data(), W,
                    absM.data(), W, 0.0f, scale.data(), r);
        expect_close(y, ref, scale, "nt");
        std::vector<float> Xop = X;
        for (int64_t n = 0; n < N; ++n) test_op(n, Xop.data() + n * W, W);
        kernels::skinny_nt(y.data(), X.data(), M.data(), N, W, r, alpha,
                           [W](int64_t n, float* v) { test_op(n, v, W); });
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, W, alpha, Xop.data(), W,
                    M.data(), W, 0.0f, ref.data(), r);
        expect_close(y, ref, scale, "nt with x_op");

        // Y += op(alpha U M).
        std::vector<float> yw = Y0, refw(N * W), scalew(N * W);
        kernels::skinny_nn(yw.data(), U.data(), M.data(), N, W, r, alpha,
                           [W](int64_t n, float* v) { test_op(n, v, W); });
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, W, r, alpha, U.data(), r,
                    M.data(), W, 0.0f, refw.data(), W);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, W, r, alpha, absU.data(), r,
                    absM.data(), W, 0.0f, scalew.data(), W);
        for (int64_t n = 0; n < N; ++n) test_op(n, refw.data() + n * W, W);
        for (int64_t i = 0; i < N * W; ++i) refw[i] += Y0[i];
        expect_close(yw, refw, scalew, "nn (+=)");
        // Y = op(alpha U M), whatever Y held.
        std::vector<float> ys = Y0;
        kernels::skinny_nn(
            ys.data(), U.data(), M.data(), N, W, r, alpha,
            [W](int64_t n, float* v) { test_op(n, v, W); }, false);
        for (int64_t i = 0; i < N * W; ++i) refw[i] -= Y0[i];
        expect_close(ys, refw, scalew, "nn (=)");

        // Y = alpha X M^T and G += alpha U^T X in one pass (LoRA's B side), either alone.
        std::vector<float> refg = G0, scaleg(r * W);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, W, N, alpha, U.data(), r, X.data(),
                    W, 1.0f, refg.data(), W);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, W, N, alpha, absU.data(), r,
                    absX.data(), W, 0.0f, scaleg.data(), W);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, W, alpha, X.data(), W, M.data(),
                    W, 0.0f, ref.data(), r);
        std::vector<float> g = G0;
        kernels::skinny_nt_tn(y.data(), g.data(), X.data(), M.data(), U.data(), N, W, r, alpha);
        expect_close(y, ref, scale, "nt_tn: Y");
        expect_close(g, refg, scaleg, "nt_tn: G");
        g = G0;
        kernels::skinny_nt_tn(nullptr, g.data(), X.data(), M.data(), U.data(), N, W, r, alpha);
        expect_close(g, refg, scaleg, "nt_tn: G alone");
        std::fill(y.begin(), y.end(), 0.0f);
        kernels::skinny_nt_tn(y.data(), nullptr, X.data(), M.data(), U.data(), N, W, r, alpha);
        expect_close(y, ref, scale, "nt_tn: Y alone");

        // Y += mask (alpha D M) and G += alpha U^T (mask X) in one pass (LoRA's A side), the
        // mask a diagonal map (test_op), with and without it; D and U differ (tensor
        // parallelism's local and summed du).
        const std::vector<float> D = normal(N * r, 6);
        std::vector<float> absD(D.size());
        for (size_t i = 0; i < D.size(); ++i) absD[i] = std::fabs(D[i]);
        for (const bool masked : {false, true}) {
          SCOPED_TRACE(masked ? "masked" : "no mask");
          const std::vector<float>& Xm = masked ? Xop : X;
          kernels::RowOp op;
          if (masked) op = [W](int64_t n, float* v) { test_op(n, v, W); };
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, W, r, alpha, D.data(), r,
                      M.data(), W, 0.0f, refw.data(), W);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, W, r, alpha, absD.data(), r,
                      absM.data(), W, 0.0f, scalew.data(), W);
          for (int64_t n = 0; masked && n < N; ++n) test_op(n, refw.data() + n * W, W);
          for (int64_t i = 0; i < N * W; ++i) refw[i] += Y0[i];
          refg = G0;
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, W, N, alpha, U.data(), r,
                      Xm.data(), W, 1.0f, refg.data(), W);
          yw = Y0;
          g = G0;
          kernels::skinny_nn_tn(yw.data(), g.data(), D.data(), U.data(), M.data(), X.data(), N, W,
                                r, alpha, op);
          expect_close(yw, refw, scalew, "nn_tn: Y");
          expect_close(g, refg, scaleg, "nn_tn: G");
          g = G0;
          kernels::skinny_nn_tn(nullptr, g.data(), D.data(), U.data(), M.data(), X.data(), N, W, r,
                                alpha, op);
          expect_close(g, refg, scaleg, "nn_tn: G alone");
          yw = Y0;
          kernels::skinny_nn_tn(yw.data(), nullptr, D.data(), U.data(), M.data(), X.data(), N, W, r,
                                alpha, op);
          expect_close(yw, refw, scalew, "nn_tn: Y alone");
        }
      }
}

// The column sums go by fixed chunks of rows added in chunk order: the same bits on one
// thread as on two (LoRA's gradients do not depend on OMP_NUM_THREADS).
TEST(Skinny, ColumnSumsDoNotDependOnTheThreadCount) {
  const int64_t N = 1000, W = 576, r = 8;
  const std::vector<float> X = normal(N * W, 1), M = normal(r * W, 2), U = normal(N * r, 3);
  std::vector<float> g[2], y[2];
  const int threads = omp_get_max_threads();
  for (int t = 0; t < 2; ++t) {
    omp_set_num_threads(t == 0 ? 1 : 2);
    g[t].assign(r * W, 0.0f);
    y[t].assign(N * r, 0.0f);
    kernels::skinny_nt_tn(y[t].data(), g[t].data(), X.data(), M.data(), U.data(), N, W, r, 1.0f);
    kernels::skinny_nn_tn(nullptr, g[t].data(), U.data(), U.data(), M.data(), X.data(), N, W, r,
                          0.5f, [W](int64_t n, float* v) { test_op(n, v, W); });
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(g[0], g[1]);
  EXPECT_EQ(y[0], y[1]);
}

}  // namespace
}  // namespace loom
