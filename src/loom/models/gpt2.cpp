#include "loom/models/gpt2.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/elementwise.h"
#include "loom/models/hf_config_keys.h"
#include "loom/nn/weight_ops.h"
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

GPT2Block::GPT2Block(nn::ParamStore& ps, const std::string& name, const GPT2Config& c)
    : PreNormBlock(
          [&] { return nn::LayerNorm(ps, name + ".ln_1", c.n_embd, c.layer_norm_epsilon); },
          [&] { return nn::LayerNorm(ps, name + ".ln_2", c.n_embd, c.layer_norm_epsilon); },
          // GPT-2 scales the init of residual output projections by 1/sqrt(2 * n_layer).
          [&] {
            return nn::FusedQKVAttention(ps, name + ".attn", c.n_embd, c.n_head,
                                         c.initializer_range,
                                         c.initializer_range / std::sqrt(2.0f * c.n_layer));
          },
          [&] {
            return nn::GeluMLP(ps, name + ".mlp", c.n_embd, c.hidden(), c.initializer_range,
                               c.initializer_range / std::sqrt(2.0f * c.n_layer));
          }) {}

GPT2::GPT2(const GPT2Config& c)
    : cfg_(c),
      wte_(ps_, "transformer.wte", c.vocab_size, c.n_embd, c.initializer_range),
      wpe_(ps_, "transformer.wpe", c.n_positions, c.n_embd, c.initializer_range) {
  for (int64_t l = 0; l < c.n_layer; ++l)
    blocks_.push_back(std::make_unique<GPT2Block>(ps_, "transformer.h." + std::to_string(l), c));
  ln_f_ = std::make_unique<nn::LayerNorm>(ps_, "transformer.ln_f", c.n_embd, c.layer_norm_epsilon);
  ps_.materialize();
}

std::vector<nn::Linear*> GPT2::linears() {
  std::vector<nn::Linear*> out;
  for (auto& blk : blocks_) blk->linears(out);
  return out;
}

void GPT2::add_bottleneck_adapters(const nn::AdapterSpec& spec) {
  for (size_t l = 0; l < blocks_.size(); ++l)
    blocks_[l]->add_adapters(ps_, "transformer.h." + std::to_string(l), cfg_.n_embd, spec);
}

void GPT2::add_kv_prefix(const nn::PrefixSpec& spec) {
  prefix_ = std::make_unique<nn::KVPrefix>(ps_, spec, cfg_.n_layer, cfg_.n_embd);
  for (size_t l = 0; l < blocks_.size(); ++l) blocks_[l]->attn().attach_prefix(prefix_.get(), l);
}

int64_t GPT2::activation_bytes(int64_t B, int64_t T) const {
  const int64_t N = B * T, C = cfg_.n_embd, H = cfg_.hidden();
  // Per layer: ln_1, qkv, context, c_proj, residual, ln_2, c_fc and GELU, c_proj, output;
  // and the attention probabilities [B, NH, T, P + T].
  const int64_t layer = N * (10 * C + 2 * H) + B * cfg_.n_head * T * (prefix_length() + T);
  const int64_t scratch = N * (9 * C + 2 * H);
  return 4 * (cfg_.n_layer * layer + scratch + N * (2 * C + cfg_.vocab_size));
}

int GPT2::unit_of(const std::string& n) const {
  if (int u = block_unit(n, "transformer.h."); u >= 0) return u;
  if (n.starts_with("prefix_encoder.")) return prefix_unit();
  return n.starts_with("transformer.wte.") || n.starts_with("transformer.wpe.") ? 0 : head_unit();
}

bool GPT2::hf_transposed(const nn::Parameter& p) const {
  // transformers' GPT-2 uses Conv1D ([in, out]) for c_attn, c_proj and c_fc weights.
  const std::string& n = p.name;
  return n.ends_with("c_attn.weight") || n.ends_with("c_proj.weight") || n.ends_with("c_fc.weight");
}

bool GPT2::hf_ignorable(const std::string& name) const {
  // The tied head, and the causal-mask buffers older checkpoints carry.
  return name == "lm_head.weight" || name.ends_with(".attn.bias") ||
         name.ends_with(".attn.masked_bias");
}

const Tensor& GPT2::forward(const Tensor& ids, const Tensor& pos) {
  LOOM_CHECK(ids.ndim() == 2, "GPT2::forward: ids must be [B, T], got " + shape_str(ids.shape()));
  const int64_t B = ids.dim(0), T = ids.dim(1), C = cfg_.n_embd, P = prefix_length();
  LOOM_CHECK(P + T <= cfg_.n_positions,
             "sequence length " + std::to_string(T) +
                 (P ? " after a prefix of " + std::to_string(P) : std::string()) +
                 " exceeds the model's n_positions " + std::to_string(cfg_.n_positions));
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
  } else if (!pos_.defined() || pos_.shape() != ids.shape() || pos_is_custom_) {
    pos_ = Tensor::zeros({B, T}, DType::I32);
    for (int64_t i = 0; i < B * T; ++i) pos_.i32()[i] = static_cast<int32_t>(i % T);
  }
  pos_is_custom_ = packed;
  wpos_ = pos_;
  if (P > 0) {
    wpos_ = Tensor::zeros({B, T}, DType::I32);
    for (int64_t i = 0; i < B * T; ++i) wpos_.i32()[i] = pos_.i32()[i] + static_cast<int32_t>(P);
  }
  nn::ensure(x0_, {B, T, C});
  // The head is wte: hold the embeddings for the whole forward rather than gather twice.
  UnitScope emb(hooks_, 0);
  wte_.forward(ids.i32(), B * T, x0_, /*accumulate=*/false);
  wpe_.forward(wpos_.i32(), B * T, x0_, /*accumulate=*/true);
  const Tensor* x = &x0_;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    UnitScope u(hooks_, static_cast<int>(l) + 1);
    x = &blocks_[l]->forward(*x, packed ? pos_.i32() : nullptr);
  }
  UnitScope u(hooks_, head_unit());
  const Tensor& h = ln_f_->forward(*x);
  nn::ensure(logits_, {B, T, cfg_.vocab_size});
  nn::weight_forward(logits_.f32(), h.f32(), *wte_.weight(), nullptr, B * T);
  return logits_;
}

KVCache GPT2::new_cache() {
  KVCache c;
  c.capacity = cfg_.n_positions;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    c.k.push_back(Tensor::zeros({c.capacity, cfg_.n_embd}));
    c.v.push_back(Tensor::zeros({c.capacity, cfg_.n_embd}));
  }
  prefill_prefix(c);
  return c;
}

const Tensor& GPT2::forward_cached(const Tensor& ids, KVCache& cache) {
  LOOM_CHECK(ids.ndim() == 2 && ids.dim(0) == 1, "forward_cached: ids must be [1, n]");
  const int64_t n = ids.dim(1), past = cache.len, C = cfg_.n_embd;
  LOOM_CHECK(past + n <= cache.capacity, "context of " + std::to_string(past + n) +
                                             " tokens exceeds n_positions " +
                                             std::to_string(cache.capacity));
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(past + i);
  nn::ensure(x0_, {1, n, C});
  wte_.forward(ids.i32(), n, x0_, /*accumulate=*/false);
  wpe_.forward(pos.data(), n, x0_, /*accumulate=*/true);
  const Tensor* x = &x0_;
  for (size_t l = 0; l < blocks_.size(); ++l)
    x = &blocks_[l]->forward_cached(*x, cache.k[l], cache.v[l], past);
  const Tensor& h = ln_f_->forward(*x);
  nn::ensure(logits_, {1, n, cfg_.vocab_size});
  nn::weight_forward(logits_.f32(), h.f32(), *wte_.weight(), nullptr, n);
  cache.len += n;
  ids_ = Tensor();
  return logits_;
}

double GPT2::backward(const Tensor& targets, float grad_scale) {
  LOOM_CHECK(ids_.defined(), "GPT2::backward called before forward");
  const int64_t B = ids_.dim(0), T = ids_.dim(1), C = cfg_.n_embd, V = cfg_.vocab_size;
  LOOM_CHECK(targets.shape() == ids_.shape(), "targets " + shape_str(targets.shape()) +
                                                  " do not match ids " + shape_str(ids_.shape()));
  const double loss_sum =
      kernels::cross_entropy_backward(logits_.f32(), targets.i32(), B * T, V, grad_scale);
  std::optional<UnitScope> pre;
  if (prefix_) pre.emplace(hooks_, prefix_unit());
  std::optional<UnitScope> tied(std::in_place, hooks_, 0);  // wte, held to the end
  // Residual-stream gradients alternate between two buffers as we walk the blocks back.
  const char* slots[2] = {"gpt2.dres0", "gpt2.dres1"};
  int cur = 0;
  Tensor dx = scratch_.zeros(slots[cur], {B, T, C});
  {
    // LM head, tied to wte: logits [B*T, V] = h [B*T, C] @ wte[V, C]^T
    UnitScope u(hooks_, head_unit());
    Tensor dh = scratch_.zeros("gpt2.dh", {B, T, C});
    nn::weight_backward(dh.f32(), logits_.f32(), ln_f_->output().f32(), *wte_.weight(), nullptr,
                        B * T);
    ln_f_->backward(dh, dx);
  }
  grads_ready(head_unit());
  for (size_t l = blocks_.size(); l-- > 0;) {
    Tensor dprev = scratch_.zeros(slots[cur ^ 1], {B, T, C});
    {
      UnitScope u(hooks_, static_cast<int>(l) + 1);
      blocks_[l]->backward(dx, dprev, scratch_);
    }
    grads_ready(static_cast<int>(l) + 1);
    dx = dprev;
    cur ^= 1;
  }
  {
    UnitScope u(hooks_, 0);
    wpe_.backward(wpos_.i32(), B * T, dx);
    wte_.backward(ids_.i32(), B * T, dx);
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
