// What a run does when something goes wrong in it (issue 17's "runs people can trust"):
// a non-finite gradient in fp32 training stops the run at that step, naming the step and
// the first parameter (and element) whose gradient is not finite, before the optimizer
// changes any parameter or moment.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/test_util.h"
#include "loom/data/dataset.h"
#include "loom/train/trainer.h"

namespace loom {
namespace {

train::TrainConfig tiny_gpt2() {
  train::TrainConfig c;
  c.model = {{"arch", "gpt2"}, {"n_layer", 2},     {"n_embd", 32},
             {"n_head", 4},    {"vocab_size", 64}, {"n_positions", 16}};
  c.micro_batch = 2;
  c.grad_accum = 2;
  c.train_batch = 4;
  c.train_steps = 10;
  c.seed = 3;
  c.adamw.lr = 1e-3f;
  return c;
}

std::unique_ptr<data::Dataset> rows(int64_t n, int64_t T, int V) {
  return std::make_unique<data::RandomTokenDataset>(V, T, n, 7);
}

std::vector<float> values(train::Trainer& t) {
  const Tensor v = t.model().params().flat_values();
  return std::vector<float>(v.f32(), v.f32() + v.numel());
}

TEST(NonFiniteGradient, StopsNamingTheStepAndTheParameterBeforeTheUpdate) {
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    train::Trainer t(tiny_gpt2(), rows(32, 16, 64));
    const std::string name = "transformer.h.1.mlp.c_fc.weight";
    nn::Parameter* p = t.model().params().find(name);
    ASSERT_NE(p, nullptr);
    t.set_grad_hook([&] {
      if (t.steps_done() == 2) p->grad.f32()[37] = bad;  // the third step
    });
    t.step();
    t.step();
    const std::vector<float> before = values(t);
    const std::vector<float> moments(
        t.engine().optimizer().exp_avg().f32(),
        t.engine().optimizer().exp_avg().f32() + t.engine().optimizer().exp_avg().numel());
    const std::string err = test::error_of([&] { t.step(); });
    EXPECT_NE(err.find("step 3: the gradient is not finite"), std::string::npos) << err;
    // GPT-2's c_fc is stored transposed from HF's Conv1D; the element is in Loom's layout.
    EXPECT_NE(err.find("the first is " + name + "[37] = " + std::to_string(bad)), std::string::npos)
        << err;
    EXPECT_EQ(values(t), before) << "the parameters moved";
    EXPECT_EQ(0, std::memcmp(moments.data(), t.engine().optimizer().exp_avg().f32(),
                             moments.size() * sizeof(float)))
        << "the moments moved";
  }
}

// The first non-finite gradient in parameter order is the one named, whichever was
// planted first.
TEST(NonFiniteGradient, NamesTheFirstInParameterOrder) {
  train::Trainer t(tiny_gpt2(), rows(32, 16, 64));
  t.set_grad_hook([&] {
    t.model().params().find("transformer.h.1.attn.c_proj.weight")->grad.f32()[0] = NAN;
    t.model().params().find("transformer.h.0.ln_2.weight")->grad.f32()[5] = NAN;
  });
  const std::string err = test::error_of([&] { t.step(); });
  EXPECT_NE(err.find("the first is transformer.h.0.ln_2.weight[5]"), std::string::npos) << err;
}

}  // namespace
}  // namespace loom
