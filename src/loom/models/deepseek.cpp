#include "loom/models/deepseek.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "loom/models/hf_config_keys.h"
#include "loom/models/llama.h"
#include "loom/nn/mla_attention.h"
#include "loom/nn/moe.h"
#include "loom/nn/prenorm_block.h"
#include "loom/nn/rmsnorm.h"
#include "loom/nn/swiglu_mlp.h"
#include "loom/util/error.h"

namespace loom::models {

DeepseekConfig DeepseekConfig::from_hf(const nlohmann::json& j, const std::string& where) {
  LOOM_CHECK(j.is_object(), where + ": config must be a JSON object");
  DeepseekConfig c;
  c.model_type = j.value("model_type", std::string("deepseek_v3"));
  const bool v3 = c.v3();
  c.vocab_size = hf_int(j, "vocab_size", v3 ? 129280 : 102400, where);
  c.hidden_size = hf_int(j, "hidden_size", v3 ? 7168 : 4096, where);
  c.intermediate_size = hf_int(j, "intermediate_size", v3 ? 18432 : 11008, where);
  c.moe_intermediate_size = hf_int(j, "moe_intermediate_size", v3 ? 2048 : 1407, where);
  c.num_hidden_layers = hf_int(j, "num_hidden_layers", v3 ? 61 : 32, where);
  c.num_attention_heads = hf_int(j, "num_attention_heads", v3 ? 128 : 32, where);
  c.q_lora_rank = hf_int(j, "q_lora_rank", 0, where);
  if (!j.contains("q_lora_rank")) c.q_lora_rank = 1536;  // both classes' default; null: none
  c.kv_lora_rank = hf_int(j, "kv_lora_rank", 512, where);
  c.qk_nope_head_dim = hf_int(j, "qk_nope_head_dim", 128, where);
  c.qk_rope_head_dim = hf_int(j, "qk_rope_head_dim", 64, where);
  c.v_head_dim = hf_int(j, "v_head_dim", 128, where);
  c.n_routed_experts = hf_int(j, "n_routed_experts", v3 ? 256 : 64, where);
  c.n_shared_experts = hf_int(j, "n_shared_experts", v3 ? 1 : 2, where);
  c.num_experts_per_tok = hf_int(j, "num_experts_per_tok", v3 ? 8 : 1, where);
  c.n_group = std::max<int64_t>(1, hf_int(j, "n_group", v3 ? 8 : 1, where));
  c.topk_group = std::max<int64_t>(1, hf_int(j, "topk_group", v3 ? 4 : 1, where));
  c.first_k_dense_replace = hf_int(j, "first_k_dense_replace", v3 ? 3 : 0, where);
  c.moe_layer_freq = hf_int(j, "moe_layer_freq", 1, where);
  c.norm_topk_prob = j.value("norm_topk_prob", v3);
  c.routed_scaling_factor = hf_num(j, "routed_scaling_factor", v3 ? 2.5 : 1.0, where);
  c.max_position_embeddings = hf_int(j, "max_position_embeddings", v3 ? 4096 : 2048, where);
  c.rms_norm_eps = static_cast<float>(hf_num(j, "rms_norm_eps", 1e-6, where));
  c.initializer_range = static_cast<float>(hf_num(j, "initializer_range", 0.02, where));
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  c.attention_bias = j.value("attention_bias", false);
  c.rope_interleave = v3 ? j.value("rope_interleave", true) : true;  // V2: complex (pairs)
  c.bos_token_id = hf_int(j, "bos_token_id", -1, where);
  c.eos_token_id = j.contains("eos_token_id") && j["eos_token_id"].is_array()
                       ? j["eos_token_id"][0].get<int64_t>()
                       : hf_int(j, "eos_token_id", -1, where);
  c.num_nextn_predict_layers = hf_int(j, "num_nextn_predict_layers", 0, where);
  const HfRope rope = hf_rope(j, where);
  c.rope_theta = rope.theta;
  c.rope_scaling = rope.scaling;
  c.rope_scaling_json = rope.json;

  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim",
                        "max_position_embeddings", "moe_layer_freq"})
    LOOM_CHECK(hf_int(j, k, 1, where) > 0, where + ": key '" + k + "' must be positive");
  LOOM_CHECK(c.qk_rope_head_dim % 2 == 0, where + ": qk_rope_head_dim must be even");
  const int64_t nkv = hf_int(j, "num_key_value_heads", c.num_attention_heads, where);
  LOOM_CHECK(nkv == c.num_attention_heads,
             where + ": num_key_value_heads " + std::to_string(nkv) +
                 " differs from num_attention_heads " + std::to_string(c.num_attention_heads) +
                 " (MLA expands one latent into every head's keys and values)");
  const std::string act = j.value("hidden_act", std::string("silu"));
  LOOM_CHECK(act == "silu", where + ": hidden_act '" + act + "' is not supported (silu)");
  LOOM_CHECK(!j.value("mlp_bias", false), where + ": mlp_bias=true is not supported");

  // Routing: the keys and values Loom implements; anything else is refused by name.
  const std::string scoring = j.value("scoring_func", std::string(v3 ? "sigmoid" : "softmax"));
  LOOM_CHECK(scoring == (v3 ? "sigmoid" : "softmax"),
             where + ": scoring_func '" + scoring + "' is not supported for " + c.model_type +
                 " (" + (v3 ? "sigmoid" : "softmax") + ")");
  c.topk_method = j.value("topk_method", std::string(v3 ? "noaux_tc" : "greedy"));
  if (v3) {
    LOOM_CHECK(c.topk_method == "noaux_tc", where + ": topk_method '" + c.topk_method +
                                                "' is not supported for deepseek_v3 (noaux_tc)");
  } else {
    LOOM_CHECK(c.topk_method == "greedy" || c.topk_method == "group_limited_greedy",
               where + ": topk_method '" + c.topk_method +
                   "' is not supported for deepseek_v2 (greedy, group_limited_greedy)");
    if (c.topk_method == "greedy") c.n_group = c.topk_group = 1;
    c.aux_loss_alpha = hf_num(j, "aux_loss_alpha", 0.0, where);
    LOOM_CHECK(c.aux_loss_alpha >= 0.0, where + ": key 'aux_loss_alpha' must be >= 0");
    LOOM_CHECK(c.aux_loss_alpha == 0.0 || j.value("seq_aux", true),
               where +
                   ": seq_aux=false (the batch-wise balance loss) is not supported; "
                   "seq_aux=true is");
  }
  if (c.n_routed_experts > 0) {
    LOOM_CHECK(c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.n_routed_experts,
               where + ": num_experts_per_tok " + std::to_string(c.num_experts_per_tok) +
                   " must be in [1, n_routed_experts " + std::to_string(c.n_routed_experts) + "]");
    LOOM_CHECK(c.n_routed_experts % c.n_group == 0,
               where + ": n_group " + std::to_string(c.n_group) +
                   " does not divide n_routed_experts " + std::to_string(c.n_routed_experts));
    LOOM_CHECK(c.topk_group <= c.n_group, where + ": topk_group " + std::to_string(c.topk_group) +
                                              " exceeds n_group " + std::to_string(c.n_group));
    LOOM_CHECK(c.moe_intermediate_size > 0,
               where + ": key 'moe_intermediate_size' must be positive");
  }
  return c;
}

nlohmann::json DeepseekConfig::to_hf() const {
  nlohmann::json j;
  j["architectures"] = {v3() ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_attention_heads;
  j["q_lora_rank"] = q_lora_rank > 0 ? nlohmann::json(q_lora_rank) : nlohmann::json(nullptr);
  j["kv_lora_rank"] = kv_lora_rank;
  j["qk_nope_head_dim"] = qk_nope_head_dim;
  j["qk_rope_head_dim"] = qk_rope_head_dim;
  j["v_head_dim"] = v_head_dim;
  j["n_routed_experts"] = n_routed_experts;
  j["n_shared_experts"] = n_shared_experts;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["n_group"] = n_group;
  j["topk_group"] = topk_group;
  j["topk_method"] = topk_method;
  j["first_k_dense_replace"] = first_k_dense_replace;
  j["moe_layer_freq"] = moe_layer_freq;
  j["norm_topk_prob"] = norm_topk_prob;
  j["routed_scaling_factor"] = routed_scaling_factor;
  j["scoring_func"] = v3() ? "sigmoid" : "softmax";
  if (!v3()) {
    j["aux_loss_alpha"] = aux_loss_alpha;
    j["seq_aux"] = true;
  }
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = rope_scaling_json.is_null() ? nlohmann::json(nullptr) : rope_scaling_json;
  if (v3()) {
    j["rope_interleave"] = rope_interleave;
    j["num_nextn_predict_layers"] = num_nextn_predict_layers;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["hidden_act"] = "silu";
  j["initializer_range"] = initializer_range;
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_id >= 0) j["eos_token_id"] = eos_token_id;
  j["torch_dtype"] = "float32";
  return j;
}

namespace {

nn::MlaDims mla_dims(const DeepseekConfig& c) {
  nn::MlaDims d;
  d.hidden = c.hidden_size;
  d.n_head = c.num_attention_heads;
  d.q_lora_rank = c.q_lora_rank;
  d.kv_lora_rank = c.kv_lora_rank;
  d.nope = c.qk_nope_head_dim;
  d.rope = c.qk_rope_head_dim;
  d.v = c.v_head_dim;
  d.bias = c.attention_bias;
  d.interleave = c.rope_interleave;
  // transformers' yarn_apply_mscale: MLA also scales the scores by mscale_all_dim's mscale^2.
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  if (c.rope_scaling.type != "default" && c.rope_scaling.mscale_all_dim != 0.0) {
    const double m = kernels::yarn_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  d.scale = static_cast<float>(scale);
  return d;
}

nn::MoeSpec moe_spec(const DeepseekConfig& c, const StageRange& stage) {
  nn::MoeSpec s;
  s.ep_size = stage.ep_size;
  s.ep_rank = stage.ep_rank;
  s.hidden = c.hidden_size;
  s.inter = c.moe_intermediate_size;
  s.n_shared = c.n_shared_experts;
  s.router.hidden = c.hidden_size;
  s.router.n_experts = c.n_routed_experts;
  s.router.top_k = c.num_experts_per_tok;
  s.router.sigmoid = c.v3();
  s.router.score_bias = c.v3();
  s.router.n_group = c.n_group;
  s.router.topk_group = c.topk_group;
  s.router.norm_topk_prob = c.norm_topk_prob;
  s.router.scaling = static_cast<float>(c.routed_scaling_factor);
  s.router.aux_alpha = static_cast<float>(c.aux_loss_alpha);
  return s;
}

std::unique_ptr<nn::DecoderBlock> deepseek_block(nn::ParamStore& ps, const std::string& name,
                                                 const DeepseekConfig& c, const StageRange& stage) {
  const int64_t layer = std::stoll(name.substr(name.rfind('.') + 1));
  const float std = c.initializer_range;
  auto norm1 = [&] {
    return nn::RMSNorm(ps, name + ".input_layernorm", c.hidden_size, c.rms_norm_eps);
  };
  auto norm2 = [&] {
    return nn::RMSNorm(ps, name + ".post_attention_layernorm", c.hidden_size, c.rms_norm_eps);
  };
  auto attn = [&] { return nn::MlaAttention(ps, name + ".self_attn", mla_dims(c), std); };
  if (!c.moe_layer(layer)) {
    using Block = nn::PreNormBlock<nn::RMSNorm, nn::MlaAttention, nn::SwiGluMLP>;
    return std::make_unique<Block>(norm1, norm2, attn, [&] {
      return nn::SwiGluMLP(ps, name + ".mlp", c.hidden_size, c.intermediate_size, std);
    });
  }
  using Block = nn::PreNormBlock<nn::RMSNorm, nn::MlaAttention, nn::MoE>;
  return std::make_unique<Block>(
      norm1, norm2, attn, [&] { return nn::MoE(ps, name + ".mlp", moe_spec(c, stage), std); });
}

DecoderSpec deepseek_spec(const DeepseekConfig& c, const nn::TensorParallel& tp,
                          const StageRange& stage) {
  LOOM_CHECK(!tp.active(), c.model_type +
                               ": tensor_parallel.size must be 1 (multi-head latent attention "
                               "and the experts are not split over ranks; expert parallelism "
                               "is the way to spread the experts)");
  DecoderSpec s =
      llama_family_spec(c.vocab_size, c.hidden_size, c.num_hidden_layers, c.max_position_embeddings,
                        c.tie_word_embeddings, c.initializer_range, c.rms_norm_eps, tp, stage);
  s.kv_heads = 1;
  s.kv_width = c.kv_lora_rank + c.qk_rope_head_dim;
  s.cache_values = false;
  s.rope_inv_freq = kernels::rope_inv_freq(c.qk_rope_head_dim, c.rope_theta, c.rope_scaling);
  s.rope_scale = static_cast<float>(kernels::rope_attention_factor(c.rope_scaling));
  s.make_block = [c, stage](nn::ParamStore& ps, const std::string& name) {
    return deepseek_block(ps, name, c, stage);
  };
  return s;
}
}  // namespace

Deepseek::Deepseek(const DeepseekConfig& c, const nn::TensorParallel& tp, const StageRange& stage,
                   ParamBuffers buffers)
    : Decoder(deepseek_spec(c, tp, stage), buffers), cfg_(c) {}

int64_t Deepseek::activation_bytes(int64_t B, int64_t T) const {
  const DeepseekConfig& c = cfg_;
  const int64_t N = B * T, C = c.hidden_size, H = c.num_attention_heads, R = c.kv_lora_rank,
                Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim, Dv = c.v_head_dim, Dq = Dn + Dr,
                Dh = std::max(Dq, Dv), Rq = c.q_lora_rank;
  // Attention per token: q (and its latent, normalised), kv_a's output, the latent and its
  // norm, kv_b's output, the rotated key, the padded q/k/v/context heads, the context's
  // value columns, o; norms' inputs/outputs and the residual.
  const int64_t attn =
      H * Dq + 2 * Rq + (R + Dr) + 2 * R + H * (Dn + Dv) + Dr + 4 * H * Dh + H * Dv + C;
  const int64_t dense = 3 * c.intermediate_size + C;
  const int64_t K = c.num_experts_per_tok, I = c.moe_intermediate_size;
  // MoE per token: scores [E], K weights, K gathered rows, K experts' gate/up/product/down,
  // the shared experts' MLP and the output.
  const int64_t moe =
      c.n_routed_experts + K + K * C + K * (3 * I + C) + 3 * I * c.n_shared_experts + 2 * C;
  int64_t layers = 0, n_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (in_other_stage("model.layers." + std::to_string(l) + ".input_layernorm.weight")) continue;
    layers += c.moe_layer(l) ? moe : dense;
    ++n_layers;
  }
  const int64_t per_layer = n_layers > 0 ? N * (attn + 4 * C + layers / n_layers) : 0;
  const int64_t scratch = N * (4 * H * Dh + H * Dq + H * (Dn + Dv) + 2 * (R + Dr) +
                               std::max(3 * c.intermediate_size, K * (2 * C + 3 * I)));
  return 4 * (blocks_activation_elems(per_layer, N * C) + scratch + N * 2 * C +
              (last_stage() ? head_rows(N) * c.vocab_size : 0)) +
         B * H * T * 4 * std::max<int64_t>(n_layers, 1);
}

namespace {
// The number after `prefix` in `name` ("model.layers.12.mlp" -> 12 for "model.layers."), or
// -1 when there is none.
int64_t number_after(const std::string& name, const std::string& prefix, size_t from = 0) {
  const size_t a = name.find(prefix, from);
  if (a == std::string::npos) return -1;
  const size_t s = a + prefix.size(), b = name.find('.', s);
  const std::string num = name.substr(s, b == std::string::npos ? b : b - s);
  if (num.empty() || num.size() > 9 || !std::all_of(num.begin(), num.end(), ::isdigit)) return -1;
  return std::stoll(num);
}
}  // namespace

bool Deepseek::hf_ignorable(const std::string& name) const {
  // V3 checkpoints carry multi-token-prediction layers after the last decoder layer.
  if (name.starts_with("model.layers.") &&
      number_after(name, "model.layers.") >= cfg_.num_hidden_layers)
    return true;

  return (tied_head() && name == "lm_head.weight") || name.ends_with("rotary_emb.inv_freq") ||
         held_elsewhere(name);
}

void Deepseek::add_kv_prefix(const nn::PrefixSpec&) {
  throw Error(cfg_.model_type +
              ": prefix tuning is not supported with multi-head latent attention (its cache is a "
              "compressed latent, not per-head keys and values); use lora or adapter");
}

}  // namespace loom::models
