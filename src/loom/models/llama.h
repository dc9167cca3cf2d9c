// Llama family: token embedding, pre-norm blocks (RMSNorm -> GQA attention with RoPE ->
// residual, RMSNorm -> SwiGLU MLP -> residual), final RMSNorm, LM head (tied or not).
// One class covers LlamaForCausalLM (SmolLM2, DeepSeek-LLM dense) and Qwen2ForCausalLM
// (q/k/v biases). Parameter names follow transformers ("model.layers.0.self_attn.q_proj.weight").
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/kernels/cpu/rope.h"
#include "loom/models/causal_lm.h"
#include "loom/nn/buffers.h"
#include "loom/nn/embedding.h"
#include "loom/nn/gqa_attention.h"
#include "loom/nn/linear.h"
#include "loom/nn/prenorm_block.h"
#include "loom/nn/rmsnorm.h"
#include "loom/nn/swiglu_mlp.h"

namespace loom::models {

struct LlamaConfig {
  std::string model_type = "llama";  // llama | qwen2
  int64_t vocab_size = 32000, hidden_size = 4096, intermediate_size = 11008;
  int64_t num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 32;
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  kernels::RopeScaling rope_scaling;
  nlohmann::json rope_scaling_json;  // as read, written back on save
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v (and o for Llama) biases; Qwen2: q/k/v always
  float initializer_range = 0.02f;
  int64_t bos_token_id = -1, eos_token_id = -1;

  static LlamaConfig from_hf(const nlohmann::json& j, const std::string& where);
  nlohmann::json to_hf() const;
  int64_t dim_head() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
};

class LlamaBlock : public nn::PreNormBlock<nn::RMSNorm, nn::GqaAttention, nn::SwiGluMLP> {
 public:
  LlamaBlock(nn::ParamStore& ps, const std::string& name, const LlamaConfig& c);
  const Tensor& forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const int32_t* pos) {
    return finish(x, attn().forward(norm1().forward(x), cos, sin, pos));
  }
  const Tensor& forward_cached(const Tensor& x, const Tensor& cos, const Tensor& sin,
                               const Tensor& kc, const Tensor& vc, int64_t past) {
    return finish(x, attn().forward_cached(norm1().forward(x), cos, sin, kc, vc, past));
  }
};

class Llama : public CausalLM {
 public:
  explicit Llama(const LlamaConfig& c);
  nn::ParamStore& params() override { return ps_; }
  const Tensor& forward(const Tensor& ids, const Tensor& pos = Tensor()) override;
  double backward(const Tensor& targets, float grad_scale) override;
  KVCache new_cache() override;
  const Tensor& forward_cached(const Tensor& ids, KVCache& cache) override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_positions() const override { return cfg_.max_position_embeddings; }
  std::string arch() const override { return cfg_.model_type; }
  nlohmann::json hf_config() const override { return cfg_.to_hf(); }
  bool hf_transposed(const nn::Parameter&) const override { return false; }
  bool hf_ignorable(const std::string& name) const override;
  std::vector<nn::Linear*> linears() override;
  void add_bottleneck_adapters(const nn::AdapterSpec& spec) override;
  void add_kv_prefix(const nn::PrefixSpec& spec) override;
  int64_t kv_heads() const override { return cfg_.num_key_value_heads; }
  int num_layers() const override { return static_cast<int>(cfg_.num_hidden_layers); }
  int64_t activation_bytes(int64_t B, int64_t T) const override;
  int unit_of(const std::string& param_name) const override;
  const LlamaConfig& config() const { return cfg_; }

 private:
  nn::Parameter* head_weight() const;
  void set_rope(const Tensor& pos);  // cos_/sin_ for positions pos + prefix length

  LlamaConfig cfg_;
  nn::ParamStore ps_;
  nn::Embedding embed_;
  std::vector<std::unique_ptr<LlamaBlock>> layers_;
  std::unique_ptr<nn::RMSNorm> norm_;
  nn::Parameter* lm_head_ = nullptr;  // null when tied to embed_tokens
  std::vector<float> inv_freq_;
  nn::Scratch scratch_;
  Tensor ids_, pos_, cos_, sin_, x0_, logits_;
  bool pos_is_custom_ = false;
};

}  // namespace loom::models
