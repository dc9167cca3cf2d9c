// KV-cache inference equals the full forward, for every architecture; sampling rules.
#include <gtest/gtest.h>

#include <cmath>

#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/models/generate.h"

namespace loom {
namespace {

TEST(Generate, CachedLogitsEqualFullForward) {
  for (const char* name : {"gpt2_tiny", "llama_tiny", "qwen2_tiny", "deepseek_v3_tiny",
                           "deepseek_v3_noq_tiny", "deepseek_v2_tiny", "qwen2_moe_tiny"}) {
    auto model = io::load_hf_model(test::fixture_dir() / name);
    const int64_t T = 12, V = model->vocab_size();
    Tensor ids = Tensor::zeros({1, T}, DType::I32);
    for (int64_t i = 0; i < T; ++i) ids.i32()[i] = static_cast<int32_t>((i * 37 + 5) % V);
    const Tensor& full_t = model->forward(ids);
    std::vector<float> full(full_t.f32(), full_t.f32() + T * V);
    // Prefill 5 tokens, then one at a time.
    models::KVCache cache = model->new_cache();
    double worst = 0;
    int64_t t = 0;
    for (int64_t n : {5, 1, 1, 1, 1, 1, 1, 1}) {
      Tensor part = Tensor::zeros({1, n}, DType::I32);
      std::copy(ids.i32() + t, ids.i32() + t + n, part.i32());
      const Tensor& lg = model->forward_cached(part, cache);
      for (int64_t i = 0; i < n * V; ++i)
        worst = std::max(worst, double(std::fabs(lg.f32()[i] - full[t * V + i])));
      t += n;
    }
    EXPECT_EQ(cache.len, T);
    EXPECT_LT(worst, 1e-5) << name;
  }
}

TEST(Packing, PackedRowEqualsSeparateSequences) {
  // Two samples packed in one row (positions restart at the second) give the logits each
  // gives alone: no attention across samples, positions per sample.
  for (const char* name : {"gpt2_tiny", "llama_tiny", "qwen2_tiny", "deepseek_v3_tiny",
                           "deepseek_v3_noq_tiny", "deepseek_v2_tiny", "qwen2_moe_tiny"}) {
    auto model = io::load_hf_model(test::fixture_dir() / name);
    const int64_t V = model->vocab_size(), T = 9, split = 4;
    Tensor ids = Tensor::zeros({1, T}, DType::I32), pos = Tensor::zeros({1, T}, DType::I32);
    for (int64_t i = 0; i < T; ++i) {
      ids.i32()[i] = static_cast<int32_t>((i * 29 + 3) % V);
      pos.i32()[i] = static_cast<int32_t>(i < split ? i : i - split);
    }
    const Tensor& packed_t = model->forward(ids, pos);
    std::vector<float> packed(packed_t.f32(), packed_t.f32() + T * V);
    double worst = 0;
    for (auto [a, b] : {std::pair<int64_t, int64_t>{0, split}, {split, T}}) {
      Tensor part = Tensor::zeros({1, b - a}, DType::I32);
      std::copy(ids.i32() + a, ids.i32() + b, part.i32());
      const Tensor& lg = model->forward(part);
      for (int64_t i = 0; i < (b - a) * V; ++i)
        worst = std::max(worst, double(std::fabs(lg.f32()[i] - packed[a * V + i])));
    }
    EXPECT_LT(worst, 1e-5) << name;
  }
}

TEST(Generate, GreedyMatchesArgmaxOfFullForwardAndStops) {
  auto model = io::load_hf_model(test::fixture_dir() / "llama_tiny");
  std::vector<int32_t> prompt = {3, 14, 15, 92, 65};
  models::SampleOptions opt;
  opt.temperature = 0.0f;
  opt.max_new_tokens = 6;
  std::vector<int32_t> out = models::generate(*model, prompt, opt);
  ASSERT_EQ(out.size(), 6u);
  std::vector<int32_t> seq = prompt;
  for (int32_t tok : out) {  // recompute each step without the cache
    Tensor ids = Tensor::zeros({1, static_cast<int64_t>(seq.size())}, DType::I32);
    std::copy(seq.begin(), seq.end(), ids.i32());
    const float* last = model->forward(ids).f32() + (seq.size() - 1) * 256;
    EXPECT_EQ(tok, std::max_element(last, last + 256) - last);
    seq.push_back(tok);
  }
  opt.stop_ids = {out[2]};
  const size_t first = std::find(out.begin(), out.end(), out[2]) - out.begin();
  EXPECT_EQ(models::generate(*model, prompt, opt).size(), first + 1);  // stop id included
}

TEST(Generate, SamplingIsReproducibleAndTopKOneIsGreedy) {
  auto model = io::load_hf_model(test::fixture_dir() / "gpt2_tiny");
  std::vector<int32_t> prompt = {10, 20, 30};
  models::SampleOptions opt;
  opt.max_new_tokens = 8;
  opt.temperature = 1.0f;
  opt.top_p = 0.9f;
  EXPECT_EQ(models::generate(*model, prompt, opt), models::generate(*model, prompt, opt));
  models::SampleOptions k1 = opt, greedy = opt;
  k1.top_k = 1;
  greedy.temperature = 0.0f;
  EXPECT_EQ(models::generate(*model, prompt, k1), models::generate(*model, prompt, greedy));
}

TEST(Generate, ContextOverflowIsAnError) {
  auto model = io::load_hf_model(test::fixture_dir() / "gpt2_tiny");  // 32 positions
  models::Generator g(*model);
  std::vector<int32_t> long_prompt(40, 7);
  models::SampleOptions opt;
  EXPECT_THROW(g.continue_with(long_prompt, opt), Error);
}

}  // namespace
}  // namespace loom
