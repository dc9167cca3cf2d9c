// GPT-2: learned token + position embeddings, pre-LN blocks (LN -> attention -> residual,
// LN -> GELU MLP -> residual), final LN, LM head tied to the token embedding.
// Parameter names follow transformers' GPT2LMHeadModel ("transformer.h.0.attn.c_attn.weight").
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/models/causal_lm.h"
#include "loom/nn/attention.h"
#include "loom/nn/buffers.h"
#include "loom/nn/embedding.h"
#include "loom/nn/layernorm.h"
#include "loom/nn/mlp.h"
#include "loom/nn/prenorm_block.h"

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

class GPT2Block : public nn::PreNormBlock<nn::LayerNorm, nn::FusedQKVAttention, nn::GeluMLP> {
 public:
  GPT2Block(nn::ParamStore& ps, const std::string& name, const GPT2Config& c);
  const Tensor& forward(const Tensor& x, const int32_t* pos) {  // x [B, T, C] -> [B, T, C]
    return finish(x, attn().forward(norm1().forward(x), pos));
  }
  const Tensor& forward_cached(const Tensor& x, const Tensor& kc, const Tensor& vc, int64_t past) {
    return finish(x, attn().forward_cached(norm1().forward(x), kc, vc, past));
  }
};

class GPT2 : public CausalLM {
 public:
  explicit GPT2(const GPT2Config& c);
  nn::ParamStore& params() override { return ps_; }
  const Tensor& forward(const Tensor& ids, const Tensor& pos = Tensor()) override;
  double backward(const Tensor& targets, float grad_scale) override;
  KVCache new_cache() override;
  const Tensor& forward_cached(const Tensor& ids, KVCache& cache) override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_positions() const override { return cfg_.n_positions; }
  std::string arch() const override { return "gpt2"; }
  nlohmann::json hf_config() const override { return cfg_.to_hf(); }
  bool hf_transposed(const nn::Parameter& p) const override;
  bool hf_ignorable(const std::string& name) const override;
  std::vector<nn::Linear*> linears() override;
  void add_bottleneck_adapters(const nn::AdapterSpec& spec) override;
  void add_kv_prefix(const nn::PrefixSpec& spec) override;
  int64_t kv_heads() const override { return cfg_.n_head; }
  int num_layers() const override { return static_cast<int>(cfg_.n_layer); }
  int64_t activation_bytes(int64_t B, int64_t T) const override;
  int unit_of(const std::string& param_name) const override;
  const GPT2Config& config() const { return cfg_; }

 private:
  GPT2Config cfg_;
  nn::ParamStore ps_;
  nn::Embedding wte_, wpe_;
  std::vector<std::unique_ptr<GPT2Block>> blocks_;
  std::unique_ptr<nn::LayerNorm> ln_f_;  // built after the blocks: HF parameter order
  nn::Scratch scratch_;
  Tensor ids_, pos_, x0_, logits_;  // saved by forward
  Tensor wpos_;                     // wpe rows: pos_ + prefix length
  bool pos_is_custom_ = false;      // pos_ came from the caller (packed rows)
};

}  // namespace loom::models
