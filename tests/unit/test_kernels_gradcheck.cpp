// Finite-difference checks of every CPU kernel's backward.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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

// Attention with separate q/k/v buffers; NKV < NH exercises grouped K/V heads. T above the
// kernel's 64-row strips exercises several strips, the last one partial.
void check_attention(int64_t NH, int64_t NKV, int64_t T = 5) {
  const int64_t B = 2, HD = 4;
  Tensor q = Tensor::zeros({B, T, NH * HD}), k = Tensor::zeros({B, T, NKV * HD}),
         v = Tensor::zeros({B, T, NKV * HD});
  Tensor dq = Tensor::zeros(q.shape()), dk = Tensor::zeros(k.shape()),
         dv = Tensor::zeros(v.shape());
  test::fill_normal(q, 8);
  test::fill_normal(k, 9);
  test::fill_normal(v, 10);
  Tensor out = Tensor::zeros({B, T, NH * HD}), lse = Tensor::zeros({B, NH, T});
  kernels::AttnDims d{B, T, NH, NKV, HD, NH * HD, NKV * HD};
  auto fwd = [&] {
    kernels::attention_forward(out.f32(), lse.f32(), q.f32(), k.f32(), v.f32(), d);
    return out;
  };
  auto bwd = [&](const Tensor& dout) {
    kernels::attention_backward(dq.f32(), dk.f32(), dv.f32(), dout.f32(), q.f32(), k.f32(), v.f32(),
                                out.f32(), lse.f32(), d);
  };
  test::gradcheck(fwd, bwd, {{"q", q, dq}, {"k", k, dk}, {"v", v, dv}});
}

TEST(KernelGrad, AttentionMHA) { check_attention(4, 4); }
TEST(KernelGrad, AttentionStrips) { check_attention(4, 2, 150); }

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
  Tensor out = Tensor::zeros({B, T, NH * HD}), lse = Tensor::zeros({B, NH, T});
  kernels::AttnDims d{B, T, NH, NKV, HD, NH * HD, NKV * HD, pos.data()};
  auto fwd = [&] {
    kernels::attention_forward(out.f32(), lse.f32(), q.f32(), k.f32(), v.f32(), d);
    return out;
  };
  auto bwd = [&](const Tensor& dout) {
    kernels::attention_backward(dq.f32(), dk.f32(), dv.f32(), dout.f32(), q.f32(), k.f32(), v.f32(),
                                out.f32(), lse.f32(), d);
  };
  test::gradcheck(fwd, bwd, {{"q", q, dq}, {"k", k, dk}, {"v", v, dv}});
  // Token 2 (first of the second sample) attends only to itself: its output is its value
  // row, and its log-sum-exp its one score.
  fwd();
  for (int64_t h = 0; h < NH; ++h) {
    float dot = 0.0f;
    for (int64_t i = 0; i < HD; ++i) {
      EXPECT_FLOAT_EQ(out.f32()[2 * NH * HD + h * HD + i], v.f32()[2 * HD + i]);
      dot += q.f32()[2 * NH * HD + h * HD + i] * k.f32()[2 * HD + i];
    }
    EXPECT_NEAR(lse.f32()[(0 * NH + h) * T + 2], dot / 2.0f, 1e-5);  // 1/sqrt(HD) = 1/2
  }
}
TEST(KernelGrad, AttentionGQA) { check_attention(4, 2); }

TEST(KernelGrad, AttentionIsCausal) {
  // Changing a later token's k/v must not change earlier outputs.
  const int64_t B = 1, T = 6, NH = 2, HD = 4, C = NH * HD;
  Tensor qkv = Tensor::zeros({B, T, 3 * C}), out = Tensor::zeros({B, T, C}),
         lse = Tensor::zeros({B, NH, T});
  test::fill_normal(qkv, 12);
  kernels::AttnDims d{B, T, NH, NH, HD, 3 * C, 3 * C};
  const float* p = qkv.f32();
  kernels::attention_forward(out.f32(), lse.f32(), p, p + C, p + 2 * C, d);
  std::vector<float> before(out.f32(), out.f32() + 4 * C);
  for (int64_t i = C; i < 3 * C; ++i) qkv.f32()[5 * 3 * C + i] += 3.0f;  // k, v of token 5
  kernels::attention_forward(out.f32(), lse.f32(), p, p + C, p + 2 * C, d);
  for (int64_t i = 0; i < 4 * C; ++i) EXPECT_EQ(before[i], out.f32()[i]);
}

// Prefix tuning: P shared virtual k/v rows [P, NKV*HD] seen by every query. The kernel's
// prefix gradients are per batch row ([B, P, NKV*HD]); their sum over B is the gradient of
// the shared prefix, which is what the finite differences measure.
void check_attention_prefix(int64_t NH, int64_t NKV, int64_t HD, int64_t P, int64_t B, int64_t T,
                            const int32_t* pos) {
  const int64_t KVC = NKV * HD;
  Tensor q = Tensor::zeros({B, T, NH * HD}), k = Tensor::zeros({B, T, KVC}),
         v = Tensor::zeros({B, T, KVC}), pk = Tensor::zeros({P, KVC}), pv = Tensor::zeros({P, KVC});
  Tensor dq = Tensor::zeros(q.shape()), dk = Tensor::zeros(k.shape()),
         dv = Tensor::zeros(v.shape()), dpk = Tensor::zeros(pk.shape()),
         dpv = Tensor::zeros(pv.shape());
  Tensor dpk_b = Tensor::zeros({B, P, KVC}), dpv_b = Tensor::zeros({B, P, KVC});
  test::fill_normal(q, 31);
  test::fill_normal(k, 32);
  test::fill_normal(v, 33);
  test::fill_normal(pk, 34);
  test::fill_normal(pv, 35);
  Tensor out = Tensor::zeros({B, T, NH * HD}), lse = Tensor::zeros({B, NH, T});
  kernels::AttnDims d{B, T, NH, NKV, HD, NH * HD, KVC, pos};
  d.prefix_k = pk.f32();
  d.prefix_v = pv.f32();
  d.P = P;
  d.prefix_stride = KVC;
  auto fwd = [&] {
    kernels::attention_forward(out.f32(), lse.f32(), q.f32(), k.f32(), v.f32(), d);
    return out;
  };
  auto bwd = [&](const Tensor& dout) {
    dpk_b.zero_();
    dpv_b.zero_();
    kernels::attention_backward(dq.f32(), dk.f32(), dv.f32(), dout.f32(), q.f32(), k.f32(), v.f32(),
                                out.f32(), lse.f32(), d, dpk_b.f32(), dpv_b.f32());
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < P * KVC; ++i) {
        dpk.f32()[i] += dpk_b.f32()[b * P * KVC + i];
        dpv.f32()[i] += dpv_b.f32()[b * P * KVC + i];
      }
    }
  };
  test::gradcheck(
      fwd, bwd,
      {{"q", q, dq}, {"k", k, dk}, {"v", v, dv}, {"prefix_k", pk, dpk}, {"prefix_v", pv, dpv}});
}

TEST(KernelGrad, AttentionPrefixGQA) { check_attention_prefix(4, 2, 8, 3, 2, 5, nullptr); }

TEST(KernelGrad, AttentionPrefixPackedRows) {
  // Row 0 packs samples of lengths 2 and 3; row 1 is one sample. Every sample sees the prefix.
  std::vector<int32_t> pos = {0, 1, 0, 1, 2, 0, 1, 2, 3, 4};
  check_attention_prefix(4, 2, 8, 3, 2, 5, pos.data());
}

// Position ids of packed rows: row b packs samples of the given lengths (summing to T).
std::vector<int32_t> packed_positions(const std::vector<std::vector<int32_t>>& rows) {
  std::vector<int32_t> pos;
  for (const auto& lens : rows)
    for (int32_t n : lens)
      for (int32_t i = 0; i < n; ++i) pos.push_back(i);
  return pos;
}

TEST(KernelGrad, AttentionPrefixPackedStrips) {
  // Samples that start inside a 64-row strip and ones that span strips.
  const auto pos = packed_positions({{40, 100, 10}, {150}});
  check_attention_prefix(4, 2, 8, 3, 2, 150, pos.data());
}

// NaN in every element: a kernel that writes its output whole leaves none.
void poison(std::initializer_list<Tensor*> ts) {
  for (Tensor* t : ts) std::fill_n(t->f32(), t->numel(), std::numeric_limits<float>::quiet_NaN());
}

// Forward and backward against a double-precision reference (softmax over the P prefix keys
// and the causal keys [t - pos[t], t]: the output, the log-sum-exp backward relies on, and
// dq, dk, dv and the prefix's gradients), with the prefix k/v interleaved in one buffer to
// exercise prefix_stride, GQA and packed rows. T past 256 crosses the kernel's key blocks;
// HD 8 is padded to its 16-wide tiles, 64 is not.
void check_attention_reference(int64_t B, int64_t T, int64_t P, const std::vector<int32_t>& pos,
                               int64_t HD = 8) {
  const int64_t NH = 4, NKV = 2, KVC = NKV * HD, QC = NH * HD;
  Tensor q = Tensor::zeros({B, T, QC}), k = Tensor::zeros({B, T, KVC}),
         v = Tensor::zeros({B, T, KVC}), prefix = Tensor::zeros({std::max<int64_t>(P, 1), 2 * KVC}),
         dout = Tensor::zeros({B, T, QC});
  test::fill_normal(q, 41);
  test::fill_normal(k, 42);
  test::fill_normal(v, 43);
  test::fill_normal(prefix, 44);
  test::fill_normal(dout, 45);
  Tensor out = Tensor::zeros({B, T, QC}), lse = Tensor::zeros({B, NH, T});
  kernels::AttnDims d{B, T, NH, NKV, HD, QC, KVC, pos.data()};
  d.prefix_k = prefix.f32();
  d.prefix_v = prefix.f32() + KVC;
  d.P = P;
  d.prefix_stride = 2 * KVC;
  kernels::attention_forward(out.f32(), lse.f32(), q.f32(), k.f32(), v.f32(), d);
  Tensor dq = Tensor::zeros(q.shape()), dk = Tensor::zeros(k.shape()),
         dv = Tensor::zeros(v.shape()), dpk = Tensor::zeros({B, std::max<int64_t>(P, 1), KVC}),
         dpv = Tensor::zeros(dpk.shape());
  // Backward writes every gradient element (its buffers need no zeroing): one it skipped
  // would stay NaN here.
  poison({&dq, &dk, &dv});
  if (P > 0) poison({&dpk, &dpv});
  kernels::attention_backward(dq.f32(), dk.f32(), dv.f32(), dout.f32(), q.f32(), k.f32(), v.f32(),
                              out.f32(), lse.f32(), d, dpk.f32(), dpv.f32());

  const int64_t W = P + T;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  std::vector<double> rdq(q.numel()), rdk(k.numel()), rdv(v.numel()), rdpk(dpk.numel()),
      rdpv(dpk.numel());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / (NH / NKV);
      for (int64_t t = 0; t < T; ++t) {
        const float* qt = q.f32() + (b * T + t) * QC + h * HD;
        const float* dot_ = dout.f32() + (b * T + t) * QC + h * HD;
        const int64_t s0 = t - pos[b * T + t];
        // Scores: P prefix columns, then T key columns; masked columns stay -inf. Each
        // column's key/value rows and where their gradients go.
        std::vector<double> sc(W, -INFINITY);
        std::vector<const float*> kr(W, nullptr), vr(W, nullptr);
        std::vector<double*> gk(W, nullptr), gv(W, nullptr);
        for (int64_t c = 0; c < W; ++c) {
          if (c < P) {
            kr[c] = prefix.f32() + c * 2 * KVC + g * HD;
            vr[c] = kr[c] + KVC;
            gk[c] = rdpk.data() + (b * P + c) * KVC + g * HD;
            gv[c] = rdpv.data() + (b * P + c) * KVC + g * HD;
          } else if (c - P >= s0 && c - P <= t) {
            kr[c] = k.f32() + (b * T + c - P) * KVC + g * HD;
            vr[c] = v.f32() + (b * T + c - P) * KVC + g * HD;
            gk[c] = rdk.data() + (b * T + c - P) * KVC + g * HD;
            gv[c] = rdv.data() + (b * T + c - P) * KVC + g * HD;
          }
          if (!kr[c]) continue;
          double dot = 0;
          for (int64_t i = 0; i < HD; ++i) dot += static_cast<double>(qt[i]) * kr[c][i];
          sc[c] = dot * scale;
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        EXPECT_NEAR(lse.f32()[(b * NH + h) * T + t], mx + std::log(sum), 1e-5)
            << "lse b" << b << " h" << h << " t" << t;
        for (int64_t i = 0; i < HD; ++i) {
          double o = 0;
          for (int64_t c = 0; c < W; ++c)
            if (vr[c]) o += sc[c] / sum * vr[c][i];
          EXPECT_NEAR(out.f32()[(b * T + t) * QC + h * HD + i], o, 1e-5)
              << "out b" << b << " h" << h << " t" << t << " i" << i;
        }
        // Backward: dp_c = dO . v_c, dS_c = p_c (dp_c - sum_c' p_c' dp_c') / sqrt(HD).
        std::vector<double> p(W, 0.0), dp(W, 0.0);
        double D = 0;
        for (int64_t c = 0; c < W; ++c) {
          if (!vr[c]) continue;
          p[c] = sc[c] / sum;
          for (int64_t i = 0; i < HD; ++i) dp[c] += static_cast<double>(dot_[i]) * vr[c][i];
          D += p[c] * dp[c];
        }
        double* gq = rdq.data() + (b * T + t) * QC + h * HD;
        for (int64_t c = 0; c < W; ++c) {
          if (!vr[c]) continue;
          const double ds = p[c] * (dp[c] - D) * scale;
          for (int64_t i = 0; i < HD; ++i) {
            gq[i] += ds * kr[c][i];
            gk[c][i] += ds * qt[i];
            gv[c][i] += p[c] * dot_[i];
          }
        }
      }
    }
  }
  const std::pair<const char*, std::pair<const Tensor*, const std::vector<double>*>> grads[] = {
      {"dq", {&dq, &rdq}},
      {"dk", {&dk, &rdk}},
      {"dv", {&dv, &rdv}},
      {"dprefix_k", {&dpk, &rdpk}},
      {"dprefix_v", {&dpv, &rdpv}}};
  for (const auto& [name, pr] : grads) {
    const auto& [ours, ref] = pr;
    const int64_t n = P > 0 || std::string(name).find("prefix") == std::string::npos
                          ? static_cast<int64_t>(ref->size())
                          : 0;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(ours->f32()[i], (*ref)[i], 1e-4 * (1 + std::fabs((*ref)[i])))
          << name << " element " << i << " (T " << T << ", P " << P << ", HD " << HD << ")";
  }
}

TEST(KernelGrad, AttentionPrefixMatchesReference) {
  check_attention_reference(2, 6, 3, {0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5});
}
TEST(KernelGrad, AttentionStripsMatchReference) {
  const auto pos = packed_positions({{40, 100, 10}, {150}});
  check_attention_reference(2, 150, 3, pos);
  check_attention_reference(2, 150, 0, pos);
  check_attention_reference(1, 200, 0, packed_positions({{200}}));
}
TEST(KernelGrad, AttentionKeyBlocksMatchReference) {
  // Past 256 score columns (the key blocks), head_dim 64 (unpadded tiles) and 8 (padded);
  // a sample that starts past the prefix in a later strip packs that strip's own keys.
  const auto pos = packed_positions({{300}, {70, 200, 30}});
  check_attention_reference(2, 300, 3, pos, 64);
  check_attention_reference(2, 300, 0, pos, 8);
  check_attention_reference(1, 300, 5, packed_positions({{300}}), 16);
}

// The backward's two ways of splitting GQA work: a task per (batch row, KV group) with the
// group's heads stacked (enough pairs for the threads: here one thread), and a task per
// (batch row, head) with per-head key/value partials summed per group (here 16 threads,
// fewer pairs than twice that). Both must give the same gradients, prefix ones included,
// up to summation order.
TEST(KernelGrad, AttentionBackwardSplitsAgree) {
  const int64_t B = 2, T = 150, NH = 6, NKV = 2, HD = 8, P = 3, KVC = NKV * HD;
  const auto pos = packed_positions({{40, 100, 10}, {150}});
  Tensor q = Tensor::zeros({B, T, NH * HD}), k = Tensor::zeros({B, T, KVC}),
         v = Tensor::zeros({B, T, KVC}), dout = Tensor::zeros({B, T, NH * HD}),
         prefix = Tensor::zeros({P, 2 * KVC});
  test::fill_normal(q, 61);
  test::fill_normal(k, 62);
  test::fill_normal(v, 63);
  test::fill_normal(dout, 64);
  test::fill_normal(prefix, 65);
  kernels::AttnDims d{B, T, NH, NKV, HD, NH * HD, KVC, pos.data()};
  d.prefix_k = prefix.f32();
  d.prefix_v = prefix.f32() + KVC;
  d.P = P;
  d.prefix_stride = 2 * KVC;
  Tensor out = Tensor::zeros({B, T, NH * HD}), lse = Tensor::zeros({B, NH, T});
  kernels::attention_forward(out.f32(), lse.f32(), q.f32(), k.f32(), v.f32(), d);
  const int threads = omp_get_max_threads();
  std::vector<float> grads[2];
  for (int run = 0; run < 2; ++run) {
    omp_set_num_threads(run == 0 ? 1 : 16);
    Tensor dq = Tensor::zeros(q.shape()), dk = Tensor::zeros(k.shape()),
           dv = Tensor::zeros(v.shape()), dpk = Tensor::zeros({B, P, KVC}),
           dpv = Tensor::zeros({B, P, KVC});
    poison({&dq, &dk, &dv, &dpk, &dpv});  // both splits write every element
    kernels::attention_backward(dq.f32(), dk.f32(), dv.f32(), dout.f32(), q.f32(), k.f32(), v.f32(),
                                out.f32(), lse.f32(), d, dpk.f32(), dpv.f32());
    for (const Tensor* t : {&dq, &dk, &dv, &dpk, &dpv})
      grads[run].insert(grads[run].end(), t->f32(), t->f32() + t->numel());
  }
  omp_set_num_threads(threads);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i)
    ASSERT_NEAR(grads[0][i], grads[1][i], 1e-5 * (1 + std::fabs(grads[0][i]))) << "element " << i;
}

// P == 0 with prefix pointers set must give bit-identical results to the defaults (the
// layout and arithmetic of plain attention are unchanged), and leave dprefix untouched.
TEST(KernelGrad, AttentionZeroPrefixIsUnchanged) {
  const int64_t B = 2, T = 7, NH = 4, NKV = 2, HD = 8, KVC = NKV * HD;
  const std::vector<int32_t> pos = {0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6};
  for (const int32_t* p : {static_cast<const int32_t*>(nullptr), pos.data()}) {
    Tensor q = Tensor::zeros({B, T, NH * HD}), k = Tensor::zeros({B, T, KVC}),
           v = Tensor::zeros({B, T, KVC}), dout = Tensor::zeros({B, T, NH * HD}),
           junk = Tensor::zeros({4, KVC});
    test::fill_normal(q, 51);
    test::fill_normal(k, 52);
    test::fill_normal(v, 53);
    test::fill_normal(dout, 54);
    test::fill_normal(junk, 55);
    kernels::AttnDims plain{B, T, NH, NKV, HD, NH * HD, KVC, p};
    kernels::AttnDims zero = plain;
    zero.prefix_k = junk.f32();
    zero.prefix_v = junk.f32();
    zero.prefix_stride = KVC;  // P stays 0
    std::vector<float> results[2];
    for (int run = 0; run < 2; ++run) {
      const kernels::AttnDims& d = run == 0 ? plain : zero;
      Tensor out = Tensor::zeros({B, T, NH * HD}), lse = Tensor::zeros({B, NH, T});
      Tensor dq = Tensor::zeros(q.shape()), dk = Tensor::zeros(k.shape()),
             dv = Tensor::zeros(v.shape()), dpk = Tensor::zeros({B, 4, KVC});
      kernels::attention_forward(out.f32(), lse.f32(), q.f32(), k.f32(), v.f32(), d);
      if (run == 0) {
        kernels::attention_backward(dq.f32(), dk.f32(), dv.f32(), dout.f32(), q.f32(), k.f32(),
                                    v.f32(), out.f32(), lse.f32(), d);
      } else {
        kernels::attention_backward(dq.f32(), dk.f32(), dv.f32(), dout.f32(), q.f32(), k.f32(),
                                    v.f32(), out.f32(), lse.f32(), d, dpk.f32(), dpk.f32());
        for (int64_t i = 0; i < dpk.numel(); ++i) EXPECT_EQ(dpk.f32()[i], 0.0f);
      }
      for (const Tensor* t : {&out, &lse, &dq, &dk, &dv})
        results[run].insert(results[run].end(), t->f32(), t->f32() + t->numel());
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)),
              0);
  }
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
