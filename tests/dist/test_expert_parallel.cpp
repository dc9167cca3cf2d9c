// Expert parallelism (nn/moe.h) trains exactly like one process, under mpirun with 2 or 4
// ranks (ctest label `dist`): the tiny DeepSeek-V3 (two MoE layers of 8 routed experts,
// top-2 of 4 groups, a shared expert) for 20 steps with gradient accumulation 2, clipping
// and the auxiliary-loss-free bias update on: every loss and gradient norm, the eval loss
// before and after, and every final parameter and correction bias within 1e-5 relative of
// one process. Layouts: ep2 at ZeRO 0, 2 and 3 (2 ranks); ep4 at ZeRO 0 and 3, ep2 x dp2
// at ZeRO 0 and 1, and pp2 x ep2 (4 ranks); DeepSeek-V2 with its balance loss on at ep2;
// Qwen2-MoE at ep2 / ep4 (ZeRO-1); LoRA with dropout on the experts at dp2 and ep2
// (ZeRO-2). Each rank holds only its experts; a checkpoint saved at ep2 (full and LoRA)
// resumes on one process and at another layout. The token exchange's size is checked
// against its definition: the rows this rank routes to experts it does not hold, times the
// hidden size.
#include <gtest/gtest.h>

#include "common/equivalence.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/nn/moe.h"
#include "loom/train/plan.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using namespace test;  // the equivalence harness (common/equivalence.h)

nlohmann::json deepseek_config() {
  nlohmann::json j = base_config("llama");
  j["model"] = (fixture_dir() / "deepseek_v3_tiny").string();
  j["moe"] = {{"bias_update_rate", 1e-3}};
  return j;
}

// LoRA with dropout on every linear layer (lora_config()'s), the routed experts' included;
// no bias update (the adapter folder does not save the bias).
nlohmann::json deepseek_lora_config() {
  nlohmann::json j = deepseek_config();
  j.erase("moe");
  const nlohmann::json lora = lora_config();
  j["peft"] = lora["peft"];
  j["optimizer"] = lora["optimizer"];
  return j;
}

TEST(ExpertParallel, EveryLayoutEqualsOneProcess) {
  const nlohmann::json j = deepseek_config();
  const Trained ref = reference(j);
  const int n = g_world->size();
  std::vector<std::pair<int, int>> layouts;  // (ep size, ZeRO stage)
  if (n == 2) layouts = {{2, 0}, {2, 2}, {2, 3}};
  if (n == 4) layouts = {{4, 0}, {2, 0}, {2, 1}, {4, 3}};
  ASSERT_FALSE(layouts.empty()) << "run with 2 or 4 ranks";
  for (auto [ep, stage] : layouts) {
    nlohmann::json je = j;
    je["expert_parallel"] = {{"size", ep}};
    je["zero_optimization"] = {{"stage", stage}};
    const Trained got = train_on(je, *g_world, 20);
    expect_same(ref, got, 0,
                "ep" + std::to_string(ep) + " x dp" + std::to_string(n / ep) + " ZeRO-" +
                    std::to_string(stage));
  }
}

// DeepSeek-V2 (softmax, group_limited_greedy) with its sequence-wise balance loss on
// (aux_loss_alpha 0.01 written into a copy of the fixture's config.json): a mean over the
// global batch's sequences, so the layouts still equal one process.
TEST(ExpertParallel, V2WithBalanceLossEqualsOneProcess) {
  const fs::path dir = job_dir() / "deepseek_v2_aux";
  if (g_world->rank() == 0) {
    fs::create_directories(dir);
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(fixture_dir() / "deepseek_v2_tiny" / f, dir / f,
                    fs::copy_options::overwrite_existing);
    nlohmann::json c = io::read_json_file(dir / "config.json");
    c["aux_loss_alpha"] = 0.01;
    c["seq_aux"] = true;
    io::write_json_file(dir / "config.json", c);
  }
  g_world->barrier();
  nlohmann::json j = base_config("llama");
  j["model"] = dir.string();
  const Trained ref = reference(j);
  const int n = g_world->size();
  nlohmann::json je = j;
  je["expert_parallel"] = {{"size", 2}};
  je["zero_optimization"] = {{"stage", n == 4 ? 1 : 0}};
  const Trained got = train_on(je, *g_world, 20);
  expect_same(ref, got, 0, "V2 with balance loss, ep2 x dp" + std::to_string(n / 2));
}

// Qwen2-MoE (softmax top-2, a sigmoid-gated shared expert, a dense layer) under expert
// parallelism: the same exchange and engine, another model family.
TEST(ExpertParallel, Qwen2MoeEqualsOneProcess) {
  nlohmann::json j = base_config("llama");
  j["model"] = (fixture_dir() / "qwen2_moe_tiny").string();
  const Trained ref = reference(j);
  const int n = g_world->size();
  nlohmann::json je = j;
  je["expert_parallel"] = {{"size", n}};
  je["zero_optimization"] = {{"stage", 1}};
  expect_same(ref, train_on(je, *g_world, 20), 0, "Qwen2-MoE ep" + std::to_string(n));
}

// Expert parallelism inside each pipeline stage: pp2 x ep2 on 4 ranks (1F1B; the stages'
// activation contexts route through the same exchange).
TEST(ExpertParallel, WithPipelineStagesEqualsOneProcess) {
  if (g_world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const nlohmann::json j = deepseek_config();
  const Trained ref = reference(j);
  nlohmann::json je = j;
  je["expert_parallel"] = {{"size", 2}};
  je["pipeline_parallel"] = {{"size", 2}, {"schedule", "1f1b"}};
  const Trained got = train_on(je, *g_world, 20);
  expect_same(ref, got, 0, "pp2 x ep2");
}

// LoRA with dropout on every linear layer, the routed experts' included: their masks are
// keyed by the token's row in the global batch (not its place in an expert's rows), so
// data parallel (ZeRO-2) and ep2 drop what one process drops.
TEST(ExpertParallel, LoraWithDropoutOnExpertsEqualsOneProcess) {
  const nlohmann::json j = deepseek_lora_config();
  const Trained ref = reference(j);
  for (int ep : {1, 2}) {
    nlohmann::json je = j;
    je["expert_parallel"] = {{"size", ep}};
    je["zero_optimization"] = {{"stage", 2}};
    const Trained got = train_on(je, *g_world, 20);
    expect_same(ref, got, 0, "LoRA dropout, ep" + std::to_string(ep));
  }
}

// Each rank declares only its slice of the routed experts: the others' are not in its
// parameter store at all, its trainable elements are the one-process count less the
// experts it does not hold, and `loom plan` gives the engine's model-state bytes (ep2, the
// experts' ZeRO-1 shards over the dp ranks holding the same experts).
TEST(ExpertParallel, RanksHoldOnlyTheirExperts) {
  nlohmann::json j = deepseek_config();
  j.erase("gradient_accumulation_steps");
  j["zero_optimization"] = {{"stage", 1}};
  const int P = 2, r = g_world->rank() % P;
  auto config = [&](int ep, int world) {
    nlohmann::json je = j;
    je["expert_parallel"] = {{"size", ep}};
    je["train_micro_batch_size_per_gpu"] = 12 / world;
    return train::parse_config(je, "test", world);
  };
  const train::TrainConfig cfg = config(P, g_world->size());
  dist::ProcessMesh mesh(*g_world, 1, 1);
  train::Trainer t(cfg, nullptr, &mesh);
  const int64_t E = 8, L = E / P;
  int64_t expert_numel = 0;
  for (const models::MoeLayer& l : t.model().moe_layers())
    for (int64_t e = 0; e < E; ++e) {
      const std::string name =
          "model.layers." + std::to_string(l.layer) + ".mlp.experts." + std::to_string(e);
      const nn::Parameter* w = t.model().params().find(name + ".down_proj.weight");
      EXPECT_EQ(w != nullptr, e / L == r) << name << " on rank " << g_world->rank();
      if (w) {
        EXPECT_TRUE(w->expert);
        expert_numel += 3 * shape_numel(w->shape);  // gate, up, down: the same size
      }
    }
  EXPECT_GT(expert_numel, 0);
  dist::LocalComm one;
  dist::ProcessMesh one_mesh(one, 1, 1);
  train::Trainer whole(config(1, 1), nullptr, &one_mesh);
  EXPECT_EQ(t.model().params().trainable_numel(),
            whole.model().params().trainable_numel() - (P - 1) * expert_numel);
  const parallel::ZeroMemory planned = train::plan_layout(cfg, g_world->size()).stages.at(0).state;
  EXPECT_EQ(planned.model_state(), t.engine().memory().model_state());
  EXPECT_EQ(planned.buffers, t.engine().memory().buffers);
}

// A checkpoint saved under expert parallelism (each expert slice written by its own rank,
// the parts indexed as transformers shards a model) resumes on one process and at another
// ZeRO stage; a LoRA run's adapter folder (expert adapters from every slice, merged) too.
TEST(ExpertParallel, CheckpointResumesOnOneProcess) {
  for (const bool lora : {false, true}) {
    const nlohmann::json j = lora ? deepseek_lora_config() : deepseek_config();
    const std::string what = lora ? "LoRA " : "";
    const Trained ref = reference(j);
    const fs::path ck = job_dir() / (lora ? "ep-lora-ck" : "ep-ck");
    nlohmann::json je = j;
    je["expert_parallel"] = {{"size", 2}};
    je["zero_optimization"] = {{"stage", 2}};
    train_on(je, *g_world, 10, ck);
    nlohmann::json jr = j;
    jr["resume_from"] = ck.string();
    expect_same(ref, reference(jr), 10, what + "ep2 ZeRO-2 checkpoint resumed on 1 process");
    jr["expert_parallel"] = {{"size", g_world->size()}};
    jr["zero_optimization"] = {{"stage", lora ? 0 : 3}};
    expect_same(ref, train_on(jr, *g_world, 20), 10,
                what + "ep2 ZeRO-2 checkpoint resumed at ep" + std::to_string(g_world->size()));
  }
}

TEST(ExpertParallel, ExchangeSendsTheRowsOfOtherRanksExperts) {
  nlohmann::json j = deepseek_config();
  j["expert_parallel"] = {{"size", g_world->size()}};
  j.erase("gradient_accumulation_steps");
  j["train_micro_batch_size_per_gpu"] = 12 / g_world->size();
  train::TrainConfig cfg = train::parse_config(j, "test", g_world->size());
  dist::ProcessMesh mesh(*g_world, 1, 1);
  train::Trainer t(cfg, nullptr, &mesh);
  t.step();
  const int P = g_world->size(), r = g_world->rank();
  for (const models::MoeLayer& l : t.model().moe_layers()) {
    // The last micro-batch's routing: rows for experts of other ranks, times C.
    const std::vector<int32_t>& idx = l.moe->router().experts();
    const int64_t E = 8, C = 32;
    int64_t away = 0;
    for (int32_t e : idx) away += (e / (E / P)) != r;
    EXPECT_EQ(l.moe->dispatch_floats(), away * C) << "layer " << l.layer;
  }
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) { return loom::test::run_equivalence_tests(argc, argv); }
