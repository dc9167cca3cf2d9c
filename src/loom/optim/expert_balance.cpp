#include "loom/optim/expert_balance.h"

#include <algorithm>
#include <utility>

#include "loom/nn/moe.h"

namespace loom::optim {

std::vector<ExpertLoad> balance_experts(const std::vector<models::MoeLayer>& layers,
                                        dist::Communicator& group, float rate) {
  std::vector<ExpertLoad> out;
  for (const models::MoeLayer& l : layers) {
    nn::Router& r = l.moe->router();
    std::vector<int64_t>& load = r.load();
    // Counts travel as doubles (exact below 2^53), the balance loss after them.
    std::vector<double> sum(load.begin(), load.end());
    sum.push_back(std::exchange(r.aux_loss(), 0.0));
    group.all_reduce_sum(sum.data(), static_cast<int64_t>(sum.size()));
    std::fill(load.begin(), load.end(), 0);
    const double aux = sum.back();
    sum.pop_back();
    ExpertLoad s;
    s.layer = l.layer;
    s.aux_loss = aux;
    s.dispatch_bytes = l.moe->dispatch_floats() * static_cast<int64_t>(sizeof(float));
    s.min = static_cast<int64_t>(*std::min_element(sum.begin(), sum.end()));
    s.max = static_cast<int64_t>(*std::max_element(sum.begin(), sum.end()));
    for (double v : sum) s.mean += v;
    s.mean /= static_cast<double>(sum.size());
    if (nn::Parameter* b = r.bias()) {
      float* v = b->value.f32();
      if (rate > 0.0f)
        for (size_t e = 0; e < sum.size(); ++e)
          v[e] += sum[e] < s.mean ? rate : sum[e] > s.mean ? -rate : 0.0f;
      s.bias_min = *std::min_element(v, v + sum.size());
      s.bias_max = *std::max_element(v, v + sum.size());
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace loom::optim
