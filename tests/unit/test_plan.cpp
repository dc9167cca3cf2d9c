// loom plan beyond the ZeRO table: each pipeline stage's bytes per rank against hand
// arithmetic (a small GPT-2, and Llama-2-70B's shapes at tp8 x pp8 x dp8, planned without
// allocating its parameters), and the layout search: fastest first, only what fits, the
// global batch kept, and a clear error when nothing fits.
#include <gtest/gtest.h>

#include <set>

#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/train/cost_model.h"
#include "loom/train/plan.h"

namespace loom {
namespace {

nlohmann::json small_gpt2() {
  return {{"model",
           {{"arch", "gpt2"},
            {"n_layer", 4},
            {"n_embd", 64},
            {"n_head", 4},
            {"vocab_size", 256},
            {"n_positions", 64}}},
          {"data", {{"path", "unused.txt"}, {"seq_len", 16}}},
          {"train_batch_size", 16}};
}

// GPT-2 (4 layers, d 64, 4 heads, vocabulary 256) on 4 ranks = 2 data-parallel x 2 stages,
// ZeRO-1, micro-batch 2 x 16 tokens, 4 per step, 1F1B. By hand:
//   block: ln_1 128 + c_attn 192x64 + 192 + c_proj 64x64 + 64 + ln_2 128 + c_fc 256x64 + 256
//          + c_proj 64x256 + 64 = 49,984 parameters
//   stage 0: wte 256x64 + wpe 64x64 (one unit, 20,480) + 2 blocks = 120,448
//   stage 1: 2 blocks + ln_f 128 + the tied head's copy of wte 16,384 = 116,480
//   ZeRO-1 over 2: weights and gradients whole, AdamW's two moments of the shard
//   (sum over units of ceil(unit / 2)), buffers 4 x (shard + every unit padded: all may be
//   staged for their reduce-scatters at once), and MPI's temporary of every unit besides
//   in flight under 1F1B: min(p - r, m) = 2 on stage 0, 1 on stage 1
//   activations (GPT2::activation_bytes, N = 32 tokens, C 64, H 256): per layer
//   N (6C + 4C + 2H) + N heads (the attention's log-sum-exp) = 36,992 floats, scratch N (5C + 4C +
//   2H) = 34,816, the stream N 2C = 4,096, logits N V = 8,192 on the last stage
TEST(Plan, PipelineStagesMatchHandArithmetic) {
  nlohmann::json j = small_gpt2();
  j["pipeline_parallel"] = {{"size", 2}, {"schedule", "1f1b"}};
  j["zero_optimization"] = {{"stage", 1}};
  j["train_micro_batch_size_per_gpu"] = 2;
  const train::LayoutPlan plan = train::plan_layout(train::parse_config(j, "test", 4), 4);
  ASSERT_EQ(plan.stages.size(), 2u);
  const train::StagePlan &s0 = plan.stages[0], &s1 = plan.stages[1];
  EXPECT_EQ(s0.layers, "0-1");
  EXPECT_EQ(s1.layers, "2-3");
  EXPECT_EQ(s0.state.params, 4 * 120448);
  EXPECT_EQ(s0.state.grads, 4 * 120448);
  EXPECT_EQ(s1.state.params, 4 * 116480);
  const int64_t shard0 = 10240 + 2 * 24992, shard1 = 2 * 24992 + 64 + 8192;
  EXPECT_EQ(s0.state.optimizer, 8 * shard0);
  EXPECT_EQ(s1.state.optimizer, 8 * shard1);
  EXPECT_EQ(s0.state.buffers, 4 * (shard0 + 120448));
  EXPECT_EQ(s0.in_flight, 2);
  EXPECT_EQ(s1.in_flight, 1);
  EXPECT_EQ(s0.activation_bytes, 4 * (2 * 36992 + 34816 + 4096));
  EXPECT_EQ(s1.activation_bytes, 4 * (2 * 36992 + 34816 + 4096 + 8192));
  EXPECT_EQ(s0.peak_bytes, train::calibration().process_bytes + 4 * 120448 * 2 + 8 * shard0 +
                               4 * (shard0 + 120448) + 4 * 120448 + 2 * s0.activation_bytes);
  EXPECT_EQ(plan.peak_bytes, std::max(s0.peak_bytes, s1.peak_bytes));
  // GPipe holds every micro-batch on every stage.
  j["pipeline_parallel"]["schedule"] = "gpipe";
  const train::LayoutPlan gpipe = train::plan_layout(train::parse_config(j, "test", 4), 4);
  EXPECT_EQ(gpipe.stages[0].in_flight, 4);
  EXPECT_EQ(gpipe.stages[1].in_flight, 4);
  const std::string r = train::plan_report(train::parse_config(j, "test", 4), 4);
  EXPECT_NE(r.find("0-1 (2)"), std::string::npos) << r;
  EXPECT_NE(r.find("x 4"), std::string::npos) << r;
}

// The ZeRO paper's Figure 1 (Rajbhandari et al. 2020): a 7.5B-parameter model on 64
// devices with mixed-precision Adam holds 2 + 2 + K = 16 bytes per parameter (K = 12: fp32
// master weights and both moments) -> 120 GB without ZeRO, 2Ψ + 2Ψ + KΨ/64 = 31.4 GB at
// stage 1, 2Ψ + 14Ψ/64 = 16.6 GB at stage 2, 16Ψ/64 = 1.9 GB at stage 3. The model is a
// GPT-2 config.json alone (tests/fixtures/gpt2_7.5b: 36 layers of d 4096 = 7,249,674,240,
// the tied 59,050-row vocabulary and 2048 positions x 4096, the final norm: Ψ =
// 7,499,939,840), planned in fp16 and in bf16 with 16-bit gradients (the paper's), and with
// fp32 gradient accumulation (Loom's default: 4-byte gradients).
TEST(Plan, ZeroPaperFigureOneAt7_5B) {
  const int64_t psi = 36 * (12LL * 4096 * 4096 + 13 * 4096) + (59050 + 2048) * 4096LL + 2 * 4096;
  EXPECT_EQ(psi, 7499939840);
  for (const char* precision : {"fp16", "bf16"}) {
    nlohmann::json j = small_gpt2();
    j["model"] = (test::fixture_dir() / "gpt2_7.5b").string();
    j["data"]["seq_len"] = 1024;
    j["train_batch_size"] = 64;
    j[precision] = {{"enabled", true}};
    j["data_types"] = {{"grad_accum_dtype", precision}};
    const double paper[] = {120.0, 31.4, 16.6, 1.9};
    for (int stage = 0; stage <= 3; ++stage) {
      j["zero_optimization"] = {{"stage", stage}};
      const train::LayoutPlan plan = train::plan_layout(train::parse_config(j, "test", 64), 64);
      const parallel::ZeroMemory& m = plan.stages[0].paper_state;
      // Exactly the paper's arithmetic on this Ψ, up to ZeRO's padding of each unit to a
      // multiple of 64 elements (under 64 elements per unit).
      const double sharded = 16.0 * psi / 64, whole[] = {16.0 * psi, 4.0 * psi, 2.0 * psi, 0};
      const double expect = whole[stage] + (stage == 0 ? 0 : sharded - whole[stage] / 64);
      EXPECT_NEAR(static_cast<double>(m.model_state()), expect, 16.0 * 64 * 40)
          << precision << " stage " << stage;
      EXPECT_NEAR(m.model_state() / 1e9, paper[stage], 0.05) << precision << " stage " << stage;
    }
    j["zero_optimization"] = {{"stage", 0}};
    const std::string r = train::plan_report(train::parse_config(j, "test", 64), 64);
    EXPECT_NE(r.find("mixed-precision layout (2-byte weights, 2-byte gradients, fp32 master and "
                     "moments sharded from stage 1), in GB: stage 0 120.0, stage 1 31.4, "
                     "stage 2 16.6, stage 3 1.9"),
              std::string::npos)
        << r;
    // With fp32 gradient accumulation (Loom's default): 4-byte gradients, 18 bytes per
    // parameter in the paper's layout, and the same in the engine's at stages 0-2 (stage 0
    // splits the 14 bytes of weights, master and moments as 4-byte f32 weights + 2-byte
    // copies + 8 bytes of moments); at stage 3 the engine keeps no 16-bit shard (each
    // gathered unit is rounded while it is held): 16 bytes per element of the shard.
    j["data_types"] = {{"grad_accum_dtype", "fp32"}};
    const double paper32[] = {18.0 * psi, 6.0 * psi + 12.0 * psi / 64, 2.0 * psi + 16.0 * psi / 64,
                              18.0 * psi / 64};
    const double loom[] = {paper32[0], paper32[1], paper32[2], 16.0 * psi / 64};
    for (int stage = 0; stage <= 3; ++stage) {
      j["zero_optimization"] = {{"stage", stage}};
      const train::LayoutPlan p32 = train::plan_layout(train::parse_config(j, "test", 64), 64);
      EXPECT_NEAR(p32.stages[0].paper_state.model_state() / 1e9, paper32[stage] / 1e9, 0.05)
          << stage;
      EXPECT_NEAR(p32.stages[0].state.model_state() / 1e9, loom[stage] / 1e9, 0.05) << stage;
    }
    // 16-bit accumulation in the engine (stages 2-3): the shard's gradients in 2 bytes, so
    // 2 + 14/64 and 14/64 per parameter.
    j["data_types"] = {{"grad_accum_dtype", precision}};
    const double loom16[] = {2.0 * psi + 14.0 * psi / 64, 14.0 * psi / 64};
    for (int stage : {2, 3}) {
      j["zero_optimization"] = {{"stage", stage}};
      const train::LayoutPlan p16 = train::plan_layout(train::parse_config(j, "test", 64), 64);
      EXPECT_NEAR(p16.stages[0].state.model_state() / 1e9, loom16[stage - 2] / 1e9, 0.05) << stage;
    }
  }
}

// Llama-2-70B's config.json alone (tests/fixtures/llama2_70b: no weights) at 512 ranks as
// tp8 x pp8 x dp8, ZeRO-1, 1F1B, 128 micro-batches per step. Per tp rank of stage 0
// (layers 0-9): the embedding's 32000 / 8 rows x 8192 = 32,768,000; per layer q and o
// 8192 x 1024 each, k and v one of the 8 KV heads 128 x 8192 each, the MLP 3 x 8192 x 3584,
// the norms 2 x 8192 = 106,971,136; so 1,102,479,360 parameters, 4,409,917,440 bytes of fp32
// weights. The last stage holds the final norm and the untied head's 4000 rows instead of
// the embedding. Planned without allocating any of it.
// Bytes each rank sends per step for N elements over 2 ranks, 3 micro-batches: a ring step
// moves half the buffer. Stage 2 reduce-scatters every micro-batch in the gradient's dtype
// and all-gathers the update once in the weights' (16-bit under mixed precision); stage 3
// gathers every unit for each micro-batch's forward and backward, in the same dtype; stage 0
// all-reduces once (twice a ring step).
TEST(Plan, ZeroTrafficFollowsTheWireDtypes) {
  const double N = 1000;
  train::Traffic t = train::zero_traffic(2, N, 1, 1e9, 2, 3);
  EXPECT_DOUBLE_EQ(t.reduce_scatter, 3 * 4 * N / 2);
  EXPECT_DOUBLE_EQ(t.all_gather, 4 * N / 2);
  t = train::zero_traffic(2, N, 1, 1e9, 2, 3, 2, 2);
  EXPECT_DOUBLE_EQ(t.reduce_scatter, 3 * 2 * N / 2);
  EXPECT_DOUBLE_EQ(t.all_gather, 2 * N / 2);
  t = train::zero_traffic(1, N, 1, 1e9, 2, 3, 4, 2);
  EXPECT_DOUBLE_EQ(t.reduce_scatter, 4 * N / 2);
  EXPECT_DOUBLE_EQ(t.all_gather, 2 * N / 2);
  t = train::zero_traffic(3, N, 1, 1e9, 2, 3, 4, 2);
  EXPECT_DOUBLE_EQ(t.reduce_scatter, 3 * 4 * N / 2);
  EXPECT_DOUBLE_EQ(t.all_gather, 2 * 3 * 2 * N / 2);
  EXPECT_DOUBLE_EQ(train::zero_traffic(3, N, 1, 1e9, 2, 3).all_gather, 2 * 3 * 4 * N / 2);
  EXPECT_DOUBLE_EQ(train::zero_traffic(0, N, 1, 1e9, 2, 3, 2, 2).all_reduce, 2 * N);
}

TEST(Plan, Llama2_70BAtTp8Pp8Dp8) {
  nlohmann::json j = io::read_json_file(test::source_dir() / "configs/plan-llama2-70b.json");
  j["model"] = (test::fixture_dir() / "llama2_70b").string();
  const train::TrainConfig cfg = train::parse_config(j, "plan-llama2-70b.json", 512);
  const int64_t live = storage_stats().live_bytes;
  reset_storage_peak();
  const train::LayoutPlan plan = train::plan_layout(cfg, 512);
  EXPECT_LT(storage_stats().peak_bytes - live, 1 << 20) << "the plan allocated parameters";
  ASSERT_EQ(plan.stages.size(), 8u);
  const int64_t layer = 2 * 8192 * 1024 + 2 * 128 * 8192 + 3 * 8192 * 3584 + 2 * 8192;
  EXPECT_EQ(layer, 106971136);
  EXPECT_EQ(plan.stages[0].state.params, 4409917440);
  EXPECT_EQ(plan.stages[0].state.params, 4 * (32768000 + 10 * layer));
  EXPECT_EQ(plan.stages[3].state.params, 4 * 10 * layer);
  EXPECT_EQ(plan.stages[7].state.params, 4 * (10 * layer + 8192 + 32768000));
  // ZeRO-1 over 8: AdamW's moments are an eighth (every unit divides by 8).
  EXPECT_EQ(plan.stages[0].state.optimizer, 4409917440 / 8 * 2);
  EXPECT_EQ(plan.stages[0].state.grads, 4409917440);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(plan.stages[r].in_flight, 8 - r) << "stage " << r;
  EXPECT_EQ(plan.stages[0].layers, "0-9");
  EXPECT_EQ(plan.stages[7].layers, "70-79");
}

TEST(Plan, LayoutsFastestFirstKeepTheGlobalBatch) {
  const train::TrainConfig cfg = train::parse_config(small_gpt2(), "test", 1);
  const std::vector<train::LayoutPlan> all = train::runnable_layouts(cfg, 4);
  ASSERT_GT(all.size(), 10u);
  std::set<std::pair<int, int>> tp_pp;
  for (size_t i = 0; i < all.size(); ++i) {
    const train::Layout& l = all[i].layout;
    EXPECT_EQ(l.dp * l.tp * l.pp, 4);
    EXPECT_EQ(l.micro * l.accum * l.dp, 16) << l.str();
    EXPECT_TRUE(l.zero == 0 || l.dp > 1) << l.str();
    if (i > 0) {
      EXPECT_LE(all[i - 1].time.total, all[i].time.total) << i;
    }
    tp_pp.insert({l.tp, l.pp});
  }
  // Every split of 4 ranks the model takes (4 heads, 4 layers).
  EXPECT_EQ(tp_pp.size(), 6u);
  // With 6 heads, tp 4 cannot split them.
  nlohmann::json j = small_gpt2();
  j["model"]["n_head"] = 6;
  j["model"]["n_embd"] = 96;
  for (const auto& p : train::runnable_layouts(train::parse_config(j, "test", 1), 4))
    EXPECT_NE(p.layout.tp, 4) << p.layout.str();
}

// The report lists exactly the layouts whose estimate fits, and names the fastest of them.
TEST(Plan, ReportListsOnlyWhatFits) {
  const train::TrainConfig cfg = train::parse_config(small_gpt2(), "test", 1);
  const std::vector<train::LayoutPlan> all = train::runnable_layouts(cfg, 4);
  std::vector<int64_t> peaks;
  for (const auto& p : all) peaks.push_back(p.peak_bytes);
  std::sort(peaks.begin(), peaks.end());
  const int64_t budget = peaks[peaks.size() / 2];  // about half fit
  size_t fit = 0;
  const train::LayoutPlan* fastest = nullptr;
  for (const auto& p : all) {
    if (p.peak_bytes > budget) continue;
    ++fit;
    if (!fastest) fastest = &p;
  }
  ASSERT_LT(fit, all.size());
  const std::string r = train::layouts_report(cfg, 4, budget / 1073741824.0);
  EXPECT_NE(r.find(std::to_string(fit) + " of " + std::to_string(all.size()) + " layouts fit"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("the fastest: " + fastest->layout.overrides() + "\n"), std::string::npos) << r;
}

TEST(Plan, TinyBudgetNamesTheSmallestLayout) {
  const train::TrainConfig cfg = train::parse_config(small_gpt2(), "test", 1);
  const std::string e = test::error_of([&] { train::layouts_report(cfg, 4, 0.001); });
  EXPECT_NE(e.find("no layout of 4 ranks fits in 0.001 GiB per rank"), std::string::npos) << e;
  EXPECT_NE(e.find("the smallest estimate is"), std::string::npos) << e;
}

}  // namespace
}  // namespace loom
