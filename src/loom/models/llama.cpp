#include "loom/models/llama.h"

#include <algorithm>

#include "loom/models/hf_config_keys.h"
#include "loom/nn/gqa_attention.h"
#include "loom/nn/moe.h"
#include "loom/nn/prenorm_block.h"
#include "loom/nn/rmsnorm.h"
#include "loom/nn/swiglu_mlp.h"
#include "loom/util/error.h"

namespace loom::models {

LlamaConfig LlamaConfig::from_hf(const nlohmann::json& j, const std::string& where) {
  LOOM_CHECK(j.is_object(), where + ": config must be a JSON object");
  LlamaConfig c;
  c.model_type = j.value("model_type", std::string("llama"));
  c.vocab_size = hf_int(j, "vocab_size", c.vocab_size, where);
  c.hidden_size = hf_int(j, "hidden_size", c.hidden_size, where);
  c.intermediate_size = hf_int(j, "intermediate_size", c.intermediate_size, where);
  c.num_hidden_layers = hf_int(j, "num_hidden_layers", c.num_hidden_layers, where);
  c.num_attention_heads = hf_int(j, "num_attention_heads", c.num_attention_heads, where);
  c.num_key_value_heads = hf_int(j, "num_key_value_heads", c.num_attention_heads, where);
  c.head_dim = hf_int(j, "head_dim", 0, where);
  c.max_position_embeddings = hf_int(j, "max_position_embeddings", 2048, where);
  c.rms_norm_eps = static_cast<float>(hf_num(j, "rms_norm_eps", 1e-6, where));
  c.initializer_range = static_cast<float>(hf_num(j, "initializer_range", 0.02, where));
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  // Qwen2 always has q/k/v biases; Qwen2-MoE has them unless qkv_bias says otherwise.
  c.attention_bias = c.model_type == "qwen2"       ? true
                     : c.model_type == "qwen2_moe" ? j.value("qkv_bias", true)
                                                   : j.value("attention_bias", false);
  c.bos_token_id = hf_int(j, "bos_token_id", -1, where);
  c.eos_token_id = j.contains("eos_token_id") && j["eos_token_id"].is_array()
                       ? j["eos_token_id"][0].get<int64_t>()
                       : hf_int(j, "eos_token_id", -1, where);
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "max_position_embeddings"})
    LOOM_CHECK(hf_int(j, k, 1, where) > 0, where + ": key '" + k + "' must be positive");
  LOOM_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
             where + ": num_attention_heads must be a multiple of num_key_value_heads");
  LOOM_CHECK(c.head_dim > 0 || c.hidden_size % c.num_attention_heads == 0,
             where + ": hidden_size is not divisible by num_attention_heads");
  const std::string act = j.value("hidden_act", std::string("silu"));
  LOOM_CHECK(act == "silu", where + ": hidden_act '" + act + "' is not supported (silu)");
  LOOM_CHECK(!j.value("mlp_bias", false), where + ": mlp_bias=true is not supported");
  LOOM_CHECK(!j.value("use_sliding_window", false),
             where + ": use_sliding_window=true is not supported");

  if (c.model_type == "qwen2_moe") {
    c.num_experts = hf_int(j, "num_experts", 0, where);
    c.num_experts_per_tok = hf_int(j, "num_experts_per_tok", 1, where);
    c.moe_intermediate_size = hf_int(j, "moe_intermediate_size", 0, where);
    c.shared_expert_intermediate_size = hf_int(j, "shared_expert_intermediate_size", 0, where);
    c.decoder_sparse_step = hf_int(j, "decoder_sparse_step", 1, where);
    c.norm_topk_prob = j.value("norm_topk_prob", false);
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
      LOOM_CHECK(j["mlp_only_layers"].is_array(),
                 where + ": key 'mlp_only_layers' must be a list of layer indices");
      for (const auto& l : j["mlp_only_layers"]) {
        LOOM_CHECK(l.is_number_integer(),
                   where + ": key 'mlp_only_layers' must be a list of layer indices");
        c.mlp_only_layers.push_back(l.get<int64_t>());
      }
    }
    LOOM_CHECK(c.num_experts == 0 ||
                   (c.moe_intermediate_size > 0 && c.decoder_sparse_step > 0 &&
                    c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_experts),
               where +
                   ": keys 'moe_intermediate_size', 'decoder_sparse_step' must be positive and "
                   "'num_experts_per_tok' in [1, num_experts]");
    // transformers adds the router's load-balancing loss only with output_router_logits.
    LOOM_CHECK(!j.value("output_router_logits", false),
               where +
                   ": key 'output_router_logits' true (the router's auxiliary "
                   "load-balancing loss) is not implemented; set it false");
  }

  const HfRope rope = hf_rope(j, where);
  c.rope_theta = rope.theta;
  c.rope_scaling = rope.scaling;
  c.rope_scaling_json = rope.json;
  return c;
}

nlohmann::json LlamaConfig::to_hf() const {
  nlohmann::json j;
  j["architectures"] = {model_type == "qwen2"       ? "Qwen2ForCausalLM"
                        : model_type == "qwen2_moe" ? "Qwen2MoeForCausalLM"
                                                    : "LlamaForCausalLM"};
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = dim_head();
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = rope_scaling_json.is_null() ? nlohmann::json(nullptr) : rope_scaling_json;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["initializer_range"] = initializer_range;
  if (model_type == "llama") j["attention_bias"] = attention_bias;
  if (model_type == "qwen2_moe") {
    j["qkv_bias"] = attention_bias;
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["norm_topk_prob"] = norm_topk_prob;
    j["mlp_only_layers"] = mlp_only_layers;
    j["output_router_logits"] = false;
  }
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_id >= 0) j["eos_token_id"] = eos_token_id;
  j["torch_dtype"] = "float32";
  return j;
}

std::unique_ptr<nn::DecoderBlock> llama_block(nn::ParamStore& ps, const std::string& name,
                                              const LlamaConfig& c, const nn::TensorParallel& tp,
                                              const StageRange& stage) {
  auto norm1 = [&] {
    return nn::RMSNorm(ps, name + ".input_layernorm", c.hidden_size, c.rms_norm_eps);
  };
  auto norm2 = [&] {
    return nn::RMSNorm(ps, name + ".post_attention_layernorm", c.hidden_size, c.rms_norm_eps);
  };
  auto attn = [&] {
    return nn::GqaAttention(
        ps, name + ".self_attn",
        nn::GqaDims{c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.dim_head(),
                    c.attention_bias, c.attention_bias && c.model_type == "llama"},
        c.initializer_range, tp);
  };
  const int64_t layer = std::stoll(name.substr(name.rfind('.') + 1));
  if (!c.moe_layer(layer)) {
    using Block = nn::PreNormBlock<nn::RMSNorm, nn::GqaAttention, nn::SwiGluMLP>;
    return std::make_unique<Block>(
        norm1, norm2, attn,
        [&] {
          return nn::SwiGluMLP(ps, name + ".mlp", c.hidden_size, c.intermediate_size,
                               c.initializer_range, tp);
        },
        tp);
  }
  LOOM_CHECK(!tp.active(), c.model_type +
                               ": tensor_parallel.size must be 1 (the experts are not split over "
                               "tensor-parallel ranks; expert parallelism spreads them)");
  nn::MoeSpec m;
  m.hidden = c.hidden_size;
  m.inter = c.moe_intermediate_size;
  m.shared_width = c.shared_expert_intermediate_size;
  m.shared_name = "shared_expert";
  m.shared_gate = c.shared_expert_intermediate_size > 0;
  m.router.hidden = c.hidden_size;
  m.router.n_experts = c.num_experts;
  m.router.top_k = c.num_experts_per_tok;
  m.router.sigmoid = false;  // softmax scores, no groups, no scaling
  m.router.norm_topk_prob = c.norm_topk_prob;
  m.ep_size = stage.ep_size;
  m.ep_rank = stage.ep_rank;
  using Block = nn::PreNormBlock<nn::RMSNorm, nn::GqaAttention, nn::MoE>;
  return std::make_unique<Block>(
      norm1, norm2, attn, [&] { return nn::MoE(ps, name + ".mlp", m, c.initializer_range); });
}

DecoderSpec llama_family_spec(int64_t vocab, int64_t hidden, int64_t layers, int64_t max_positions,
                              bool tied, float init_std, float rms_eps,
                              const nn::TensorParallel& tp, const StageRange& stage) {
  DecoderSpec s;
  s.tp = tp;
  s.stage = stage;
  s.tok_embed = "model.embed_tokens";
  s.block_prefix = "model.layers.";
  s.final_norm = "model.norm";
  s.vocab = vocab;
  s.hidden = hidden;
  s.layers = layers;
  s.max_positions = max_positions;
  s.max_positions_key = "max_position_embeddings";
  s.tied_head = tied;
  s.init_std = init_std;
  s.make_norm = [hidden, rms_eps](nn::ParamStore& ps, const std::string& name) {
    return std::make_unique<nn::RMSNorm>(ps, name, hidden, rms_eps);
  };
  return s;
}

namespace {
DecoderSpec llama_spec(const LlamaConfig& c, const nn::TensorParallel& tp,
                       const StageRange& stage) {
  // Checked before any layer is built, so the error names the heads.
  const int64_t t = tp.size(), kv = c.num_key_value_heads;
  LOOM_CHECK(c.num_attention_heads % t == 0,
             "num_attention_heads " + std::to_string(c.num_attention_heads) +
                 " is not divisible by tensor_parallel.size " + std::to_string(t));
  LOOM_CHECK(kv % t == 0 || t % kv == 0,
             "num_key_value_heads " + std::to_string(kv) + " and tensor_parallel.size " +
                 std::to_string(t) +
                 " do not divide one another (KV heads are split, or replicated when fewer)");
  LOOM_CHECK(c.intermediate_size % t == 0,
             "intermediate_size " + std::to_string(c.intermediate_size) +
                 " is not divisible by tensor_parallel.size " + std::to_string(t));
  DecoderSpec s =
      llama_family_spec(c.vocab_size, c.hidden_size, c.num_hidden_layers, c.max_position_embeddings,
                        c.tie_word_embeddings, c.initializer_range, c.rms_norm_eps, tp, stage);
  s.kv_heads = c.num_key_value_heads;
  s.kv_width = c.num_key_value_heads * c.dim_head();
  s.rope_inv_freq = kernels::rope_inv_freq(c.dim_head(), c.rope_theta, c.rope_scaling);
  s.rope_scale = static_cast<float>(kernels::rope_attention_factor(c.rope_scaling));
  s.make_block = [c, tp, stage](nn::ParamStore& ps, const std::string& name) {
    return llama_block(ps, name, c, tp, stage);
  };
  return s;
}
}  // namespace

Llama::Llama(const LlamaConfig& c, const nn::TensorParallel& tp, const StageRange& stage,
             ParamBuffers buffers)
    : Decoder(llama_spec(c, tp, stage), buffers), cfg_(c) {}

int64_t Llama::activation_bytes(int64_t B, int64_t T) const {
  const int64_t N = B * (T + prefix_length()), C = cfg_.hidden_size, I = cfg_.intermediate_size;
  // Under tensor parallelism the heads, the MLP width and the vocabulary are split (t);
  // with sequence parallelism the token rows between them too (s).
  const int64_t t = tensor_parallel().size(), s = tensor_parallel().sequence_parallel ? t : 1;
  const int64_t qd = cfg_.num_attention_heads * cfg_.dim_head() / t,
                kvd = std::max<int64_t>(cfg_.num_key_value_heads / t, 1) * cfg_.dim_head();
  // Per layer: norm outputs, q/k/v, context, o, residual, MLP gate/up/product, down, output;
  // and attention's log-sum-exp [B, NH, T].
  int64_t mlp = 3 * I / t;
  if (cfg_.num_experts > 0) {
    // A MoE layer per token: scores [E], K weights, K gathered rows and the K experts'
    // gate/up/product/down, the shared expert's MLP and gate, the output (counted as if
    // every layer were one, an upper bound).
    const int64_t K = cfg_.num_experts_per_tok, Im = cfg_.moe_intermediate_size;
    mlp = std::max(mlp, cfg_.num_experts + K + K * C + K * (3 * Im + C) +
                            3 * cfg_.shared_expert_intermediate_size + 2 + 2 * C);
  }
  const int64_t layer =
      N * (6 * C / s + 2 * qd + 2 * kvd + mlp) + B * T * cfg_.num_attention_heads / t;
  const int64_t scratch = N * (5 * C + mlp + 2 * qd + 2 * kvd);
  return 4 * (blocks_activation_elems(layer, N * C / s) + scratch + N * 2 * C +
              (last_stage() ? head_rows(B * T) * cfg_.vocab_size / t : 0));
}

bool Llama::hf_ignorable(const std::string& name) const {
  // Tied checkpoints may still carry lm_head.weight; older ones carry rotary buffers.
  return (tied_head() && name == "lm_head.weight") || name.ends_with("rotary_emb.inv_freq") ||
         held_elsewhere(name);
}

}  // namespace loom::models
