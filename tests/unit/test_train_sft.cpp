// End to end on the seed's dialogue data: a small GPT-2 trained with the byte codec on
// zh_dialogue.json (ChatML, assistant-only loss, packed rows, 5% validation) lowers its
// validation loss, and the second run reads its rows from the token cache.
#include <gtest/gtest.h>

#include <cmath>

#include "common/test_util.h"
#include "loom/train/trainer.h"

namespace loom {
namespace {

TEST(TrainSft, ValidationLossFallsOnZhDialogue) {
  const auto data = test::source_dir() / ".." / "shared" / "data" / "zh_dialogue.json";
  if (!std::filesystem::exists(data)) GTEST_SKIP() << data << " not present";
  test::TempDir tmp;
  nlohmann::json j = {{"model",
                       {{"arch", "gpt2"},
                        {"n_layer", 2},
                        {"n_embd", 64},
                        {"n_head", 4},
                        {"vocab_size", 256},
                        {"n_positions", 128}}},
                      {"data",
                       {{"path", data.string()},
                        {"tokenizer", "bytes"},
                        {"template", "chatml"},
                        {"seq_len", 128},
                        {"pack", true},
                        {"valid_fraction", 0.05},
                        {"cache_dir", (tmp.path / "cache").string()}}},
                      {"train_micro_batch_size_per_gpu", 8},
                      {"train_steps", 40},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}}}}},
                      {"output_dir", (tmp.path / "out").string()}};
  train::TrainConfig cfg = train::parse_config(j, "test", 1);
  train::Trainer t(cfg);
  const double before = t.evaluate();
  for (int i = 0; i < 40; ++i) t.step();
  const double after = t.evaluate();
  EXPECT_TRUE(std::isfinite(before));
  EXPECT_LT(after, before - 0.5) << "validation loss " << before << " -> " << after;
  // Same config again: rows come from the cache (same contents, no re-tokenization).
  train::Trainer again(cfg);
  EXPECT_NEAR(again.evaluate(), before, 1e-6);
}

}  // namespace
}  // namespace loom
