// Pipeline parallelism trains exactly like one process (ctest label `dist`; run on 2, 4 and
// 8 ranks, each case on the world size it names): 20 steps with clipping, every loss,
// gradient norm, eval loss and final full parameter within 1e-5 relative of one process
// (common/equivalence.h), for
//   - pp2 (2 ranks) and pp4 (4 ranks) with m = 1, p and 4p micro-batches, GPipe and 1F1B;
//     interleaved pp2 x v2 with m = 4 and 8;
//   - tied (GPT-2, Llama) and untied (Qwen2, with q/k/v bias) models, uneven partitions;
//   - dp2 x pp2 at ZeRO 0, 1, 2 and 3 (DeepSpeed refuses 2 and 3 with a pipeline: here the
//     stage's activation contexts share the engine's views, and the tied embedding's
//     gradients are summed after the dp reduction), tp2 x pp2 (with sequence parallel
//     too), and dp2 x tp2 x pp2 on 8 ranks (oversubscribed);
//   - LoRA with dropout at pp2 (x dp2): the run, and the adapter folder it saves;
//   - activation checkpointing (full uniform and block, selective) at pp2 with LoRA dropout,
//     interleaved, tp2 x pp2 with sequence parallel, and dp2 x pp2 at ZeRO-3;
//   - a checkpoint saved at pp2 x tp2 resumed on one process, at dp2 with ZeRO-2 and at pp4.
// `loom verify` checks in addition that the tied embedding's two copies end bitwise equal.
#include <gtest/gtest.h>

#include "common/equivalence.h"

namespace loom {
namespace {

using namespace test;  // the equivalence harness

struct PpCase {
  std::string name, arch;
  int world, pp, m;
  std::string schedule = "1f1b";
  int tp = 1, zero = 0;
  bool sequence_parallel = false;
  nlohmann::json partition = nullptr;  // default: uniform
  int virtual_stages = 1;
  nlohmann::json checkpointing = nullptr;  // activation_checkpointing; default: none
};
void PrintTo(const PpCase& c, std::ostream* os) { *os << c.name; }
PpCase with_checkpointing(PpCase c, nlohmann::json ac) {
  c.checkpointing = std::move(ac);
  return c;
}

constexpr int kBatch = 16;  // the global batch of every case

// The case's model at batch 16 (GPT-2 with 4 layers, so that pp4 has one per stage).
nlohmann::json model_config(const std::string& arch) {
  nlohmann::json j = arch == "lora" ? lora_config() : base_config(arch);
  if (arch == "gpt2") j["model"]["n_layer"] = 4;
  j["train_batch_size"] = kBatch;
  return j;
}

const Trained& one_process(const std::string& arch) {
  static std::map<std::string, Trained> refs;
  auto it = refs.find(arch);
  if (it == refs.end()) it = refs.emplace(arch, reference(model_config(arch))).first;
  return it->second;
}

nlohmann::json pp_config(const PpCase& c) {
  nlohmann::json j = model_config(c.arch);
  const int dp = c.world / (c.pp * c.tp);
  j["gradient_accumulation_steps"] = c.m;
  j["train_micro_batch_size_per_gpu"] = kBatch / (c.m * dp);
  j["pipeline_parallel"] = {
      {"size", c.pp}, {"schedule", c.schedule}, {"virtual_stages", c.virtual_stages}};
  if (!c.partition.is_null()) j["pipeline_parallel"]["partition"] = c.partition;
  j["tensor_parallel"] = {{"size", c.tp}, {"sequence_parallel", c.sequence_parallel}};
  j["zero_optimization"] = {{"stage", c.zero}};
  if (!c.checkpointing.is_null()) j["activation_checkpointing"] = c.checkpointing;
  return j;
}

class PipelineTraining : public ::testing::TestWithParam<PpCase> {};

TEST_P(PipelineTraining, EqualsOneProcess) {
  const PpCase& c = GetParam();
  if (g_world->size() != c.world) GTEST_SKIP() << "runs on " << c.world << " ranks";
  const Trained& ref = one_process(c.arch);
  const Trained got = train_on(pp_config(c), *g_world, 20);
  expect_same(ref, got, 0, c.name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineTraining,
    ::testing::Values(
        // pp2 alone: m = 1, p, 4p under both schedules.
        PpCase{"gpt2_pp2_1f1b_m1", "gpt2", 2, 2, 1}, PpCase{"gpt2_pp2_1f1b_m2", "gpt2", 2, 2, 2},
        PpCase{"gpt2_pp2_1f1b_m8", "gpt2", 2, 2, 8},
        PpCase{"gpt2_pp2_gpipe_m1", "gpt2", 2, 2, 1, "gpipe"},
        PpCase{"gpt2_pp2_gpipe_m2", "gpt2", 2, 2, 2, "gpipe"},
        PpCase{"gpt2_pp2_gpipe_m8", "gpt2", 2, 2, 8, "gpipe"},
        PpCase{"qwen2_untied_pp2_m4", "qwen2", 2, 2, 4},
        PpCase{"gpt2_pp2_uneven_3_1", "gpt2", 2, 2, 4, "1f1b", 1, 0, false, {3, 1}},
        // Interleaved: 2 ranks x 2 chunks of one layer each.
        PpCase{"gpt2_pp2_v2_m4", "gpt2", 2, 2, 4, "interleaved", 1, 0, false, nullptr, 2},
        PpCase{"gpt2_pp2_v2_m8", "gpt2", 2, 2, 8, "interleaved", 1, 0, false, nullptr, 2},
        // pp4: m = 1, p, 4p under both schedules.
        PpCase{"gpt2_pp4_1f1b_m1", "gpt2", 4, 4, 1}, PpCase{"gpt2_pp4_1f1b_m4", "gpt2", 4, 4, 4},
        PpCase{"gpt2_pp4_1f1b_m16", "gpt2", 4, 4, 16},
        PpCase{"gpt2_pp4_gpipe_m1", "gpt2", 4, 4, 1, "gpipe"},
        PpCase{"gpt2_pp4_gpipe_m4", "gpt2", 4, 4, 4, "gpipe"},
        PpCase{"gpt2_pp4_gpipe_m16", "gpt2", 4, 4, 16, "gpipe"},
        // Hybrids on 4 ranks, and the uneven cut the other way.
        PpCase{"gpt2_dp2_pp2_zero1", "gpt2", 4, 2, 2, "1f1b", 1, 1},
        PpCase{"gpt2_dp2_pp2_zero2", "gpt2", 4, 2, 4, "1f1b", 1, 2},
        PpCase{"llama_dp2_pp2_zero3", "llama", 4, 2, 2, "gpipe", 1, 3},
        PpCase{"llama_tied_dp2_pp2", "llama", 4, 2, 4, "gpipe"},
        PpCase{"qwen2_dp2_pp2_zero1", "qwen2", 4, 2, 2, "1f1b", 1, 1},
        PpCase{"gpt2_dp2_pp2_uneven_1_3", "gpt2", 4, 2, 2, "1f1b", 1, 0, false, {1, 3}},
        PpCase{"gpt2_dp2_pp2_v2_m4_zero1", "gpt2", 4, 2, 4, "interleaved", 1, 1, false, nullptr, 2},
        PpCase{"gpt2_tp2_pp2", "gpt2", 4, 2, 2, "1f1b", 2},
        PpCase{"llama_tp2_pp2_sp", "llama", 4, 2, 4, "1f1b", 2, 0, true},
        PpCase{"lora_dropout_dp2_pp2", "lora", 4, 2, 2, "1f1b", 1, 1},
        // Activation checkpointing (against one process without): every context recomputes.
        with_checkpointing(PpCase{"lora_dropout_pp2_ckpt_full", "lora", 2, 2, 4},
                           {{"granularity", "full"}}),
        with_checkpointing(PpCase{"gpt2_pp2_v2_m4_ckpt_full_block", "gpt2", 2, 2, 4, "interleaved",
                                  1, 0, false, nullptr, 2},
                           {{"granularity", "full"}, {"method", "block"}, {"num_layers", 1}}),
        with_checkpointing(PpCase{"gpt2_tp2_pp2_sp_ckpt_selective", "gpt2", 4, 2, 2, "1f1b", 2, 0,
                                  true},
                           {{"granularity", "selective"}}),
        with_checkpointing(PpCase{"llama_dp2_pp2_zero3_ckpt_full", "llama", 4, 2, 2, "gpipe", 1, 3},
                           {{"granularity", "full"}, {"num_layers", 2}}),
        // 3D on 8 ranks.
        PpCase{"gpt2_dp2_tp2_pp2_zero1", "gpt2", 8, 2, 2, "1f1b", 2, 1},
        PpCase{"llama_dp2_tp2_pp2_zero1_gpipe", "llama", 8, 2, 4, "gpipe", 2, 1}),
    [](const ::testing::TestParamInfo<PpCase>& i) { return i.param.name; });

// LoRA (dropout on) at pp2 (x dp2 on 4 ranks): the adapter folder, written by both stages
// and merged, equals the one-process adapter.
TEST(PipelineLora, Pp2AdapterEqualsOneProcess) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "world " << g_world->size();
  const fs::path one = job_dir() / "pp-lora-one", split = job_dir() / "pp-lora-pp2";
  const Trained ref = reference(model_config("lora"), 20, one);
  const PpCase c{"", "lora", g_world->size(), 2, 2};
  const Trained got = train_on(pp_config(c), *g_world, 20, split);
  expect_same(ref, got, 0, "LoRA pp2");
  expect_same_adapter(one, split, "LoRA pp2");
}

// A checkpoint saved at pp2 x tp2 after 10 steps (an HF folder in one part per stage, and
// every rank's optimizer state) continues on one process, at dp2 with ZeRO-2 and at pp4
// exactly as the uninterrupted run.
TEST(PipelineResume, Pp2Tp2CheckpointContinuesOnOneProcessAtZero2AndAtPp4) {
  if (g_world->size() != 4) GTEST_SKIP() << "runs on 4 ranks";
  const Trained& ref = one_process("gpt2");
  const fs::path ck = job_dir() / "pp-resume-ck";
  train_on(pp_config({"", "gpt2", 4, 2, 2, "1f1b", 2}), *g_world, 10, ck);
  if (g_world->rank() == 0) {
    EXPECT_TRUE(fs::exists(ck / "model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(ck / "model-00002-of-00002.safetensors"));
  }
  nlohmann::json jr = model_config("gpt2");
  jr["resume_from"] = ck.string();
  expect_same(ref, reference(jr), 10, "pp2 x tp2 checkpoint resumed on 1 process");
  nlohmann::json j2 = jr;  // on ranks 0 and 1, the others wait
  j2["zero_optimization"] = {{"stage", 2}};
  std::unique_ptr<dist::Communicator> pair = g_world->split(g_world->rank() < 2 ? 0 : 1, 0);
  Trained on_two;
  if (g_world->rank() < 2) on_two = train_on(j2, *pair, 20);
  g_world->barrier();
  expect_same(ref, on_two, 10, "pp2 x tp2 checkpoint resumed at dp2 ZeRO-2");
  nlohmann::json j4 = pp_config({"", "gpt2", 4, 4, 4});
  j4["resume_from"] = ck.string();
  expect_same(ref, train_on(j4, *g_world, 20), 10, "pp2 x tp2 checkpoint resumed at pp4");
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) { return loom::test::run_equivalence_tests(argc, argv); }
