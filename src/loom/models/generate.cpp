#include "loom/models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loom/tensor/rng.h"
#include "loom/util/error.h"

namespace loom::models {

Generator::Generator(CausalLM& model) : model_(model), cache_(model.new_cache()) {}

int32_t Generator::sample(const float* last, const SampleOptions& opt) {
  const int64_t V = model_.vocab_size();
  if (opt.temperature <= 0.0f) return static_cast<int32_t>(std::max_element(last, last + V) - last);
  order_.resize(V);
  std::iota(order_.begin(), order_.end(), 0);
  const int64_t k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                    [&](int32_t a, int32_t b) { return last[a] > last[b]; });
  probs_.resize(k);
  const float mx = last[order_[0]];
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    probs_[i] = std::exp((last[order_[i]] - mx) / opt.temperature);
    sum += probs_[i];
  }
  // top-p: the smallest prefix of the sorted candidates whose mass reaches top_p.
  int64_t keep = k;
  if (opt.top_p < 1.0f) {
    double acc = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      acc += probs_[i] / sum;
      if (acc >= opt.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = 0.0;
    for (int64_t i = 0; i < keep; ++i) sum += probs_[i];
  }
  double u = rng_uniform(opt.seed, stream_id("sample"), static_cast<uint64_t>(cache_.len)) * sum;
  for (int64_t i = 0; i < keep; ++i) {
    u -= probs_[i];
    if (u <= 0.0) return order_[i];
  }
  return order_[keep - 1];
}

std::vector<int32_t> Generator::continue_with(const std::vector<int32_t>& input,
                                              const SampleOptions& opt,
                                              const std::function<void(int32_t)>& on_token) {
  LOOM_CHECK(!input.empty(), "generate: nothing to feed (empty prompt)");
  LOOM_CHECK(cache_.len + static_cast<int64_t>(input.size()) <= cache_.capacity,
             "the conversation (" + std::to_string(cache_.len + input.size()) +
                 " tokens) no longer fits the model's context of " +
                 std::to_string(cache_.capacity));
  const int64_t V = model_.vocab_size();
  Tensor ids = Tensor::zeros({1, static_cast<int64_t>(input.size())}, DType::I32);
  std::copy(input.begin(), input.end(), ids.i32());
  const float* logits = model_.forward_cached(ids, cache_).f32() + (input.size() - 1) * V;
  std::vector<int32_t> out;
  Tensor one = Tensor::zeros({1, 1}, DType::I32);
  while (static_cast<int64_t>(out.size()) < opt.max_new_tokens) {
    const int32_t next = sample(logits, opt);
    out.push_back(next);
    if (on_token) on_token(next);
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), next) != opt.stop_ids.end()) break;
    if (cache_.len >= cache_.capacity) break;
    one.i32()[0] = next;
    logits = model_.forward_cached(one, cache_).f32();
  }
  return out;
}

std::vector<int32_t> generate(CausalLM& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt) {
  Generator g(model);
  return g.continue_with(prompt, opt);
}

}  // namespace loom::models
