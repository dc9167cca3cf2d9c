#include "loom/models/llama.h"

#include <cmath>
#include <optional>

#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/elementwise.h"
#include "loom/models/hf_config_keys.h"
#include "loom/nn/weight_ops.h"
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
  c.attention_bias = c.model_type == "qwen2" ? true : j.value("attention_bias", false);
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

  // Rotary settings: transformers 4.x keys (rope_theta, rope_scaling) or 5.x's
  // rope_parameters {rope_type, rope_theta, factor, ...}.
  nlohmann::json rs = j.contains("rope_parameters") && j["rope_parameters"].is_object()
                          ? j["rope_parameters"]
                          : j.value("rope_scaling", nlohmann::json());
  c.rope_theta = hf_num(j, "rope_theta", 10000.0, where);
  if (rs.is_object() && rs.contains("rope_theta"))
    c.rope_theta = hf_num(rs, "rope_theta", 1e4, where);
  if (rs.is_object()) {
    std::string type = rs.value("rope_type", rs.value("type", std::string("default")));
    LOOM_CHECK(
        type == "default" || type == "linear" || type == "llama3",
        where + ": rope_scaling type '" + type + "' is not supported (default, linear, llama3)");
    c.rope_scaling.type = type;
    c.rope_scaling.factor = hf_num(rs, "factor", 1.0, where);
    c.rope_scaling.low_freq_factor = hf_num(rs, "low_freq_factor", 1.0, where);
    c.rope_scaling.high_freq_factor = hf_num(rs, "high_freq_factor", 4.0, where);
    c.rope_scaling.original_max_position_embeddings =
        hf_int(rs, "original_max_position_embeddings", 8192, where);
    if (type != "default") c.rope_scaling_json = rs;
  }
  return c;
}

nlohmann::json LlamaConfig::to_hf() const {
  nlohmann::json j;
  j["architectures"] = {model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
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
  if (model_type != "qwen2") j["attention_bias"] = attention_bias;
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_id >= 0) j["eos_token_id"] = eos_token_id;
  j["torch_dtype"] = "float32";
  return j;
}

LlamaBlock::LlamaBlock(nn::ParamStore& ps, const std::string& name, const LlamaConfig& c)
    : PreNormBlock(
          [&] { return nn::RMSNorm(ps, name + ".input_layernorm", c.hidden_size, c.rms_norm_eps); },
          [&] {
            return nn::RMSNorm(ps, name + ".post_attention_layernorm", c.hidden_size,
                               c.rms_norm_eps);
          },
          [&] {
            return nn::GqaAttention(
                ps, name + ".self_attn",
                nn::GqaDims{c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                            c.dim_head(), c.attention_bias,
                            c.attention_bias && c.model_type != "qwen2"},
                c.initializer_range);
          },
          [&] {
            return nn::SwiGluMLP(ps, name + ".mlp", c.hidden_size, c.intermediate_size,
                                 c.initializer_range);
          }) {}

Llama::Llama(const LlamaConfig& c)
    : cfg_(c), embed_(ps_, "model.embed_tokens", c.vocab_size, c.hidden_size, c.initializer_range) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    layers_.push_back(std::make_unique<LlamaBlock>(ps_, "model.layers." + std::to_string(l), c));
  norm_ = std::make_unique<nn::RMSNorm>(ps_, "model.norm", c.hidden_size, c.rms_norm_eps);
  if (!c.tie_word_embeddings)
    lm_head_ = ps_.add("lm_head.weight", {c.vocab_size, c.hidden_size}, nn::ParamKind::Weight,
                       c.initializer_range);
  ps_.materialize();
  inv_freq_ = kernels::rope_inv_freq(c.dim_head(), c.rope_theta, c.rope_scaling);
}

std::vector<nn::Linear*> Llama::linears() {
  std::vector<nn::Linear*> out;
  for (auto& blk : layers_) blk->linears(out);
  return out;
}

void Llama::add_bottleneck_adapters(const nn::AdapterSpec& spec) {
  for (size_t l = 0; l < layers_.size(); ++l)
    layers_[l]->add_adapters(ps_, "model.layers." + std::to_string(l), cfg_.hidden_size, spec);
}

void Llama::add_kv_prefix(const nn::PrefixSpec& spec) {
  prefix_ = std::make_unique<nn::KVPrefix>(ps_, spec, cfg_.num_hidden_layers,
                                           cfg_.num_key_value_heads * cfg_.dim_head());
  for (size_t l = 0; l < layers_.size(); ++l) layers_[l]->attn().attach_prefix(prefix_.get(), l);
  pos_ = Tensor();  // rotary tables now start at position P
}

void Llama::set_rope(const Tensor& pos) {
  const int64_t n = pos.numel(), P = prefix_length();
  std::vector<int32_t> shifted(pos.i32(), pos.i32() + n);
  for (int32_t& p : shifted) p += static_cast<int32_t>(P);
  cos_ = Tensor::zeros({n, cfg_.dim_head() / 2});
  sin_ = Tensor::zeros({n, cfg_.dim_head() / 2});
  kernels::rope_tables(cos_.f32(), sin_.f32(), shifted.data(), n, inv_freq_);
}

int64_t Llama::activation_bytes(int64_t B, int64_t T) const {
  const int64_t N = B * (T + prefix_length()), C = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t qd = cfg_.num_attention_heads * cfg_.dim_head(),
                kvd = cfg_.num_key_value_heads * cfg_.dim_head();
  // Per layer: norm outputs, q/k/v, context, o, residual, MLP gate/up/product, down, output;
  // and the attention probabilities [B, NH, T, P + T].
  const int64_t layer = N * (6 * C + 2 * qd + 2 * kvd + 3 * I) +
                        B * cfg_.num_attention_heads * T * (prefix_length() + T);
  const int64_t scratch = N * (5 * C + 3 * I + 2 * qd + 2 * kvd);
  return 4 * (cfg_.num_hidden_layers * layer + scratch + N * (2 * C + cfg_.vocab_size));
}

int Llama::unit_of(const std::string& n) const {
  if (int u = block_unit(n, "model.layers."); u >= 0) return u;
  if (n.starts_with("prefix_encoder.")) return prefix_unit();
  return n.starts_with("model.embed_tokens.") ? 0 : head_unit();  // model.norm, lm_head
}

nn::Parameter* Llama::head_weight() const { return lm_head_ ? lm_head_ : embed_.weight(); }

bool Llama::hf_ignorable(const std::string& name) const {
  // Tied checkpoints may still carry lm_head.weight; older ones carry rotary buffers.
  return (!lm_head_ && name == "lm_head.weight") || name.ends_with("rotary_emb.inv_freq");
}

const Tensor& Llama::forward(const Tensor& ids, const Tensor& pos) {
  LOOM_CHECK(ids.ndim() == 2, "Llama::forward: ids must be [B, T], got " + shape_str(ids.shape()));
  const int64_t B = ids.dim(0), T = ids.dim(1), C = cfg_.hidden_size, P = prefix_length();
  LOOM_CHECK(P + T <= cfg_.max_position_embeddings,
             "sequence length " + std::to_string(T) +
                 (P ? " after a prefix of " + std::to_string(P) : std::string()) +
                 " exceeds max_position_embeddings " +
                 std::to_string(cfg_.max_position_embeddings));
  ids_ = ids;
  std::optional<UnitScope> pre;  // every layer reads the prefix table
  if (prefix_) {
    pre.emplace(hooks_, prefix_unit());
    prefix_->forward();
  }
  const bool packed = pos.defined();
  if (packed) {
    LOOM_CHECK(pos.shape() == ids.shape(), "position ids " + shape_str(pos.shape()) +
                                               " do not match ids " + shape_str(ids.shape()));
    pos_ = pos;
    set_rope(pos_);
  } else if (!pos_.defined() || pos_.shape() != ids.shape() || pos_is_custom_) {
    pos_ = Tensor::zeros({B, T}, DType::I32);
    for (int64_t i = 0; i < B * T; ++i) pos_.i32()[i] = static_cast<int32_t>(i % T);
    set_rope(pos_);
  }
  nn::ensure(x0_, {B, T, C});
  // A tied head reads the embedding again at the end: hold it for the whole forward rather
  // than gather it twice.
  std::optional<UnitScope> emb(std::in_place, hooks_, 0);
  embed_.forward(ids.i32(), B * T, x0_, /*accumulate=*/false);
  if (lm_head_) emb.reset();
  const Tensor* x = &x0_;
  pos_is_custom_ = packed;
  for (size_t l = 0; l < layers_.size(); ++l) {
    UnitScope u(hooks_, static_cast<int>(l) + 1);
    x = &layers_[l]->forward(*x, cos_, sin_, packed ? pos_.i32() : nullptr);
  }
  UnitScope u(hooks_, head_unit());
  const Tensor& h = norm_->forward(*x);
  nn::ensure(logits_, {B, T, cfg_.vocab_size});
  nn::weight_forward(logits_.f32(), h.f32(), *head_weight(), nullptr, B * T);
  return logits_;
}

KVCache Llama::new_cache() {
  KVCache c;
  c.capacity = cfg_.max_position_embeddings;
  const int64_t width = cfg_.num_key_value_heads * cfg_.dim_head();
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    c.k.push_back(Tensor::zeros({c.capacity, width}));
    c.v.push_back(Tensor::zeros({c.capacity, width}));
  }
  prefill_prefix(c);
  return c;
}

const Tensor& Llama::forward_cached(const Tensor& ids, KVCache& cache) {
  LOOM_CHECK(ids.ndim() == 2 && ids.dim(0) == 1, "forward_cached: ids must be [1, n]");
  const int64_t n = ids.dim(1), past = cache.len, C = cfg_.hidden_size, half = cfg_.dim_head() / 2;
  LOOM_CHECK(past + n <= cache.capacity, "context of " + std::to_string(past + n) +
                                             " tokens exceeds max_position_embeddings " +
                                             std::to_string(cache.capacity));
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(past + i);
  Tensor cos = Tensor::zeros({n, half}), sin = Tensor::zeros({n, half});
  kernels::rope_tables(cos.f32(), sin.f32(), pos.data(), n, inv_freq_);
  nn::ensure(x0_, {1, n, C});
  embed_.forward(ids.i32(), n, x0_, /*accumulate=*/false);
  const Tensor* x = &x0_;
  for (size_t l = 0; l < layers_.size(); ++l)
    x = &layers_[l]->forward_cached(*x, cos, sin, cache.k[l], cache.v[l], past);
  const Tensor& h = norm_->forward(*x);
  nn::ensure(logits_, {1, n, cfg_.vocab_size});
  nn::weight_forward(logits_.f32(), h.f32(), *head_weight(), nullptr, n);
  cache.len += n;
  ids_ = Tensor();  // a training backward must follow a training forward
  return logits_;
}

double Llama::backward(const Tensor& targets, float grad_scale) {
  LOOM_CHECK(ids_.defined(), "Llama::backward called before forward");
  const int64_t B = ids_.dim(0), T = ids_.dim(1), C = cfg_.hidden_size, V = cfg_.vocab_size;
  LOOM_CHECK(targets.shape() == ids_.shape(), "targets " + shape_str(targets.shape()) +
                                                  " do not match ids " + shape_str(ids_.shape()));
  const double loss_sum =
      kernels::cross_entropy_backward(logits_.f32(), targets.i32(), B * T, V, grad_scale);
  std::optional<UnitScope> pre;
  if (prefix_) pre.emplace(hooks_, prefix_unit());
  std::optional<UnitScope> tied;  // the head's weight is the embedding: held to the end
  if (!lm_head_) tied.emplace(hooks_, 0);
  const char* slots[2] = {"llama.dres0", "llama.dres1"};
  int cur = 0;
  Tensor dx = scratch_.zeros(slots[cur], {B, T, C});
  {
    UnitScope u(hooks_, head_unit());
    Tensor dh = scratch_.zeros("llama.dh", {B, T, C});
    nn::weight_backward(dh.f32(), logits_.f32(), norm_->output().f32(), *head_weight(), nullptr,
                        B * T);
    norm_->backward(dh, dx);
  }
  grads_ready(head_unit());
  for (size_t l = layers_.size(); l-- > 0;) {
    Tensor dprev = scratch_.zeros(slots[cur ^ 1], {B, T, C});
    {
      UnitScope u(hooks_, static_cast<int>(l) + 1);
      layers_[l]->backward(dx, dprev, scratch_);
    }
    grads_ready(static_cast<int>(l) + 1);
    dx = dprev;
    cur ^= 1;
  }
  {
    UnitScope u(hooks_, 0);
    embed_.backward(ids_.i32(), B * T, dx);
  }
  tied.reset();
  grads_ready(0);
  if (prefix_) {
    prefix_->backward(scratch_);
    grads_ready(prefix_unit());
  }
  return loss_sum;
}

}  // namespace loom::models
