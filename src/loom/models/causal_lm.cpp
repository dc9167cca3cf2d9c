#include "loom/models/causal_lm.h"

#include <cstring>
#include <string>

#include "loom/util/error.h"

namespace loom::models {

int CausalLM::block_unit(const std::string& name, const std::string& bp) {
  if (!name.starts_with(bp)) return -1;
  const size_t dot = name.find('.', bp.size());
  return 1 + std::stoi(name.substr(bp.size(), dot - bp.size()));
}

void CausalLM::set_activation_checkpointing(const ActivationCheckpointing& a) {
  LOOM_CHECK(a.granularity != ActivationCheckpointing::Granularity::full ||
                 (a.num_layers >= 1 && a.num_layers <= num_layers()),
             "config: config key 'activation_checkpointing.num_layers' " +
                 std::to_string(a.num_layers) + " exceeds the model's " +
                 std::to_string(num_layers()) + " layers");
  checkpointing_ = a;
}

std::vector<std::vector<nn::Parameter*>> CausalLM::units() {
  std::vector<std::vector<nn::Parameter*>> u(num_units());
  for (auto& p : params().all()) u[unit_of(p->name)].push_back(p.get());
  return u;
}

void CausalLM::prefill_prefix(KVCache& c) {
  if (!prefix_) return;
  prefix_->forward();
  const int64_t P = prefix_->length(), w = prefix_->kv_width();
  for (size_t l = 0; l < c.k.size(); ++l) {
    for (int64_t j = 0; j < P; ++j) {
      std::memcpy(c.k[l].f32() + j * w, prefix_->keys(l) + j * prefix_->stride(),
                  w * sizeof(float));
      std::memcpy(c.v[l].f32() + j * w, prefix_->values(l) + j * prefix_->stride(),
                  w * sizeof(float));
    }
  }
  c.len = P;
}

}  // namespace loom::models
