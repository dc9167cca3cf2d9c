// Small models for the tensor-parallel tests: built whole or split over a tp group from an
// HF config.json object, and given the same full-tensor weights either way (each rank's
// shards cut from them), so a split model must compute what the whole one does.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/test_util.h"
#include "loom/models/gpt2.h"
#include "loom/models/llama.h"
#include "loom/tensor/rng.h"

namespace loom::test {

// A full tensor, the same on every rank, keyed by the parameter's name (norm weights ~1;
// PEFT parameters smaller, so their branches perturb the model rather than swamp it).
inline Tensor full_values(const nn::Parameter& p) {
  Tensor t = Tensor::zeros(p.full_shape);
  const float std = p.kind == nn::ParamKind::Norm ? 0.1f : p.adapter ? 0.15f : 0.3f;
  fill_normal(t, stream_id(p.name) % 100000, std);
  if (p.kind == nn::ParamKind::Norm && p.name.find("bias") == std::string::npos)
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] += 1.0f;
  return t;
}

inline void set_weights(models::CausalLM& m) {
  for (auto& p : m.params().all()) {
    Tensor full = full_values(*p);
    if (p->shard.sharded())
      nn::shard_from_full(*p, full.f32(), p->value.f32());
    else
      p->value.copy_from(full);
  }
}

inline std::unique_ptr<models::CausalLM> build(const nlohmann::json& c,
                                               const nn::TensorParallel& tp) {
  if (c["model_type"] == "gpt2")
    return std::make_unique<models::GPT2>(models::GPT2Config::from_hf(c, "test"), tp);
  return std::make_unique<models::Llama>(models::LlamaConfig::from_hf(c, "test"), tp);
}

}  // namespace loom::test
