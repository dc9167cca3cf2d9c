#include "loom/models/decoder.h"

#include <algorithm>
#include <optional>

#include "loom/kernels/cpu/rope.h"
#include "loom/nn/moe.h"
#include "loom/util/error.h"

namespace loom::models {

Decoder::Decoder(DecoderSpec spec, ParamBuffers buffers)
    : spec_(std::move(spec)),
      chunks_(spec_.stage.chunks.empty()
                  ? std::vector<std::pair<int64_t, int64_t>>{{0, spec_.layers}}
                  : spec_.stage.chunks),
      first_(chunks_.front().first == 0),
      last_(chunks_.back().second == spec_.layers) {
  for (size_t k = 0; k < chunks_.size(); ++k) {
    const int64_t a = chunks_[k].first, b = chunks_[k].second;
    LOOM_CHECK(0 <= a && a < b && b <= spec_.layers && (k == 0 || chunks_[k - 1].second <= a),
               "internal: pipeline chunk of layers [" + std::to_string(a) + ", " +
                   std::to_string(b) + ") outside the model's " + std::to_string(spec_.layers) +
                   " or out of order");
  }
  if (first_ || (last_ && spec_.tied_head)) {
    tok_embed_ = std::make_unique<nn::VocabParallelEmbedding>(
        ps_, spec_.tok_embed, spec_.vocab, spec_.hidden, spec_.init_std, spec_.tp);
    tok_embed_->weight()->stage_copy = !first_;
  }
  if (first_ && !spec_.pos_embed.empty())
    pos_embed_ = std::make_unique<nn::Embedding>(ps_, spec_.pos_embed, spec_.max_positions,
                                                 spec_.hidden, spec_.init_std);
  for (const auto& [a, b] : chunks_) {
    chunk_start_.push_back(blocks_.size());
    for (int64_t l = a; l < b; ++l) {
      blocks_.push_back(spec_.make_block(ps_, spec_.block_prefix + std::to_string(l)));
      layer_of_.push_back(l);
    }
  }
  chunk_start_.push_back(blocks_.size());
  dinput_.resize(chunks_.size());
  kept_.resize(blocks_.size());
  chunk_out_.resize(chunks_.size());
  recompute_.assign(chunks_.size(), 0);
  if (last_) {
    final_norm_ = spec_.make_norm(ps_, spec_.final_norm);
    nn::Parameter* w =
        spec_.tied_head
            ? tok_embed_->weight()
            : ps_.add(spec_.lm_head + ".weight", {spec_.vocab, spec_.hidden}, nn::ParamKind::Weight,
                      spec_.init_std, 0.0f,
                      spec_.tp.active() ? nn::vocab_shard(spec_.vocab, spec_.tp, spec_.lm_head)
                                        : nn::ShardSpec{});
    head_ = std::make_unique<nn::LMHead>(w, spec_.vocab, spec_.tp);
  }
  if (buffers == ParamBuffers::Allocate) ps_.materialize();
}

bool Decoder::in_other_stage(const std::string& n) const {
  if (const int u = block_unit(n, spec_.block_prefix); u >= 1)
    return std::find(layer_of_.begin(), layer_of_.end(), u - 1) == layer_of_.end();
  if (n.starts_with(spec_.tok_embed + ".")) return !first_ && !(last_ && spec_.tied_head);
  if (!spec_.pos_embed.empty() && n.starts_with(spec_.pos_embed + ".")) return !first_;
  if (n.starts_with(spec_.final_norm + ".") || n.starts_with(spec_.lm_head + ".")) return !last_;
  return false;
}

bool Decoder::held_elsewhere(const std::string& n) const {
  if (in_other_stage(n)) return true;
  const int u = block_unit(n, spec_.block_prefix);
  const size_t at = n.find(".experts.");
  if (u < 1 || at == std::string::npos) return false;
  const size_t a = at + 9, b = n.find('.', a);
  const std::string num = n.substr(a, b == std::string::npos ? b : b - a);
  if (num.empty() || num.size() > 9 || !std::all_of(num.begin(), num.end(), ::isdigit))
    return false;
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (layer_of_[i] == u - 1)
      if (const nn::MoE* m = blocks_[i]->moe()) return !m->holds_expert(std::stoll(num));
  return false;
}

std::vector<MoeLayer> Decoder::moe_layers() const {
  std::vector<MoeLayer> out;
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (nn::MoE* m = blocks_[i]->moe()) out.push_back({layer_of_[i], m});
  return out;
}

std::vector<nn::Linear*> Decoder::linears() {
  std::vector<nn::Linear*> out;
  for (auto& b : blocks_) b->linears(out);
  return out;
}

void Decoder::add_bottleneck_adapters(const nn::AdapterSpec& spec) {
  for (size_t i = 0; i < blocks_.size(); ++i)
    blocks_[i]->add_adapters(ps_, spec_.block_prefix + std::to_string(layer_of_[i]), spec_.hidden,
                             spec);
}

void Decoder::add_kv_prefix(const nn::PrefixSpec& spec) {
  LOOM_CHECK(first_ && last_,
             "prefix tuning under pipeline_parallel.size > 1 is not supported "
             "(every stage would hold the whole prefix table); use LoRA");
  prefix_ = std::make_unique<nn::KVPrefix>(ps_, spec, spec_.layers, spec_.kv_width, spec_.kv_heads,
                                           spec_.tp);
  for (size_t l = 0; l < blocks_.size(); ++l)
    blocks_[l]->attach_prefix(prefix_.get(), static_cast<int64_t>(l));
  pos_ = Tensor();  // positions now start at P
}

int Decoder::unit_of(const std::string& n) const {
  if (int u = block_unit(n, spec_.block_prefix); u >= 0) return u;
  if (n.starts_with("prefix_encoder.")) return prefix_unit();
  const bool emb =
      n.starts_with(spec_.tok_embed + ".") || (pos_embed_ && n.starts_with(spec_.pos_embed + "."));
  return emb ? 0 : head_unit();  // the final norm and an untied head
}

void Decoder::embed(const int32_t* ids, const int32_t* abs_pos, int64_t N, Tensor& x) {
  tok_embed_->forward(ids, N, x);
  // This rank's rows start at token `first` (0 unless sequence parallel).
  const int64_t rows = x.numel() / spec_.hidden,
                first = spec_.tp.sequence_split() ? spec_.tp.first(N) : 0;
  if (pos_embed_) pos_embed_->forward(abs_pos + first, rows, x, /*accumulate=*/true);
}

Shape Decoder::stream_shape(int64_t B, int64_t T) const {
  if (!spec_.tp.sequence_split()) return {B, T, spec_.hidden};
  return {spec_.tp.share(B * T), spec_.hidden};
}

const Tensor& Decoder::gather_for_head(const Tensor& normed) {
  if (!spec_.tp.sequence_split()) return normed;
  nn::ensure(head_in_, {where_.batch, where_.seq, spec_.hidden});
  nn::gather_from_sequence_forward(spec_.tp, normed, head_in_);
  return head_in_;
}

void Decoder::rope_tables(const int32_t* pos, int64_t n, Tensor& cos, Tensor& sin) const {
  if (spec_.rope_inv_freq.empty()) {
    cos = sin = Tensor();
    return;
  }
  const int64_t half = static_cast<int64_t>(spec_.rope_inv_freq.size());
  cos = Tensor::zeros({n, half});  // new tensors: attention keeps the last forward's tables
  sin = Tensor::zeros({n, half});
  kernels::rope_tables(cos.f32(), sin.f32(), pos, n, spec_.rope_inv_freq, spec_.rope_scale);
}

void Decoder::set_positions() {
  const int64_t n = pos_.numel();
  const auto P = static_cast<int32_t>(prefix_length());
  abs_pos_ = Tensor::zeros(pos_.shape(), DType::I32);
  for (int64_t i = 0; i < n; ++i) abs_pos_.i32()[i] = pos_.i32()[i] + P;
  rope_tables(abs_pos_.i32(), n, where_.rope_cos, where_.rope_sin);
}

std::optional<std::pair<size_t, size_t>> Decoder::checkpoint_group(size_t i, int chunk) const {
  const ActivationCheckpointing& ac = checkpointing_;
  if (ac.granularity != ActivationCheckpointing::Granularity::full) return std::nullopt;
  const size_t a = chunk_start_[chunk], b = chunk_start_[chunk + 1], j = i - a,
               k = static_cast<size_t>(ac.num_layers);
  if (ac.block_method) {
    if (j < k) return std::make_pair(i, i);
    return std::nullopt;
  }
  const size_t first = a + j / k * k;
  return std::make_pair(first, std::min(first + k, b) - 1);
}

int64_t Decoder::blocks_activation_elems(int64_t layer, int64_t io) const {
  using G = ActivationCheckpointing::Granularity;
  const ActivationCheckpointing& ac = checkpointing_;
  const auto n_blocks = static_cast<int64_t>(blocks_.size());
  // Selective keeps what none keeps: attention never stores its probabilities.
  if (ac.granularity != G::full) return n_blocks * layer;
  // Full: every chunk keeps its groups' inputs and its output, the blocks outside groups
  // keep everything, and one group at a time (the largest) is rebuilt in backward.
  int64_t kept = 0, group = 0;
  for (size_t c = 0; c + 1 < chunk_start_.size(); ++c) {
    const int64_t n = static_cast<int64_t>(chunk_start_[c + 1] - chunk_start_[c]),
                  k = std::min(ac.num_layers, n);
    if (ac.block_method) {
      kept += k * io + (n - k) * layer + io;
      group = std::max(group, k > 0 ? layer : int64_t{0});
    } else {
      kept += (n + k - 1) / k * io + io;
      group = std::max(group, k * layer);
    }
  }
  return kept + group;
}

const Tensor& Decoder::forward(const Tensor& ids, const Tensor& pos) {
  LOOM_CHECK(first_ && last_, "internal: forward() on a pipeline stage (use forward_stage)");
  return forward_stage(ids, pos, Tensor(), 0);
}

double Decoder::backward(const Tensor& targets, float grad_scale) {
  LOOM_CHECK(first_ && last_, "internal: backward() on a pipeline stage (use backward_stage)");
  return backward_stage(targets, grad_scale, Tensor(), 0);
}

const Tensor& Decoder::forward_stage(const Tensor& ids, const Tensor& pos, const Tensor& x_in,
                                     int chunk) {
  LOOM_CHECK(
      chunk >= 0 && chunk < static_cast<int>(chunks_.size()),
      "internal: model chunk " + std::to_string(chunk) + " of " + std::to_string(chunks_.size()));
  // The model's first and last chunk: the embeddings, and the final norm and head.
  const bool embeds = first_ && chunk == 0,
             heads = last_ && chunk + 1 == static_cast<int>(chunks_.size());
  LOOM_CHECK(ids.ndim() == 2, arch() + ": ids must be [B, T], got " + shape_str(ids.shape()));
  const int64_t B = ids.dim(0), T = ids.dim(1), P = prefix_length();
  LOOM_CHECK(P + T <= spec_.max_positions,
             "sequence length " + std::to_string(T) +
                 (P ? " after a prefix of " + std::to_string(P) : std::string()) +
                 " exceeds the model's " + spec_.max_positions_key + " " +
                 std::to_string(spec_.max_positions));
  const nn::TensorParallel& tp = spec_.tp;
  LOOM_CHECK(!tp.sequence_split() || (B * T) % tp.size() == 0,
             "sequence parallel: a batch of " + std::to_string(B) + " x " + std::to_string(T) +
                 " = " + std::to_string(B * T) + " tokens does not split evenly over " +
                 std::to_string(tp.size()) +
                 " tensor-parallel ranks (batch size x sequence length must divide by them)");
  ids_ = ids;
  std::optional<UnitScope> pre;  // every layer reads the prefix table
  if (prefix_) {
    pre.emplace(hooks_, prefix_unit());
    prefix_->forward();
  }
  // Position ids and the tables derived from them, recomputed only when they change.
  const bool packed = pos.defined();
  if (packed) {
    LOOM_CHECK(pos.shape() == ids.shape(), "position ids " + shape_str(pos.shape()) +
                                               " do not match ids " + shape_str(ids.shape()));
    pos_ = pos;
    set_positions();
  } else if (!pos_.defined() || pos_.shape() != ids.shape() || pos_is_custom_) {
    pos_ = Tensor::zeros({B, T}, DType::I32);
    for (int64_t i = 0; i < B * T; ++i) pos_.i32()[i] = static_cast<int32_t>(i % T);
    set_positions();
  }
  pos_is_custom_ = packed;
  where_.packed = packed ? pos_.i32() : nullptr;
  where_.batch = B;
  where_.seq = T;

  // A tied head reads the embedding again at the end: hold it for the whole forward rather
  // than gather it twice.
  std::optional<UnitScope> emb;
  const Tensor* x = &x_in;
  if (embeds) {
    LOOM_CHECK(!x_in.defined(), "internal: the first pipeline stage embeds its own input");
    nn::ensure(x0_, stream_shape(B, T));
    emb.emplace(hooks_, 0);
    embed(ids.i32(), abs_pos_.i32(), B * T, x0_);
    if (!spec_.tied_head || !heads) emb.reset();
    x = &x0_;
  } else {
    LOOM_CHECK(x_in.defined() && x_in.shape() == stream_shape(B, T),
               "pipeline stage input " + shape_str(x_in.shape()) + " is not the expected " +
                   shape_str(stream_shape(B, T)));
  }
  recompute_[chunk] = 0;
  chunk_out_[chunk] = Tensor();
  for (size_t i = chunk_start_[chunk]; i < chunk_start_[chunk + 1]; ++i) {
    UnitScope u(hooks_, static_cast<int>(layer_of_[i]) + 1);
    const auto group = checkpoint_group(i, chunk);
    if (group && group->first == i) kept_[i] = *x;  // what its recompute starts from
    x = &blocks_[i]->forward(*x, where_);
    if (group && group->second == i) {
      // The group's output is the next block's input (or the chunk's): held here, so the
      // blocks can let go of everything they saved.
      chunk_out_[chunk] = *x;
      for (size_t j = group->first; j <= i; ++j) blocks_[j]->release_activations();
      x = &chunk_out_[chunk];
      recompute_[chunk] = 1;
    }
  }
  if (!heads) return *x;
  if (spec_.tied_head && !emb) emb.emplace(hooks_, 0);
  UnitScope u(hooks_, head_unit());
  return head_->forward(gather_for_head(final_norm_->forward(*x)), checkpointing_.loss_chunk_rows);
}

void Decoder::loss_sums(const Tensor& targets, double* per_row) {
  // A chunked head computes its logits now: its weight (tied: the token table) is held.
  const bool chunked = checkpointing_.loss_chunk_rows > 0;
  std::optional<UnitScope> tied, head;
  if (chunked && spec_.tied_head) tied.emplace(hooks_, 0);
  if (chunked) head.emplace(hooks_, head_unit());
  head_->loss_sums(targets, per_row);
}

double Decoder::backward_stage(const Tensor& targets, float grad_scale, const Tensor& dout,
                               int chunk) {
  LOOM_CHECK(ids_.defined(), arch() + ": backward called before forward");
  const bool embeds = first_ && chunk == 0,
             heads = last_ && chunk + 1 == static_cast<int>(chunks_.size());
  const int64_t B = ids_.dim(0), T = ids_.dim(1), C = spec_.hidden;
  const nn::TensorParallel& tp = spec_.tp;
  const Shape stream = stream_shape(B, T);  // the residual stream's gradients
  std::optional<UnitScope> pre;
  if (prefix_) pre.emplace(hooks_, prefix_unit());
  std::optional<UnitScope> tied;  // the head's weight is the embedding: held to the end
  if (spec_.tied_head && heads) tied.emplace(hooks_, 0);
  // Residual-stream gradients alternate between two buffers as we walk the blocks back.
  const char* slots[2] = {"decoder.dres0", "decoder.dres1"};
  int cur = 0;
  Tensor dx = scratch_.zeros(slots[cur], stream);
  double loss_sum = 0.0;
  if (heads) {
    LOOM_CHECK(targets.shape() == ids_.shape(), "targets " + shape_str(targets.shape()) +
                                                    " do not match ids " + shape_str(ids_.shape()));
    UnitScope u(hooks_, head_unit());
    nn::SequencePartialGrads partial(tp, final_norm_->params());
    Tensor dh = scratch_.zeros("decoder.dh", {B, T, C});  // all rows (the head's input)
    loss_sum = head_->backward(targets, grad_scale, dh);
    if (tp.sequence_split()) {  // partial sums over the ranks: reduce-scattered to rows
      Tensor rows = scratch_.zeros("decoder.dh_rows", stream);
      nn::gather_from_sequence_backward(tp, dh, rows);
      dh = rows;
    }
    final_norm_->backward(dh, dx);
    partial.sum_over_sequence();
    grads_ready(head_unit());
  } else {
    LOOM_CHECK(dout.defined() && dout.shape() == stream,
               "pipeline stage output gradient " + shape_str(dout.shape()) +
                   " is not the expected " + shape_str(stream));
    dx.copy_from(dout);
  }
  // Walks the chunk's blocks back one group at a time (a block that keeps everything is a
  // group of one with nothing to recompute).
  for (size_t last = chunk_start_[chunk + 1]; last-- > chunk_start_[chunk];) {
    const auto group = recompute_[chunk] ? checkpoint_group(last, chunk) : std::nullopt;
    const size_t first = group ? group->first : last;
    // The group's units, acquired in backward order, held through recompute and backward.
    std::vector<std::optional<UnitScope>> held(last - first + 1);
    for (size_t i = last + 1; i-- > first;)
      held[i - first].emplace(hooks_, static_cast<int>(layer_of_[i]) + 1);
    if (group) {  // its forward again, from the input it kept
      const Tensor* x = &kept_[first];
      for (size_t i = first; i <= last; ++i) x = &blocks_[i]->forward(*x, where_);
      kept_[first] = Tensor();
    }
    for (size_t i = last + 1; i-- > first;) {
      const int unit = static_cast<int>(layer_of_[i]) + 1;
      Tensor dprev = scratch_.zeros(slots[cur ^ 1], stream);
      blocks_[i]->backward(dx, dprev, scratch_);
      if (group) blocks_[i]->release_activations();
      held[i - first].reset();
      grads_ready(unit);
      dx = dprev;
      cur ^= 1;
    }
    last = first;
  }
  if (!embeds) {  // the gradient at this chunk's input, for the stage before
    nn::ensure(dinput_[chunk], stream);
    dinput_[chunk].copy_from(dx);
    tied.reset();
    if (spec_.tied_head && heads) grads_ready(0);
    return loss_sum;
  }
  {
    UnitScope u(hooks_, 0);
    if (pos_embed_) {  // this rank's rows under sequence parallel: a partial gradient
      // Only the rows of positions this batch uses (the largest + 1) can have changed.
      const int32_t* ap = abs_pos_.i32();
      const int64_t used = *std::max_element(ap, ap + B * T) + 1;
      nn::SequencePartialGrads partial(tp, {pos_embed_->weight()}, used * C);
      const int64_t first = tp.sequence_split() ? tp.first(B * T) : 0;
      pos_embed_->backward(abs_pos_.i32() + first, dx.numel() / C, dx);
      partial.sum_over_sequence();
    }
    tok_embed_->backward(ids_.i32(), B * T, dx);
  }
  tied.reset();
  grads_ready(0);
  if (prefix_) {
    prefix_->backward(scratch_);
    grads_ready(prefix_unit());
  }
  return loss_sum;
}

KVCache Decoder::new_cache() {
  KVCache c;
  c.capacity = spec_.max_positions;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    c.k.push_back(Tensor::zeros({c.capacity, spec_.kv_width}));
    c.v.push_back(spec_.cache_values ? Tensor::zeros({c.capacity, spec_.kv_width}) : Tensor());
  }
  prefill_prefix(c);
  return c;
}

const Tensor& Decoder::forward_cached(const Tensor& ids, KVCache& cache) {
  LOOM_CHECK(ids.ndim() == 2 && ids.dim(0) == 1, "forward_cached: ids must be [1, n]");
  LOOM_CHECK(!spec_.tp.active() && first_ && last_,
             "generation runs on one process (tensor_parallel.size and pipeline_parallel.size 1)");
  const int64_t n = ids.dim(1), past = cache.len;
  LOOM_CHECK(past + n <= cache.capacity,
             "context of " + std::to_string(past + n) + " tokens exceeds the model's " +
                 spec_.max_positions_key + " " + std::to_string(cache.capacity));
  std::vector<int32_t> pos(n);  // absolute: the cache holds the prefix rows first
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(past + i);
  nn::Positions where;
  rope_tables(pos.data(), n, where.rope_cos, where.rope_sin);
  where.batch = 1;
  where.seq = n;
  nn::ensure(x0_, {1, n, spec_.hidden});
  embed(ids.i32(), pos.data(), n, x0_);
  const Tensor* x = &x0_;
  for (size_t l = 0; l < blocks_.size(); ++l)
    x = &blocks_[l]->forward_cached(*x, where, cache.k[l], cache.v[l], past);
  const Tensor& logits = head_->forward(final_norm_->forward(*x));
  cache.len += n;
  ids_ = Tensor();  // a training backward must follow a training forward
  return logits;
}

}  // namespace loom::models
