// TensorBoard's own reader on a Loom run (scripts/check_tensorboard.py): a 2-rank ZeRO-2 job
// stopped after step 4, resumed from its step-2 checkpoint to step 6; tensorboard's
// EventAccumulator gets every scalar of metrics.jsonl at every step exactly once (the resumed
// run's SessionLog START drops the first run's steps 3-4). Needs the reference environment
// with tensorboard (scripts/ref_venv.sh); skipped where it is absent, as in CI.
#include <gtest/gtest.h>

#include <fstream>

#include "common/ref_python.h"
#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::ref_python;

TEST(TensorBoardReference, EveryScalarAtEveryStepThroughAResume) {
  if (!fs::exists(ref_python())) GTEST_SKIP() << ref_python() << " absent (scripts/ref_venv.sh)";
  if (test::run_command(ref_python().string() + " -c 'import tensorboard'").first != 0)
    GTEST_SKIP() << "tensorboard is not in the reference environment (scripts/ref_venv.sh)";
  test::TempDir tmp;
  test::write_sft_jsonl(tmp.path / "sft.jsonl", 120);
  nlohmann::json j = {{"model", test::tiny_gpt2_json()},
                      {"data",
                       {{"path", (tmp.path / "sft.jsonl").string()},
                        {"tokenizer", "bytes"},
                        {"seq_len", 32},
                        {"valid_fraction", 0.1}}},
                      {"train_micro_batch_size_per_gpu", 2},
                      {"gradient_accumulation_steps", 2},
                      {"train_steps", 4},
                      {"eval_interval", 2},
                      {"checkpoint_interval", 2},
                      {"zero_optimization", {{"stage", 2}}},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}}}}},
                      {"tensorboard", {{"enabled", true}, {"job_name", "zh_sft"}}},
                      {"output_dir", (tmp.path / "run").string()}};
  io::write_json_file(tmp.path / "a.json", j);
  auto [code, out] = test::run_command(test::loom_binary() + " launch -n 2 -- train " +
                                       (tmp.path / "a.json").string());
  ASSERT_EQ(code, 0) << out;
  j["train_steps"] = 6;
  j["resume_from"] = (tmp.path / "run" / "checkpoint-2").string();
  io::write_json_file(tmp.path / "b.json", j);
  std::tie(code, out) = test::run_command(test::loom_binary() + " launch -n 2 -- train " +
                                          (tmp.path / "b.json").string());
  ASSERT_EQ(code, 0) << out;
  std::tie(code, out) = test::run_command(
      ref_python().string() + " " +
      (test::source_dir() / "scripts" / "check_tensorboard.py").string() + " " +
      (tmp.path / "run").string() + " " + (tmp.path / "run" / "zh_sft").string() + " 8");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("check_tensorboard: OK"), std::string::npos) << out;
  EXPECT_NE(out.find("at 7 steps"), std::string::npos) << out;  // x = 0 (eval), 8, ..., 48
}

}  // namespace
}  // namespace loom
