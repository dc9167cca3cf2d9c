#include "loom/models/causal_lm.h"

#include <cstring>

namespace loom::models {

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
