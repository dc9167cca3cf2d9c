// loom verify's comparison (train/verify.h): equal runs pass, and a difference in one
// step, one eval loss or one parameter element is found, named and fails the verdict; the
// one-process config keeps the job's global batch and micro batch.
#include <gtest/gtest.h>

#include <cmath>

#include "common/test_util.h"
#include "loom/train/config.h"
#include "loom/train/verify.h"

namespace loom {
namespace {

train::RunRecord sample_run() {
  train::RunRecord r;
  r.losses = {5.5, 5.1, 4.8};
  r.grad_norms = {2.0, 1.5, 1.2};
  r.eval_losses = {5.4, 4.9};
  r.params["a.weight"] = {1.0f, -2.0f, 3.0f, 0.5f};
  r.params["b.bias"] = {0.25f, 0.125f};
  return r;
}

TEST(Verify, IdenticalRunsAreEqual) {
  const train::RunRecord r = sample_run();
  const train::VerifyReport rep = train::compare_runs(r, r, 0.0);
  EXPECT_TRUE(rep.equal);
  EXPECT_EQ(rep.worst.rel, 0.0);
  EXPECT_EQ(rep.steps.size(), 3u * 2 + 2);
  EXPECT_EQ(rep.params.size(), 2u);
}

TEST(Verify, RoundingNoiseIsWithinTolerance) {
  train::RunRecord got = sample_run();
  got.losses[1] *= 1 + 3e-8;
  got.params["a.weight"][2] = std::nextafter(3.0f, 4.0f);
  const train::VerifyReport rep = train::compare_runs(got, sample_run(), 1e-5);
  EXPECT_TRUE(rep.equal);
  EXPECT_GT(rep.worst.rel, 0.0);
}

TEST(Verify, OneWrongParameterElementIsFoundAndNamed) {
  train::RunRecord got = sample_run();
  got.params["b.bias"][1] += 1e-3f;  // |diff| / |b.bias| = 1e-3 / 0.2795
  const train::VerifyReport rep = train::compare_runs(got, sample_run(), 1e-5);
  EXPECT_FALSE(rep.equal);
  EXPECT_EQ(rep.worst.what, "b.bias");
  EXPECT_NEAR(rep.worst.rel, 1e-3 / std::sqrt(0.25 * 0.25 + 0.125 * 0.125), 1e-6);
}

TEST(Verify, OneWrongStepIsFoundAndNamed) {
  train::RunRecord got = sample_run();
  got.grad_norms[2] = 1.3;
  const train::VerifyReport rep = train::compare_runs(got, sample_run(), 1e-5);
  EXPECT_FALSE(rep.equal);
  EXPECT_EQ(rep.worst.what, "gradient norm, step 3");
  EXPECT_NEAR(rep.worst.rel, 0.1 / 1.2, 1e-12);
}

TEST(Verify, EvalLossOnOneSideOnlyIsADifference) {
  train::RunRecord got = sample_run(), want = sample_run();
  want.eval_losses = {std::nan(""), std::nan("")};  // no validation data: equal to itself
  EXPECT_TRUE(train::compare_runs(want, want, 0.0).equal);
  const train::VerifyReport rep = train::compare_runs(got, want, 1e-5);
  EXPECT_FALSE(rep.equal);
  EXPECT_EQ(rep.worst.what, "eval loss before training");
}

TEST(Verify, RunsOfDifferentLengthsAreAnError) {
  train::RunRecord got = sample_run();
  got.losses.pop_back();
  got.grad_norms.pop_back();
  EXPECT_NE(test::error_of([&] {
              train::compare_runs(got, sample_run(), 1e-5);
            }).find("different numbers of steps"),
            std::string::npos);
  got = sample_run();
  got.params.erase("b.bias");
  got.params["c.weight"] = {0.0f, 0.0f};
  EXPECT_NE(test::error_of([&] { train::compare_runs(got, sample_run(), 1e-5); }).find("b.bias"),
            std::string::npos);
}

TEST(Verify, OneProcessConfigKeepsTheGlobalBatch) {
  const nlohmann::json j = {{"model",
                             {{"arch", "gpt2"},
                              {"n_layer", 1},
                              {"n_embd", 8},
                              {"n_head", 2},
                              {"vocab_size", 256},
                              {"n_positions", 16}}},
                            {"data", {{"path", "x.txt"}}},
                            {"train_micro_batch_size_per_gpu", 2},
                            {"train_batch_size", 12}};
  const train::TrainConfig job = train::parse_config(j, "test", 3);
  ASSERT_EQ(job.grad_accum, 2);
  const train::TrainConfig one =
      train::parse_config(train::one_process_config(job), "test (one process)", 1);
  EXPECT_EQ(one.train_batch, 12);
  EXPECT_EQ(one.micro_batch, 2);
  EXPECT_EQ(one.grad_accum, 6);
}

}  // namespace
}  // namespace loom
