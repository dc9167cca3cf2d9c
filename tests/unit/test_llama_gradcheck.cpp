// Finite-difference checks of the Llama-family kernels and modules: RMSNorm, RoPE,
// SwiGLU, GQA attention with rotary embedding, the block, and the whole model (tied and
// untied, with and without q/k/v bias).
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "loom/kernels/cpu/activations.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/rmsnorm.h"
#include "loom/kernels/cpu/rope.h"
#include "loom/models/llama.h"
#include "loom/nn/gqa_attention.h"
#include "loom/nn/rmsnorm.h"

namespace loom {
namespace {

using test::GradTarget;

TEST(LlamaGrad, RMSNormKernel) {
  const int64_t N = 4, C = 12;
  Tensor x = Tensor::zeros({N, C}), w = Tensor::zeros({C}), dx = Tensor::zeros({N, C}),
         dw = Tensor::zeros({C}), y = Tensor::zeros({N, C}), rstd = Tensor::zeros({N});
  test::fill_normal(x, 1, 2.0f);
  test::fill_normal(w, 2);
  auto fwd = [&] {
    kernels::rmsnorm_forward(y.f32(), rstd.f32(), x.f32(), w.f32(), N, C, 1e-6f);
    return y;
  };
  auto bwd = [&](const Tensor& dy) {
    kernels::rmsnorm_backward(dx.f32(), dw.f32(), dy.f32(), x.f32(), w.f32(), rstd.f32(), N, C);
  };
  test::gradcheck(fwd, bwd, {{"x", x, dx}, {"w", w, dw}});
}

TEST(LlamaGrad, RopeIsARotationAndItsBackwardIsTheTranspose) {
  const int64_t N = 5, H = 2, D = 8;
  kernels::RopeScaling s;
  auto inv = kernels::rope_inv_freq(D, 10000.0, s);
  std::vector<int32_t> pos = {0, 1, 2, 7, 3};
  Tensor c = Tensor::zeros({N, D / 2}), sn = Tensor::zeros({N, D / 2});
  kernels::rope_tables(c.f32(), sn.f32(), pos.data(), N, inv);
  Tensor x = Tensor::zeros({N, H * D}), y = Tensor::zeros({N, H * D}),
         dx = Tensor::zeros({N, H * D});
  test::fill_normal(x, 3);
  auto fwd = [&] {
    y.copy_from(x);
    kernels::rope_forward(y.f32(), c.f32(), sn.f32(), N, H, D, H * D);
    return y;
  };
  auto bwd = [&](const Tensor& dy) {
    Tensor g = Tensor::zeros(dy.shape());
    g.copy_from(dy);
    kernels::rope_backward(g.f32(), c.f32(), sn.f32(), N, H, D, H * D);
    for (int64_t i = 0; i < g.numel(); ++i) dx.f32()[i] += g.f32()[i];
  };
  test::gradcheck(fwd, bwd, {{"x", x, dx}});
  // Position 0 is the identity; norms are preserved everywhere.
  fwd();
  for (int64_t i = 0; i < H * D; ++i) EXPECT_FLOAT_EQ(y.f32()[i], x.f32()[i]);
  EXPECT_NEAR(test::dot(y, y), test::dot(x, x), 1e-4);
}

TEST(LlamaGrad, Llama3RopeScalingKeepsHighFrequencies) {
  kernels::RopeScaling s{"llama3", 8.0, 1.0, 4.0, 64};
  auto base = kernels::rope_inv_freq(16, 10000.0, kernels::RopeScaling{});
  auto sc = kernels::rope_inv_freq(16, 10000.0, s);
  EXPECT_EQ(sc[0], base[0]);                  // wavelength 2*pi < 64/4: unchanged
  EXPECT_NEAR(sc[7], base[7] / 8.0f, 1e-12);  // longest wavelength: divided by factor
}

TEST(LlamaGrad, SwiGLUKernel) {
  const int64_t n = 40;
  Tensor g = Tensor::zeros({n}), u = Tensor::zeros({n}), h = Tensor::zeros({n}),
         dg = Tensor::zeros({n}), du = Tensor::zeros({n});
  test::fill_normal(g, 4, 2.0f);
  test::fill_normal(u, 5);
  auto fwd = [&] {
    kernels::swiglu_forward(h.f32(), g.f32(), u.f32(), n);
    return h;
  };
  auto bwd = [&](const Tensor& dh) {
    kernels::swiglu_backward(dg.f32(), du.f32(), dh.f32(), g.f32(), u.f32(), n);
  };
  test::gradcheck(fwd, bwd, {{"g", g, dg}, {"u", u, du}});
}

TEST(LlamaGrad, GqaAttentionWithRopeAndBias) {
  nn::ParamStore ps;
  nn::GqaAttention attn(ps, "attn", nn::GqaDims{8, 4, 2, 4, true, false}, 0.02f);
  ps.materialize();
  nn::Scratch scratch;
  const int64_t B = 2, T = 5;
  auto inv = kernels::rope_inv_freq(4, 100.0, kernels::RopeScaling{});
  std::vector<int32_t> pos(B * T);
  for (int64_t i = 0; i < B * T; ++i) pos[i] = static_cast<int32_t>(i % T);
  Tensor c = Tensor::zeros({B * T, 2}), s = Tensor::zeros({B * T, 2});
  kernels::rope_tables(c.f32(), s.f32(), pos.data(), B * T, inv);
  Tensor x = Tensor::zeros({B, T, 8}), dx = Tensor::zeros({B, T, 8});
  test::fill_normal(x, 6);
  std::vector<GradTarget> t = {{"input", x, dx}};
  uint64_t seed = 60;
  for (auto& p : ps.all()) {
    test::fill_normal(p->value, seed++, 0.4f);
    t.push_back({p->name, p->value, p->grad});
  }
  const nn::Positions where{nullptr, c, s};
  test::gradcheck([&] { return attn.forward(x, where); },
                  [&](const Tensor& dy) {
                    dx.zero_();
                    attn.backward(dy, dx, scratch);
                  },
                  t);
}

void check_whole_model(const std::string& type, bool tied, int64_t kv_heads) {
  nlohmann::json j = {{"model_type", type},
                      {"vocab_size", 19},
                      {"hidden_size", 8},
                      {"intermediate_size", 12},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", kv_heads},
                      {"max_position_embeddings", 16},
                      {"rope_theta", 100.0},
                      {"tie_word_embeddings", tied},
                      {"rope_scaling",
                       {{"rope_type", "llama3"},
                        {"factor", 4.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8}}}};
  models::Llama model(models::LlamaConfig::from_hf(j, "test"));
  uint64_t seed = 90;
  for (auto& p : model.params().all()) test::fill_normal(p->value, seed++, 0.3f);
  const int64_t B = 2, T = 6, V = 19;
  Tensor ids = Tensor::zeros({B, T}, DType::I32), tg = Tensor::zeros({B, T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) {
    ids.i32()[i] = static_cast<int32_t>((i * 5 + 1) % V);
    tg.i32()[i] = i % 4 == 3 ? kernels::kIgnoreIndex : static_cast<int32_t>((i * 3 + 2) % V);
  }
  const int64_t n = kernels::count_targets(tg.i32(), B * T);
  Tensor out = Tensor::zeros({1});
  auto fwd = [&] {
    const Tensor& lg = model.forward(ids);
    out.f32()[0] =
        static_cast<float>(kernels::cross_entropy_loss(lg.f32(), tg.i32(), B * T, V) / n);
    return out;
  };
  auto bwd = [&](const Tensor& dout) {
    model.forward(ids);
    model.backward(tg, dout.f32()[0] / n);
  };
  std::vector<GradTarget> t;
  for (auto& p : model.params().all()) t.push_back({p->name, p->value, p->grad});
  EXPECT_EQ(model.params().find("lm_head.weight") == nullptr, tied);
  // Smaller step than the default: the tied table enters twice (input and head), so the
  // loss is more curved along it.
  test::gradcheck(fwd, bwd, t, 2e-2, 4e-3f);
}

TEST(LlamaGrad, WholeLlamaTiedGQA) { check_whole_model("llama", true, 2); }
TEST(LlamaGrad, WholeQwen2UntiedWithBias) { check_whole_model("qwen2", false, 1); }

}  // namespace
}  // namespace loom
