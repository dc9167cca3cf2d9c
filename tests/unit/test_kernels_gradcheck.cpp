// Finite-difference checks of every CPU kernel's backward.
#include <gtest/gtest.h>
#include <unistd.h>

#include "common/test_util.h"
#include "loom/kernels/cpu/activations.h"
#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/embedding.h"
#include "loom/kernels/cpu/layernorm.h"
#include "loom/kernels/cpu/matmul.h"

namespace loom {
namespace {

using test::GradTarget;

TEST(KernelGrad, Matmul) {
  const int64_t N = 6, C = 5, OC = 7;
  Tensor x = Tensor::zeros({N, C}), W = Tensor::zeros({OC, C}), b = Tensor::zeros({OC});
  Tensor dx = Tensor::zeros({N, C}), dW = Tensor::zeros({OC, C}), db = Tensor::zeros({OC});
  test::fill_normal(x, 1);
  test::fill_normal(W, 2, 0.5f);
  test::fill_normal(b, 3);
  Tensor y = Tensor::zeros({N, OC});
  auto fwd = [&] {
    kernels::matmul_forward(y.f32(), x.f32(), W.f32(), b.f32(), N, C, OC);
    return y;
  };
  auto bwd = [&](const Tensor& dy) {
    kernels::matmul_backward(dx.f32(), dW.f32(), db.f32(), dy.f32(), x.f32(), W.f32(), N, C, OC);
  };
  test::gradcheck(fwd, bwd, {{"x", x, dx}, {"W", W, dW}, {"b", b, db}});
}

TEST(KernelGrad, LayerNorm) {
  const int64_t N = 5, C = 16;
  Tensor x = Tensor::zeros({N, C}), w = Tensor::zeros({C}), b = Tensor::zeros({C});
  Tensor dx = Tensor::zeros({N, C}), dw = Tensor::zeros({C}), db = Tensor::zeros({C});
  Tensor y = Tensor::zeros({N, C}), mean = Tensor::zeros({N}), rstd = Tensor::zeros({N});
  test::fill_normal(x, 4, 2.0f);
  test::fill_normal(w, 5);
  test::fill_normal(b, 6);
  auto fwd = [&] {
    kernels::layernorm_forward(y.f32(), mean.f32(), rstd.f32(), x.f32(), w.f32(), b.f32(), N, C,
                               1e-5f);
    return y;
  };
  auto bwd = [&](const Tensor& dy) {
    kernels::layernorm_backward(dx.f32(), dw.f32(), db.f32(), dy.f32(), x.f32(), w.f32(),
                                mean.f32(), rstd.f32(), N, C);
  };
  test::gradcheck(fwd, bwd, {{"x", x, dx}, {"w", w, dw}, {"b", b, db}});
}

TEST(KernelGrad, Gelu) {
  const int64_t n = 64;
  Tensor x = Tensor::zeros({n}), dx = Tensor::zeros({n}), y = Tensor::zeros({n});
  test::fill_normal(x, 7, 2.0f);
  auto fwd = [&] {
    kernels::gelu_forward(y.f32(), x.f32(), n);
    return y;
  };
  auto bwd = [&](const Tensor& dy) { kernels::gelu_backward(dx.f32(), x.f32(), dy.f32(), n); };
  test::gradcheck(fwd, bwd, {{"x", x, dx}});
}

// Attention with separate q/k/v buffers; NKV < NH exercises grouped K/V heads.
void check_attention(int64_t NH, int64_t NKV) {
  const int64_t B = 2, T = 5, HD = 4;
  Tensor q = Tensor::zeros({B, T, NH * HD}), k = Tensor::zeros({B, T, NKV * HD}),
         v = Tensor::zeros({B, T, NKV * HD});
  Tensor dq = Tensor::zeros(q.shape()), dk = Tensor::zeros(k.shape()),
         dv = Tensor::zeros(v.shape());
  test::fill_normal(q, 8);
  test::fill_normal(k, 9);
  test::fill_normal(v, 10);
  Tensor out = Tensor::zeros({B, T, NH * HD}), att = Tensor::zeros({B, NH, T, T});
  kernels::AttnDims d{B, T, NH, NKV, HD, NH * HD, NKV * HD};
  auto fwd = [&] {
    kernels::attention_forward(out.f32(), att.f32(), q.f32(), k.f32(), v.f32(), d);
    return out;
  };
  auto bwd = [&](const Tensor& dout) {
    kernels::attention_backward(dq.f32(), dk.f32(), dv.f32(), dout.f32(), q.f32(), k.f32(), v.f32(),
                                att.f32(), d);
  };
  test::gradcheck(fwd, bwd, {{"q", q, dq}, {"k", k, dk}, {"v", v, dv}});
}

TEST(KernelGrad, AttentionMHA) { check_attention(4, 4); }

TEST(KernelGrad, AttentionPackedRows) {
  // Row 0 packs samples of lengths 2 and 3; row 1 is one sample.
  const int64_t B = 2, T = 5, NH = 2, NKV = 1, HD = 4;
  std::vector<int32_t> pos = {0, 1, 0, 1, 2, 0, 1, 2, 3, 4};
  Tensor q = Tensor::zeros({B, T, NH * HD}), k = Tensor::zeros({B, T, NKV * HD}),
         v = Tensor::zeros({B, T, NKV * HD});
  Tensor dq = Tensor::zeros(q.shape()), dk = Tensor::zeros(k.shape()),
         dv = Tensor::zeros(v.shape());
  test::fill_normal(q, 21);
  test::fill_normal(k, 22);
  test::fill_normal(v, 23);
  Tensor out = Tensor::zeros({B, T, NH * HD}), att = Tensor::zeros({B, NH, T, T});
  kernels::AttnDims d{B, T, NH, NKV, HD, NH * HD, NKV * HD, pos.data()};
  auto fwd = [&] {
    kernels::attention_forward(out.f32(), att.f32(), q.f32(), k.f32(), v.f32(), d);
    return out;
  };
  auto bwd = [&](const Tensor& dout) {
    kernels::attention_backward(dq.f32(), dk.f32(), dv.f32(), dout.f32(), q.f32(), k.f32(), v.f32(),
                                att.f32(), d);
  };
  test::gradcheck(fwd, bwd, {{"q", q, dq}, {"k", k, dk}, {"v", v, dv}});
  // Token 2 (first of the second sample) attends only to itself.
  fwd();
  for (int64_t h = 0; h < NH; ++h) {
    EXPECT_EQ(att.f32()[(0 * NH + h) * T * T + 2 * T + 0], 0.0f);
    EXPECT_EQ(att.f32()[(0 * NH + h) * T * T + 2 * T + 1], 0.0f);
    EXPECT_FLOAT_EQ(att.f32()[(0 * NH + h) * T * T + 2 * T + 2], 1.0f);
  }
}
TEST(KernelGrad, AttentionGQA) { check_attention(4, 2); }

TEST(KernelGrad, AttentionIsCausal) {
  // Changing a later token's k/v must not change earlier outputs.
  const int64_t B = 1, T = 6, NH = 2, HD = 4, C = NH * HD;
  Tensor qkv = Tensor::zeros({B, T, 3 * C}), out = Tensor::zeros({B, T, C}),
         att = Tensor::zeros({B, NH, T, T});
  test::fill_normal(qkv, 12);
  kernels::AttnDims d{B, T, NH, NH, HD, 3 * C, 3 * C};
  const float* p = qkv.f32();
  kernels::attention_forward(out.f32(), att.f32(), p, p + C, p + 2 * C, d);
  std::vector<float> before(out.f32(), out.f32() + 4 * C);
  for (int64_t i = C; i < 3 * C; ++i) qkv.f32()[5 * 3 * C + i] += 3.0f;  // k, v of token 5
  kernels::attention_forward(out.f32(), att.f32(), p, p + C, p + 2 * C, d);
  for (int64_t i = 0; i < 4 * C; ++i) EXPECT_EQ(before[i], out.f32()[i]);
}

TEST(KernelGrad, CrossEntropy) {
  const int64_t N = 6, V = 11;
  Tensor logits = Tensor::zeros({N, V}), work = Tensor::zeros({N, V}),
         dlogits = Tensor::zeros({N, V});
  test::fill_normal(logits, 13, 2.0f);
  std::vector<int32_t> tg = {3, kernels::kIgnoreIndex, 0, 10, kernels::kIgnoreIndex, 7};
  // L(logits) = sum of token losses; R is a scalar here, so wrap as a [1] output.
  Tensor out = Tensor::zeros({1});
  auto fwd = [&] {
    out.f32()[0] = static_cast<float>(kernels::cross_entropy_loss(logits.f32(), tg.data(), N, V));
    return out;
  };
  auto bwd = [&](const Tensor& dout) {
    work.copy_from(logits);
    double s = kernels::cross_entropy_backward(work.f32(), tg.data(), N, V, dout.f32()[0]);
    EXPECT_NEAR(s, kernels::cross_entropy_loss(logits.f32(), tg.data(), N, V), 1e-5);
    for (int64_t i = 0; i < N * V; ++i) dlogits.f32()[i] += work.f32()[i];
  };
  test::gradcheck(fwd, bwd, {{"logits", logits, dlogits}}, 2e-2, 1e-2f);
  // Ignored rows get exactly zero gradient.
  for (int64_t i = 0; i < V; ++i) EXPECT_EQ(work.f32()[1 * V + i], 0.0f);
  EXPECT_EQ(kernels::count_targets(tg.data(), N), 4);
}

TEST(KernelGrad, CrossEntropyRejectsOutOfVocabTarget) {
  Tensor logits = Tensor::zeros({1, 4});
  int32_t tg = 4;
  EXPECT_THROW(kernels::cross_entropy_loss(logits.f32(), &tg, 1, 4), Error);
}

TEST(KernelGrad, Embedding) {
  const int64_t rows = 7, C = 5, N = 6;
  Tensor table = Tensor::zeros({rows, C}), dtable = Tensor::zeros({rows, C}),
         out = Tensor::zeros({N, C});
  test::fill_normal(table, 14);
  std::vector<int32_t> ids = {1, 3, 1, 6, 0, 1};  // repeated ids must accumulate
  auto fwd = [&] {
    kernels::embedding_forward(out.f32(), ids.data(), N, table.f32(), rows, C, false);
    return out;
  };
  auto bwd = [&](const Tensor& dout) {
    kernels::embedding_backward(dtable.f32(), ids.data(), N, dout.f32(), C);
  };
  test::gradcheck(fwd, bwd, {{"table", table, dtable}});
  int32_t bad = 7;
  EXPECT_THROW(kernels::embedding_forward(out.f32(), &bad, 1, table.f32(), rows, C, false), Error);
}

}  // namespace
}  // namespace loom
