// DeepSeek-V2 / V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): the Llama residual
// wiring (RMSNorm pre-norm blocks, final RMSNorm, untied head by default) with multi-head
// latent attention (nn/mla_attention.h) in every layer, a dense SwiGLU MLP in the first
// first_k_dense_replace layers and DeepSeekMoE (nn/moe.h) after them (every moe_layer_freq-th
// layer). V3 routes by sigmoid scores with a correction bias and group-limited choice
// (topk_method noaux_tc); V2 by softmax, greedy or group_limited_greedy. Config keys and
// tensor names are transformers'; a V3 checkpoint's multi-token-prediction layers
// (model.layers.<num_hidden_layers>..) are not part of the causal LM and are skipped.
// Not supported (refused by name): tensor parallelism and sequence parallelism, prefix
// tuning, rope types other than default/linear, num_key_value_heads != num_attention_heads.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/kernels/cpu/rope.h"
#include "loom/models/decoder.h"

namespace loom::models {

struct DeepseekConfig {
  std::string model_type = "deepseek_v3";  // deepseek_v3 | deepseek_v2
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, moe_intermediate_size = 0;
  int64_t num_hidden_layers = 0, num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0 (null): a direct q_proj
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int64_t n_routed_experts = 0, n_shared_experts = 0, num_experts_per_tok = 1;
  int64_t n_group = 1, topk_group = 1, first_k_dense_replace = 0, moe_layer_freq = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  std::string topk_method;  // V3: noaux_tc; V2: greedy | group_limited_greedy
  // V2's sequence-wise balance loss (DeepSeek's code; transformers leaves it out). V3's
  // complementary one (also aux_loss_alpha in its config) is not implemented: V3 trains
  // with its bias, and the key is read as 0.
  double aux_loss_alpha = 0.0;
  int64_t max_position_embeddings = 2048;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  kernels::RopeScaling rope_scaling;
  nlohmann::json rope_scaling_json;
  bool rope_interleave = true;
  bool tie_word_embeddings = false, attention_bias = false;
  float initializer_range = 0.02f;
  int64_t bos_token_id = -1, eos_token_id = -1;
  int64_t num_nextn_predict_layers = 0;  // V3's MTP layers, kept in config.json only

  bool v3() const { return model_type == "deepseek_v3"; }
  bool moe_layer(int64_t l) const {
    return n_routed_experts > 0 && l >= first_k_dense_replace && l % moe_layer_freq == 0;
  }
  static DeepseekConfig from_hf(const nlohmann::json& j, const std::string& where);
  nlohmann::json to_hf() const;
};

class Deepseek : public Decoder {
 public:
  explicit Deepseek(const DeepseekConfig& c, const nn::TensorParallel& tp = {},
                    const StageRange& stage = {}, ParamBuffers buffers = ParamBuffers::Allocate);
  std::string arch() const override { return cfg_.model_type; }
  nlohmann::json hf_config() const override { return cfg_.to_hf(); }
  bool hf_transposed(const nn::Parameter&) const override { return false; }
  bool hf_ignorable(const std::string& name) const override;
  int64_t activation_bytes(int64_t B, int64_t T) const override;
  void add_kv_prefix(const nn::PrefixSpec& spec) override;
  const DeepseekConfig& config() const { return cfg_; }

 private:
  DeepseekConfig cfg_;
};

}  // namespace loom::models
