// Every data-parallel layout trains exactly like one process (the correctness oracle of
// DESIGN.md), run under mpirun with 2, 3 or 4 ranks (ctest label `dist`):
//   - 20 steps of a small GPT-2 and a small Llama, gradient accumulation 2, clipping on, on
//     SFT rows whose micro-batches hold different numbers of target tokens: every step's
//     loss within 1e-5 relative and the final parameters within 1e-5 relative, for DP
//     (stage 0) and ZeRO stages 1, 2 and 3; the eval loss (validation rows split over the
//     ranks) before and after training, within 1e-5 relative too;
//   - LoRA under ZeRO-3: the adapter folder it saves holds the full tensors and equals the
//     one-process adapter;
//   - resume: a ZeRO-3 checkpoint after 10 steps continues on one process, at ZeRO-2 on the
//     same ranks, and (saved on 4) at ZeRO-2 on 2 ranks, exactly as the uninterrupted run;
//   - tensor parallelism: GPT-2 (tied) at tp2 and tp4, Llama GQA at tp2 and tp4 (key/value
//     heads replicated), Qwen2 (q/k/v bias, untied) at tp2, each with and without sequence
//     parallel, and tp2 with ZeRO 1, 2, 3 over the dp group (tp2 x dp2 on 4 ranks), the same
//     20 steps; LoRA (dropout on) at tp2, its adapter folder equal to one process's; a tp2
//     (x dp2) checkpoint resumed on one process, at tp4 and at ZeRO-2;
//   - activation checkpointing at tp2 (sequence parallel), at ZeRO-3 and with LoRA dropout,
//     against one process without it.
// The one-process reference runs on rank 0 alone (a LocalComm) while the others wait.
#include <gtest/gtest.h>

#include "common/equivalence.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using namespace test;  // the equivalence harness (common/equivalence.h)

class ZeroEquivalence : public ::testing::TestWithParam<std::string> {};

TEST_P(ZeroEquivalence, EveryStageEqualsOneProcess) {
  const nlohmann::json j = base_config(GetParam());
  const Trained ref = reference(j);
  for (int stage = 0; stage <= 3; ++stage) {
    nlohmann::json js = j;
    js["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", 5000}};
    const Trained got = train_on(js, *g_world, 20);
    expect_same(ref, got, 0, GetParam() + " stage " + std::to_string(stage));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ZeroEquivalence, ::testing::Values("gpt2", "llama"));

// A non-finite gradient under ZeRO-2 lives in one rank's shard only: every rank still stops
// at that step (the norm is reduced over the job) and names the parameter; the rank that
// holds the element says which one.
TEST(NonFiniteGradient, UnderZero2EveryRankStopsAndNamesTheParameter) {
  nlohmann::json j = base_config("gpt2");
  j["zero_optimization"] = {{"stage", 2}};
  j.erase("gradient_accumulation_steps");
  j["train_micro_batch_size_per_gpu"] = 12 / g_world->size();
  train::TrainConfig cfg = train::parse_config(j, "test", g_world->size());
  dist::ProcessMesh mesh(*g_world, 1, 1);
  train::Trainer t(cfg, nullptr, &mesh);
  const std::string name = "transformer.h.1.mlp.c_proj.weight";
  nn::Parameter* p = t.model().params().find(name);
  ASSERT_NE(p, nullptr);
  t.set_grad_hook([&] {
    if (t.steps_done() != 1) return;
    Tensor extra = Tensor::zeros(p->shape);
    extra.f32()[p->value.numel() - 1] = NAN;  // in the last rank's piece of its unit
    t.engine().add_to_reduced_grad(*p, extra);
  });
  t.step();
  const std::string err = test::error_of([&] { t.step(); });
  EXPECT_NE(err.find("step 2: the gradient is not finite"), std::string::npos) << err;
  EXPECT_NE(err.find("the first is " + name), std::string::npos) << err;
  const bool owner = g_world->rank() == g_world->size() - 1;
  std::string element = std::to_string(p->value.numel() - 1);
  element.insert(0, 1, '[');
  element.append("] = nan");
  EXPECT_EQ(err.find(element) != std::string::npos, owner) << err;
}

TEST(ZeroLora, Stage3AdapterEqualsOneProcess) {
  nlohmann::json j = lora_config();
  const fs::path one = job_dir() / "lora-one", zero3 = job_dir() / "lora-zero3";
  const Trained ref = reference(j, 20, one);
  j["zero_optimization"] = {{"stage", 3}};
  const Trained got = train_on(j, *g_world, 20, zero3);
  expect_same(ref, got, 0, "LoRA ZeRO-3");
  expect_same_adapter(one, zero3, "LoRA ZeRO-3");
}

TEST(ZeroResume, Stage3CheckpointContinuesOnOneProcessAndAtStage2) {
  nlohmann::json j = base_config("gpt2");
  const Trained ref = reference(j);
  const fs::path ck = job_dir() / "resume-ck";
  nlohmann::json j3 = j;
  j3["zero_optimization"] = {{"stage", 3}};
  train_on(j3, *g_world, 10, ck);  // saved after step 10
  // On one process (rank 0 alone).
  nlohmann::json jr = j;
  jr["resume_from"] = ck.string();
  const Trained one = reference(jr);
  expect_same(ref, one, 10, "ZeRO-3 checkpoint resumed on 1 process");
  // At ZeRO-2 on every rank.
  jr["zero_optimization"] = {{"stage", 2}};
  const Trained two = train_on(jr, *g_world, 20);
  expect_same(ref, two, 10, "ZeRO-3 checkpoint resumed at ZeRO-2");
  // Saved on 4 ranks, resumed at ZeRO-2 on 2 (ranks 0 and 1; the others wait).
  if (g_world->size() >= 4) {
    std::unique_ptr<dist::Communicator> pair = g_world->split(g_world->rank() < 2 ? 0 : 1, 0);
    Trained on_two;
    if (g_world->rank() < 2) on_two = train_on(jr, *pair, 20);
    g_world->barrier();
    expect_same(ref, on_two, 10, "ZeRO-3 checkpoint from 4 ranks resumed at ZeRO-2 on 2");
  }
}

// Activation checkpointing (models/causal_lm.h) under tensor parallel (its recompute repeats
// the collectives) and ZeRO-3 (its recompute runs on the parameters the backward gathered),
// with LoRA dropout too, against one process without it.
TEST(ActivationCheckpointing, UnderTp2AndZero3EqualsOneProcessWithout) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "world " << g_world->size();
  nlohmann::json j = base_config("gpt2");
  j["tensor_parallel"] = {{"size", 2}, {"sequence_parallel", true}};
  j["activation_checkpointing"] = {{"granularity", "full"}};
  expect_same(reference_of("gpt2"), train_on(j, *g_world, 20), 0, "gpt2 tp2 sp, full");
  j = base_config("llama");
  j["zero_optimization"] = {{"stage", 3}};
  j["activation_checkpointing"] = {{"granularity", "full"}, {"num_layers", 2}};
  expect_same(reference_of("llama"), train_on(j, *g_world, 20), 0, "llama ZeRO-3, full 2");
  j = lora_config();
  const Trained ref = reference(j);
  j["zero_optimization"] = {{"stage", 3}};
  j["activation_checkpointing"] = {{"granularity", "selective"}};
  expect_same(ref, train_on(j, *g_world, 20), 0, "LoRA dropout ZeRO-3, selective");
  j["tensor_parallel"] = {{"size", 2}};
  j["activation_checkpointing"] = {{"granularity", "full"}, {"method", "block"}};
  expect_same(ref, train_on(j, *g_world, 20), 0, "LoRA dropout tp2 ZeRO-3, full block");
}

// ---------------------------------------------------------------------------------------
// Tensor parallelism (alone, and with data parallelism and ZeRO over the dp group).

struct TpCase {
  std::string name, arch;
  int tp;
  bool sequence_parallel;
  int zero_stage;
};
void PrintTo(const TpCase& c, std::ostream* os) { *os << c.name; }

nlohmann::json tp_config(const TpCase& c) {
  nlohmann::json j = base_config(c.arch);
  j["tensor_parallel"] = {{"size", c.tp}, {"sequence_parallel", c.sequence_parallel}};
  j["zero_optimization"] = {{"stage", c.zero_stage}};
  return j;
}

class TensorParallelTraining : public ::testing::TestWithParam<TpCase> {};

// 20 steps, accumulation 2, clipping: every loss, gradient norm, eval loss and final full
// parameter within 1e-5 of one process. With 4 ranks, tp2 runs as tp2 x dp2.
TEST_P(TensorParallelTraining, EqualsOneProcess) {
  const TpCase& c = GetParam();
  if (g_world->size() % c.tp != 0) GTEST_SKIP() << "world " << g_world->size();
  const Trained& ref = reference_of(c.arch);
  const Trained got = train_on(tp_config(c), *g_world, 20);
  expect_same(ref, got, 0, c.name + " on " + std::to_string(g_world->size()) + " ranks");
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TensorParallelTraining,
    ::testing::Values(
        TpCase{"gpt2_tp2", "gpt2", 2, false, 0}, TpCase{"gpt2_tp4", "gpt2", 4, false, 0},
        TpCase{"llama_gqa_tp2", "llama", 2, false, 0},
        TpCase{"llama_gqa_tp4_kv_replicated", "llama", 4, false, 0},
        TpCase{"qwen2_tp2", "qwen2", 2, false, 0}, TpCase{"gpt2_tp2_sp", "gpt2", 2, true, 0},
        TpCase{"gpt2_tp4_sp", "gpt2", 4, true, 0}, TpCase{"llama_gqa_tp2_sp", "llama", 2, true, 0},
        TpCase{"llama_gqa_tp4_kv_replicated_sp", "llama", 4, true, 0},
        TpCase{"qwen2_tp2_sp", "qwen2", 2, true, 0}, TpCase{"gpt2_tp2_zero1", "gpt2", 2, false, 1},
        TpCase{"gpt2_tp2_sp_zero2", "gpt2", 2, true, 2},
        TpCase{"llama_tp2_zero2", "llama", 2, false, 2},
        TpCase{"llama_tp2_zero3", "llama", 2, false, 3}),
    [](const ::testing::TestParamInfo<TpCase>& i) { return i.param.name; });

// LoRA (dropout on) on every linear layer at tp2 (x dp2 on 4 ranks): the run and the adapter
// folder it saves equal one process's.
TEST(TensorParallelLora, Tp2AdapterEqualsOneProcess) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "world " << g_world->size();
  nlohmann::json j = lora_config();
  const fs::path one = job_dir() / "tp-lora-one", split = job_dir() / "tp-lora-tp2";
  const Trained ref = reference(j, 20, one);
  j["tensor_parallel"] = {{"size", 2}};
  const Trained got = train_on(j, *g_world, 20, split);
  expect_same(ref, got, 0, "LoRA tp2");
  expect_same_adapter(one, split, "LoRA tp2");
}

// A checkpoint saved at tp2 (x dp2 on 4 ranks) after 10 steps continues on one process and
// at tp4 exactly as the uninterrupted run: model and optimizer state in full coordinates.
TEST(TensorParallelResume, Tp2CheckpointContinuesOnOneProcessAndAtTp4) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "world " << g_world->size();
  const Trained& ref = reference_of("llama");
  const fs::path ck = job_dir() / "tp-resume-ck";
  train_on(tp_config({"", "llama", 2, false, 1}), *g_world, 10, ck);
  nlohmann::json jr = base_config("llama");
  jr["resume_from"] = ck.string();
  expect_same(ref, reference(jr), 10, "tp2 checkpoint resumed on 1 process");
  if (g_world->size() % 4 == 0) {
    jr["tensor_parallel"] = {{"size", 4}};
    expect_same(ref, train_on(jr, *g_world, 20), 10, "tp2 checkpoint resumed at tp4");
  }
  jr["tensor_parallel"] = {{"size", 1}};
  jr["zero_optimization"] = {{"stage", 2}};
  expect_same(ref, train_on(jr, *g_world, 20), 10, "tp2 checkpoint resumed at ZeRO-2");
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) { return loom::test::run_equivalence_tests(argc, argv); }
