// AdamW over a ParamStore's trainable parameters, with fp32 moments in flat buffers laid
// out like the store's flat gradient buffer (so a ZeRO shard is one contiguous range).
// Weight decay applies to weights always, and to biases, norms and embeddings only when
// the config asks (by default they are excluded, as in nanoGPT/HF Trainer practice).
#pragma once

#include <cstdint>

#include "loom/nn/parameter.h"

namespace loom::optim {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  bool decay_bias = false, decay_norm = false, decay_embedding = false;
  bool decays(nn::ParamKind k) const {
    return k == nn::ParamKind::Weight || (k == nn::ParamKind::Bias && decay_bias) ||
           (k == nn::ParamKind::Norm && decay_norm) ||
           (k == nn::ParamKind::Embedding && decay_embedding);
  }
};

class AdamW {
 public:
  AdamW(nn::ParamStore& ps, const AdamWConfig& cfg);
  // One update with learning rate `lr` (the schedule's value for this step); gradients
  // are read multiplied by grad_scale (the clipping coefficient).
  void step(float lr, float grad_scale = 1.0f);
  int64_t steps_taken() const { return t_; }
  int64_t state_bytes() const { return 2 * m_.nbytes(); }
  const AdamWConfig& config() const { return cfg_; }

 private:
  nn::ParamStore& ps_;
  AdamWConfig cfg_;
  Tensor m_, v_;
  int64_t t_ = 0;
};

}  // namespace loom::optim
