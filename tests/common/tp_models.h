// Small models for the tensor-parallel tests: built whole or split over a tp group from an
// HF config.json object, and given the same full-tensor weights either way (each rank's
// shards cut from them), so a split model must compute what the whole one does.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "loom/kernels/cpu/cross_entropy.h"
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

// A [B, T] batch over vocabulary V: ids, targets with every fifth ignored, and position ids
// of two packed samples per row (restarting at 5; used when a case packs).
struct TpBatch {
  Tensor ids, targets, pos;
};
inline TpBatch tp_batch(int64_t B, int64_t T, int64_t V) {
  TpBatch b{Tensor::zeros({B, T}, DType::I32), Tensor::zeros({B, T}, DType::I32),
            Tensor::zeros({B, T}, DType::I32)};
  for (int64_t i = 0; i < B * T; ++i) {
    b.ids.i32()[i] = static_cast<int32_t>((i * 37 + 5) % V);
    b.targets.i32()[i] =
        i % 5 == 4 ? kernels::kIgnoreIndex : static_cast<int32_t>((i * 11 + 3) % V);
    b.pos.i32()[i] = static_cast<int32_t>(i % T < 5 ? i % T : i % T - 5);
  }
  return b;
}

// This rank's vocabulary columns [N, Vl] of the whole model's logits ref [B, T, V].
inline std::vector<float> logit_columns(const Tensor& ref, models::CausalLM& split, int64_t Vl) {
  const int64_t N = ref.numel() / ref.dim(-1), V = ref.dim(-1);
  const int64_t v0 = dynamic_cast<models::Decoder&>(split).vocab_first();
  std::vector<float> want(N * Vl);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < Vl; ++j) want[r * Vl + j] = ref.f32()[r * V + v0 + j];
  return want;
}

}  // namespace loom::test
