#include "loom/models/gpt2.h"

#include <cmath>
#include <cstdio>

#include "loom/models/hf_config_keys.h"
#include "loom/nn/fused_qkv_attention.h"
#include "loom/nn/gelu_mlp.h"
#include "loom/nn/layernorm.h"
#include "loom/nn/prenorm_block.h"
#include "loom/util/error.h"

namespace loom::models {

GPT2Config GPT2Config::from_hf(const nlohmann::json& j, const std::string& where) {
  LOOM_CHECK(j.is_object(), where + ": config must be a JSON object");
  GPT2Config c;
  c.vocab_size = hf_int(j, "vocab_size", c.vocab_size, where);
  c.n_positions = hf_int(j, "n_positions", c.n_positions, where);
  c.n_embd = hf_int(j, "n_embd", c.n_embd, where);
  c.n_layer = hf_int(j, "n_layer", c.n_layer, where);
  c.n_head = hf_int(j, "n_head", c.n_head, where);
  c.n_inner = hf_int(j, "n_inner", 0, where);
  c.layer_norm_epsilon = static_cast<float>(hf_num(j, "layer_norm_epsilon", 1e-5, where));
  c.initializer_range = static_cast<float>(hf_num(j, "initializer_range", 0.02, where));
  for (const char* k : {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head"})
    LOOM_CHECK(hf_int(j, k, 1, where) > 0, where + ": key '" + k + "' must be positive");
  LOOM_CHECK(c.n_embd % c.n_head == 0, where + ": n_embd " + std::to_string(c.n_embd) +
                                           " is not divisible by n_head " +
                                           std::to_string(c.n_head));
  std::string act = j.value("activation_function", std::string("gelu_new"));
  LOOM_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
             where + ": activation_function '" + act +
                 "' is not supported (GPT-2 uses gelu_new, the tanh approximation)");
  LOOM_CHECK(j.value("tie_word_embeddings", true),
             where + ": tie_word_embeddings=false is not supported for GPT-2");
  LOOM_CHECK(j.value("scale_attn_weights", true) &&
                 !j.value("scale_attn_by_inverse_layer_idx", false) &&
                 !j.value("reorder_and_upcast_attn", false),
             where + ": only standard GPT-2 attention scaling (1/sqrt(head_dim)) is supported");
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
    if (hf_num(j, k, 0.0, where) > 0.0) {
      std::fprintf(stderr, "note: %s: %s > 0 is ignored (loom trains GPT-2 without dropout)\n",
                   where.c_str(), k);
      break;
    }
  }
  return c;
}

nlohmann::json GPT2Config::to_hf() const {
  nlohmann::json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = vocab_size;
  j["n_positions"] = n_positions;
  j["n_ctx"] = n_positions;
  j["n_embd"] = n_embd;
  j["n_layer"] = n_layer;
  j["n_head"] = n_head;
  j["n_inner"] = n_inner > 0 ? nlohmann::json(n_inner) : nlohmann::json(nullptr);
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = layer_norm_epsilon;
  j["initializer_range"] = initializer_range;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["tie_word_embeddings"] = true;
  // GPT-2's <|endoftext|> is 50256; a smaller vocabulary (e.g. bytes) has no such token.
  const auto eot = vocab_size > 50256 ? nlohmann::json(50256) : nlohmann::json(nullptr);
  j["bos_token_id"] = eot;
  j["eos_token_id"] = eot;
  j["torch_dtype"] = "float32";
  return j;
}

std::unique_ptr<nn::DecoderBlock> gpt2_block(nn::ParamStore& ps, const std::string& name,
                                             const GPT2Config& c, const nn::TensorParallel& tp) {
  using Block = nn::PreNormBlock<nn::LayerNorm, nn::FusedQKVAttention, nn::GeluMLP>;
  // GPT-2 scales the init of residual output projections by 1/sqrt(2 * n_layer).
  const float proj_std = c.initializer_range / std::sqrt(2.0f * c.n_layer);
  return std::make_unique<Block>(
      [&] { return nn::LayerNorm(ps, name + ".ln_1", c.n_embd, c.layer_norm_epsilon); },
      [&] { return nn::LayerNorm(ps, name + ".ln_2", c.n_embd, c.layer_norm_epsilon); },
      [&] {
        return nn::FusedQKVAttention(ps, name + ".attn", c.n_embd, c.n_head, c.initializer_range,
                                     proj_std, tp);
      },
      [&] {
        return nn::GeluMLP(ps, name + ".mlp", c.n_embd, c.hidden(), c.initializer_range, proj_std,
                           tp);
      },
      tp);
}

namespace {
DecoderSpec gpt2_spec(const GPT2Config& c, const nn::TensorParallel& tp, const StageRange& stage) {
  // Checked before any layer is built, so the error names the heads.
  LOOM_CHECK(c.n_head % tp.size() == 0, "n_head " + std::to_string(c.n_head) +
                                            " is not divisible by tensor_parallel.size " +
                                            std::to_string(tp.size()));
  LOOM_CHECK(c.hidden() % tp.size() == 0, "n_inner " + std::to_string(c.hidden()) +
                                              " is not divisible by tensor_parallel.size " +
                                              std::to_string(tp.size()));
  DecoderSpec s;
  s.tp = tp;
  s.stage = stage;
  s.tok_embed = "transformer.wte";
  s.pos_embed = "transformer.wpe";
  s.block_prefix = "transformer.h.";
  s.final_norm = "transformer.ln_f";
  s.vocab = c.vocab_size;
  s.hidden = c.n_embd;
  s.layers = c.n_layer;
  s.max_positions = c.n_positions;
  s.max_positions_key = "n_positions";
  s.kv_heads = c.n_head;
  s.kv_width = c.n_embd;
  s.tied_head = true;
  s.init_std = c.initializer_range;
  s.make_block = [c, tp](nn::ParamStore& ps, const std::string& name) {
    return gpt2_block(ps, name, c, tp);
  };
  s.make_norm = [c](nn::ParamStore& ps, const std::string& name) {
    return std::make_unique<nn::LayerNorm>(ps, name, c.n_embd, c.layer_norm_epsilon);
  };
  return s;
}
}  // namespace

GPT2::GPT2(const GPT2Config& c, const nn::TensorParallel& tp, const StageRange& stage,
           ParamBuffers buffers)
    : Decoder(gpt2_spec(c, tp, stage), buffers), cfg_(c) {}

int64_t GPT2::activation_bytes(int64_t B, int64_t T) const {
  const int64_t N = B * T, C = cfg_.n_embd, H = cfg_.hidden();
  // Under tensor parallelism q/k/v, the context, the MLP width, the heads and the
  // vocabulary are split (t); with sequence parallelism the token rows between them too (s).
  const int64_t t = tensor_parallel().size(), s = tensor_parallel().sequence_parallel ? t : 1;
  // Per layer: ln_1, qkv, context, c_proj, residual, ln_2, c_fc and GELU, c_proj, output;
  // and attention's log-sum-exp [B, NH, T].
  const int64_t layer = N * (6 * C / s + 4 * C / t + 2 * H / t) + N * cfg_.n_head / t;
  const int64_t scratch = N * (5 * C + 4 * C / t + 2 * H / t);
  return 4 * (blocks_activation_elems(layer, N * C / s) + scratch + N * 2 * C +
              (last_stage() ? head_rows(N) * cfg_.vocab_size / t : 0));
}

bool GPT2::hf_transposed(const nn::Parameter& p) const {
  // transformers' GPT-2 uses Conv1D ([in, out]) for c_attn, c_proj and c_fc weights.
  const std::string& n = p.name;
  return n.ends_with("c_attn.weight") || n.ends_with("c_proj.weight") || n.ends_with("c_fc.weight");
}

bool GPT2::hf_ignorable(const std::string& name) const {
  // The tied head, and the causal-mask buffers older checkpoints carry.
  return name == "lm_head.weight" || name.ends_with(".attn.bias") ||
         name.ends_with(".attn.masked_bias") || in_other_stage(name);
}

}  // namespace loom::models
