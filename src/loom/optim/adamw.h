// AdamW with fp32 moments for a set of elements of the flat trainable vector: all of them
// (one process, or replicated data parallel) or one rank's ZeRO shard. The work comes as
// segments, runs of elements of one parameter (weight decay is decided per parameter),
// each with its place in the moment buffers; one step is one fused pass per segment.
// Weight decay applies to weights always, and to biases, norms and embeddings only when
// the config asks (by default they are excluded, as in nanoGPT/HF Trainer practice).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "loom/kernels/cpu/adamw.h"
#include "loom/nn/parameter.h"

namespace loom::optim {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  bool decay_bias = false, decay_norm = false, decay_embedding = false;
  bool decays(nn::ParamKind k) const {
    return k == nn::ParamKind::Weight || k == nn::ParamKind::Router ||
           (k == nn::ParamKind::Bias && decay_bias) || (k == nn::ParamKind::Norm && decay_norm) ||
           (k == nn::ParamKind::Embedding && decay_embedding);
  }
};

class AdamW {
 public:
  struct Segment {
    float* value;
    float* grad;
    int64_t state_offset;  // where its moments start in exp_avg / exp_avg_sq
    int64_t n;
    bool decay;
    kernels::HalfOut half = {};  // the value's 16-bit working copy, rewritten in the same pass
    // A gradient held in 16 bits (grad_accum_dtype bf16/fp16; `grad` unused), widened as read.
    const uint16_t* grad16 = nullptr;
    kernels::Half grad_format = kernels::Half::bf16;
  };
  AdamW(const AdamWConfig& cfg, int64_t state_numel);
  // Moments for every trainable parameter of ps, laid out like its gradient buffer.
  AdamW(nn::ParamStore& ps, const AdamWConfig& cfg);
  // Every trainable parameter of ps as one segment each (values and grads of the store);
  // a parameter with a 16-bit working copy converted from its value (nn::HalfCopy, neither
  // `only` nor `gathered`) has it rewritten by the step, which marks it fresh.
  static std::vector<Segment> segments_of(const nn::ParamStore& ps, const AdamWConfig& cfg);

  // One update with learning rate `lr` (the schedule's value for this step); gradients
  // are read multiplied by grad_scale (the clipping coefficient). clear_grads: each
  // segment's gradient is left zero (the engine's next accumulation needs no zeroing pass).
  void step(std::span<const Segment> segs, float lr, float grad_scale = 1.0f,
            bool clear_grads = false);
  void step(nn::ParamStore& ps, float lr, float grad_scale = 1.0f, bool clear_grads = false);

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }  // resuming from a checkpoint
  int64_t state_bytes() const { return static_cast<int64_t>(m_.nbytes() + v_.nbytes()); }
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  AdamWConfig cfg_;
  Tensor m_, v_;
  int64_t t_ = 0;
};

}  // namespace loom::optim
