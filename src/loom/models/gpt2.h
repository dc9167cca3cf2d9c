// GPT-2: learned token + position embeddings, pre-LN blocks (LN -> attention -> residual,
// LN -> GELU MLP -> residual), final LN, LM head tied to the token embedding.
// Parameter names follow transformers' GPT2LMHeadModel ("transformer.h.0.attn.c_attn.weight").
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/models/decoder.h"

namespace loom::models {

struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // 0: 4 * n_embd
  float layer_norm_epsilon = 1e-5f;
  float initializer_range = 0.02f;

  // From a Hugging Face config.json object; `where` names the file in errors.
  static GPT2Config from_hf(const nlohmann::json& j, const std::string& where);
  nlohmann::json to_hf() const;
  int64_t hidden() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
};

// Block `name` (e.g. "transformer.h.3") with its parameters declared in ps, split over tp.
std::unique_ptr<nn::DecoderBlock> gpt2_block(nn::ParamStore& ps, const std::string& name,
                                             const GPT2Config& c,
                                             const nn::TensorParallel& tp = {});

class GPT2 : public Decoder {
 public:
  // tp: the tensor-parallel group the layers split over (none: the whole model here).
  explicit GPT2(const GPT2Config& c, const nn::TensorParallel& tp = {},
                const StageRange& stage = {}, ParamBuffers buffers = ParamBuffers::Allocate);
  std::string arch() const override { return "gpt2"; }
  nlohmann::json hf_config() const override { return cfg_.to_hf(); }
  bool hf_transposed(const nn::Parameter& p) const override;
  bool hf_ignorable(const std::string& name) const override;
  int64_t activation_bytes(int64_t B, int64_t T) const override;
  const GPT2Config& config() const { return cfg_; }

 private:
  GPT2Config cfg_;
};

}  // namespace loom::models
