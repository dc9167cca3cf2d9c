// Llama family: token embedding, pre-norm blocks (RMSNorm -> GQA attention with RoPE ->
// residual, RMSNorm -> SwiGLU MLP -> residual), final RMSNorm, LM head (tied or not).
// One class covers LlamaForCausalLM (SmolLM2, DeepSeek-LLM dense), Qwen2ForCausalLM
// (q/k/v biases) and Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-57B-A14B: the MLP of every
// decoder_sparse_step-th layer not in mlp_only_layers is a mixture of num_experts routed
// experts, softmax top-num_experts_per_tok, plus a shared expert behind a sigmoid gate,
// nn/moe.h). Parameter names follow transformers ("model.layers.0.self_attn.q_proj.weight").
#pragma once

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/kernels/cpu/rope.h"
#include "loom/models/decoder.h"

namespace loom::models {

struct LlamaConfig {
  std::string model_type = "llama";  // llama | qwen2 | qwen2_moe
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
  // qwen2_moe (0 experts: dense).
  int64_t num_experts = 0, num_experts_per_tok = 1, moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0, decoder_sparse_step = 1;
  bool norm_topk_prob = false;
  std::vector<int64_t> mlp_only_layers;

  static LlamaConfig from_hf(const nlohmann::json& j, const std::string& where);
  nlohmann::json to_hf() const;
  int64_t dim_head() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  bool moe_layer(int64_t l) const {
    return num_experts > 0 && (l + 1) % decoder_sparse_step == 0 &&
           std::find(mlp_only_layers.begin(), mlp_only_layers.end(), l) == mlp_only_layers.end();
  }
};

// Layer `name` (e.g. "model.layers.3") with its parameters declared in ps, split over tp
// (a MoE layer holds the routed experts of stage's expert slice).
std::unique_ptr<nn::DecoderBlock> llama_block(nn::ParamStore& ps, const std::string& name,
                                              const LlamaConfig& c,
                                              const nn::TensorParallel& tp = {},
                                              const StageRange& stage = {});

// The layout the Llama family shares (DeepSeek's too): model.embed_tokens, model.layers.<l>,
// model.norm (RMSNorm), lm_head; the caller sets the blocks, rotary and cache widths.
DecoderSpec llama_family_spec(int64_t vocab, int64_t hidden, int64_t layers, int64_t max_positions,
                              bool tied, float init_std, float rms_eps,
                              const nn::TensorParallel& tp, const StageRange& stage);

class Llama : public Decoder {
 public:
  // tp: the tensor-parallel group the layers split over (none: the whole model here).
  explicit Llama(const LlamaConfig& c, const nn::TensorParallel& tp = {},
                 const StageRange& stage = {}, ParamBuffers buffers = ParamBuffers::Allocate);
  std::string arch() const override { return cfg_.model_type; }
  nlohmann::json hf_config() const override { return cfg_.to_hf(); }
  bool hf_transposed(const nn::Parameter&) const override { return false; }
  bool hf_ignorable(const std::string& name) const override;
  int64_t activation_bytes(int64_t B, int64_t T) const override;
  const LlamaConfig& config() const { return cfg_; }

 private:
  LlamaConfig cfg_;
};

}  // namespace loom::models
