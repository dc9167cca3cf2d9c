#include "loom/models/generate.h"

#include <algorithm>
#include <cmath>

#include "loom/tensor/rng.h"
#include "loom/util/error.h"

namespace loom::models {

std::vector<int32_t> generate(CausalLM& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt) {
  LOOM_CHECK(!prompt.empty(), "generate: the prompt is empty");
  std::vector<int32_t> seq = prompt;
  const int64_t V = model.vocab_size();
  std::vector<float> probs(V);
  std::vector<int32_t> order(V);
  for (int64_t n = 0; n < opt.max_new_tokens; ++n) {
    const int64_t T = std::min<int64_t>(seq.size(), model.max_positions());
    Tensor ids = Tensor::zeros({1, T}, DType::I32);
    std::copy(seq.end() - T, seq.end(), ids.i32());
    const float* last = model.forward(ids).f32() + (T - 1) * V;
    int32_t next;
    if (opt.temperature <= 0.0f) {
      next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    } else {
      for (int64_t i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
      const int64_t k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return last[a] > last[b]; });
      const float mx = last[order[0]];
      double sum = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        probs[i] = std::exp((last[order[i]] - mx) / opt.temperature);
        sum += probs[i];
      }
      double u = rng_uniform(opt.seed, stream_id("sample"), seq.size()) * sum;
      next = order[k - 1];
      for (int64_t i = 0; i < k; ++i) {
        u -= probs[i];
        if (u <= 0.0) {
          next = order[i];
          break;
        }
      }
    }
    seq.push_back(next);
  }
  return std::vector<int32_t>(seq.begin() + prompt.size(), seq.end());
}

}  // namespace loom::models
