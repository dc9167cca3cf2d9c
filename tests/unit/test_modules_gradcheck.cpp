// Finite-difference checks of every module's backward (inputs and parameters), and of
// the whole GPT-2 model's loss gradient.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/models/gpt2.h"
#include "loom/nn/embedding.h"
#include "loom/nn/fused_qkv_attention.h"
#include "loom/nn/gelu_mlp.h"
#include "loom/nn/layernorm.h"
#include "loom/nn/linear.h"

namespace loom {
namespace {

using test::GradTarget;

// Every parameter of `ps` (randomised, so norms/biases are not trivial) plus the input.
std::vector<GradTarget> targets_of(nn::ParamStore& ps, const Tensor& x, const Tensor& dx) {
  std::vector<GradTarget> t = {{"input", x, dx}};
  uint64_t seed = 50;
  for (auto& p : ps.all()) {
    test::fill_normal(p->value, seed++, 0.3f);
    t.push_back({p->name, p->value, p->grad});
  }
  return t;
}

TEST(ModuleGrad, Linear) {
  nn::ParamStore ps;
  nn::Linear lin(ps, "lin", 6, 4, true, 0.02f);
  ps.materialize();
  Tensor x = Tensor::zeros({2, 3, 6}), dx = Tensor::zeros({2, 3, 6});
  test::fill_normal(x, 1);
  auto t = targets_of(ps, x, dx);
  test::gradcheck([&] { return lin.forward(x); },
                  [&](const Tensor& dy) {
                    dx.zero_();
                    lin.backward(dy, dx);
                  },
                  t);
}

TEST(ModuleGrad, LinearFrozenWeightGetsNoGrad) {
  nn::ParamStore ps;
  nn::Linear lin(ps, "lin", 3, 2, true, 0.02f);
  lin.weight()->trainable = false;
  ps.materialize();
  EXPECT_FALSE(lin.weight()->grad.defined());
  EXPECT_EQ(ps.trainable_numel(), 2);
  Tensor x = Tensor::zeros({1, 3}), dx = Tensor::zeros({1, 3});
  lin.forward(x);
  Tensor dy = Tensor::zeros({1, 2});
  lin.backward(dy, dx);  // must not touch the missing grad
}

TEST(ModuleGrad, LayerNorm) {
  nn::ParamStore ps;
  nn::LayerNorm ln(ps, "ln", 8, 1e-5f);
  ps.materialize();
  Tensor x = Tensor::zeros({3, 8}), dx = Tensor::zeros({3, 8});
  test::fill_normal(x, 2);
  auto t = targets_of(ps, x, dx);
  test::gradcheck([&] { return ln.forward(x); },
                  [&](const Tensor& dy) {
                    dx.zero_();
                    ln.backward(dy, dx);
                  },
                  t);
}

TEST(ModuleGrad, Embedding) {
  nn::ParamStore ps;
  nn::Embedding emb(ps, "emb", 5, 4, 0.02f);
  ps.materialize();
  std::vector<int32_t> ids = {4, 0, 4, 2};
  Tensor out = Tensor::zeros({4, 4});
  std::vector<GradTarget> t;
  for (auto& p : ps.all()) {
    test::fill_normal(p->value, 3);
    t.push_back({p->name, p->value, p->grad});
  }
  test::gradcheck(
      [&] {
        emb.forward(ids.data(), 4, out, false);
        return out;
      },
      [&](const Tensor& dy) { emb.backward(ids.data(), 4, dy); }, t);
}

TEST(ModuleGrad, FusedQKVAttention) {
  nn::ParamStore ps;
  nn::FusedQKVAttention attn(ps, "attn", 8, 2, 0.02f, 0.02f);
  ps.materialize();
  nn::Scratch scratch;
  Tensor x = Tensor::zeros({2, 5, 8}), dx = Tensor::zeros({2, 5, 8});
  test::fill_normal(x, 4);
  auto t = targets_of(ps, x, dx);
  test::gradcheck([&] { return attn.forward(x, nn::Positions{}); },
                  [&](const Tensor& dy) {
                    dx.zero_();
                    attn.backward(dy, dx, scratch);
                  },
                  t);
}

TEST(ModuleGrad, GeluMLP) {
  nn::ParamStore ps;
  nn::GeluMLP mlp(ps, "mlp", 6, 12, 0.02f, 0.02f);
  ps.materialize();
  nn::Scratch scratch;
  Tensor x = Tensor::zeros({2, 3, 6}), dx = Tensor::zeros({2, 3, 6});
  test::fill_normal(x, 5);
  auto t = targets_of(ps, x, dx);
  test::gradcheck([&] { return mlp.forward(x); },
                  [&](const Tensor& dy) {
                    dx.zero_();
                    mlp.backward(dy, dx, scratch);
                  },
                  t);
}

TEST(ModuleGrad, GPT2Block) {
  models::GPT2Config c;
  c.n_embd = 8;
  c.n_head = 2;
  c.n_layer = 1;
  nn::ParamStore ps;
  auto blk = models::gpt2_block(ps, "h.0", c);
  ps.materialize();
  nn::Scratch scratch;
  Tensor x = Tensor::zeros({2, 4, 8}), dx = Tensor::zeros({2, 4, 8});
  test::fill_normal(x, 6);
  auto t = targets_of(ps, x, dx);
  test::gradcheck([&] { return blk->forward(x, nn::Positions{}); },
                  [&](const Tensor& dy) {
                    dx.zero_();
                    blk->backward(dy, dx, scratch);
                  },
                  t);
}

TEST(ModuleGrad, GPT2WholeModelLoss) {
  models::GPT2Config c;
  c.vocab_size = 17;
  c.n_positions = 8;
  c.n_embd = 8;
  c.n_head = 2;
  c.n_layer = 2;
  models::GPT2 model(c);
  model.params().init(3);
  for (auto& p : model.params().all()) test::fill_normal(p->value, 90 + p->offset, 0.3f);
  const int64_t B = 2, T = 6;
  Tensor ids = Tensor::zeros({B, T}, DType::I32), tg = Tensor::zeros({B, T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) {
    ids.i32()[i] = static_cast<int32_t>((i * 5 + 1) % c.vocab_size);
    tg.i32()[i] =
        i % 4 == 3 ? kernels::kIgnoreIndex : static_cast<int32_t>((i * 3 + 2) % c.vocab_size);
  }
  const int64_t n = kernels::count_targets(tg.i32(), B * T);
  Tensor out = Tensor::zeros({1});
  auto fwd = [&] {
    const Tensor& lg = model.forward(ids);
    out.f32()[0] = static_cast<float>(
        kernels::cross_entropy_loss(lg.f32(), tg.i32(), B * T, c.vocab_size) / n);
    return out;
  };
  auto bwd = [&](const Tensor& dout) {
    model.forward(ids);
    model.backward(tg, dout.f32()[0] / n);
  };
  std::vector<GradTarget> t;
  for (auto& p : model.params().all()) t.push_back({p->name, p->value, p->grad});
  test::gradcheck(fwd, bwd, t);
}

}  // namespace
}  // namespace loom
