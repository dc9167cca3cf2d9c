// Gradient accumulation gives exactly the gradient of one big batch, even when the
// micro-batches hold different numbers of target tokens: the step's loss is one mean over
// all its target tokens (not a mean of per-micro-batch means). The optimizer leaves the
// gradients zero for the next step (ZeRO-0: cleared in AdamW's pass, no zeroing pass).
#include <gtest/gtest.h>

#include <cmath>

#include "common/test_util.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/train/trainer.h"

namespace loom {
namespace {

constexpr int64_t kT = 8, kRows = 6;

std::unique_ptr<data::Dataset> sft_like_data(std::vector<int64_t>* counts) {
  // Row r ignores its first 1 + 2r targets (a prompt of growing length), so micro-batches
  // carry different target counts.
  std::vector<int32_t> ids(kRows * kT), tg(kRows * kT);
  for (int64_t r = 0; r < kRows; ++r) {
    int64_t c = 0;
    for (int64_t t = 0; t < kT; ++t) {
      ids[r * kT + t] = static_cast<int32_t>((r * 31 + t * 7) % 64);
      const bool ignored = t < 1 + r;
      tg[r * kT + t] =
          ignored ? kernels::kIgnoreIndex : static_cast<int32_t>((r * 13 + t * 5) % 64);
      c += !ignored;
    }
    counts->push_back(c);
  }
  return std::make_unique<data::TensorDataset>(ids, tg, kT);
}

train::TrainConfig tiny_config(int64_t micro, int64_t accum) {
  train::TrainConfig cfg;
  cfg.model = {{"arch", "gpt2"}, {"n_layer", 2},     {"n_embd", 16},
               {"n_head", 2},    {"vocab_size", 64}, {"n_positions", 16}};
  cfg.micro_batch = micro;
  cfg.grad_accum = accum;
  cfg.train_batch = micro * accum;
  cfg.train_steps = 2;
  cfg.data.shuffle = false;
  cfg.adamw.lr = 1e-2f;
  cfg.gradient_clipping = 1.0;
  return cfg;
}

TEST(Accumulation, EqualsOneBigBatch) {
  std::vector<int64_t> counts;
  train::Trainer big(tiny_config(3, 1), sft_like_data(&counts));
  train::Trainer acc(tiny_config(1, 3), sft_like_data(&counts));
  // The step's gradients, as the optimizer is about to read them (clipping is applied
  // inside it).
  std::vector<float> ga, gb;
  auto keep = [](train::Trainer& t, std::vector<float>& to) {
    t.set_grad_hook([&t, &to] {
      const Tensor g = t.model().params().flat_grads();
      to.assign(g.f32(), g.f32() + g.numel());
    });
  };
  keep(big, ga);
  keep(acc, gb);
  for (int s = 0; s < 2; ++s) {
    train::StepStats a = big.step(), b = acc.step();
    EXPECT_EQ(a.target_tokens, b.target_tokens);
    EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::fabs(a.loss));
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * a.grad_norm);
    ASSERT_EQ(ga.size(), gb.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < ga.size(); ++i) {
      num += std::pow(double(ga[i]) - gb[i], 2);
      den += std::pow(double(ga[i]), 2);
    }
    EXPECT_GT(den, 0.0) << "step " << s;
    EXPECT_LT(std::sqrt(num / den), 1e-5) << "step " << s;
    // The optimizer's pass left every gradient zero for the next step's accumulation (a
    // step that added to the previous step's gradients would differ from step 2 on).
    const Tensor left = acc.model().params().flat_grads();
    int64_t nonzero = 0;
    for (int64_t i = 0; i < left.numel(); ++i) nonzero += left.f32()[i] != 0.0f;
    EXPECT_EQ(nonzero, 0) << "step " << s;
  }
}

TEST(Accumulation, StepLossIsTokenMeanNotMeanOfMicroMeans) {
  // Recompute the step loss both ways from per-row losses at the initial weights: the
  // trainer must report the token mean, which differs from the mean of micro-batch means.
  std::vector<int64_t> counts;
  auto data = sft_like_data(&counts);
  const data::Dataset& ds = *data;
  train::Trainer acc(tiny_config(1, 3), std::move(data));
  auto model = train::build_model(tiny_config(1, 3).model, 42, "test");
  double sum = 0, mean_of_means = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < 3; ++r) {
    Tensor ids = Tensor::zeros({1, kT}, DType::I32), tg = Tensor::zeros({1, kT}, DType::I32);
    ds.get(r, ids.i32(), tg.i32());
    const Tensor& lg = model->forward(ids);
    const double s = kernels::cross_entropy_loss(lg.f32(), tg.i32(), kT, 64);
    sum += s;
    n += counts[r];
    mean_of_means += s / counts[r] / 3;
  }
  const double loss = acc.step().loss;
  EXPECT_NEAR(loss, sum / n, 1e-6);
  EXPECT_GT(std::fabs(loss - mean_of_means), 1e-4);
}

}  // namespace
}  // namespace loom
