// The decoder every architecture is: token embedding (+ learned positions) -> blocks ->
// final norm -> LM head + loss (nn/lm_head.h). An architecture (models/gpt2.h,
// models/llama.h) is wiring over it: its parameter names, its block (a factory), its
// final norm, a tied or separate head, learned or rotary positions, and the Hugging Face
// config and names it reads and writes. The forward/backward contract is CausalLM's.
//
// Tensor parallel (spec.tp): the token table is a VocabParallelEmbedding, the head
// vocabulary-parallel (nn/lm_head.h: forward returns this rank's slice of the logits, the
// columns [vocab_first(), +Vl)), the blocks split as their factories build them (LoRA
// branches with their layers), a KV prefix by key/value head as the attention (nn/lora.h,
// nn/kv_prefix.h); norms, learned positions and bottleneck adapters are replicated.
// Generation (forward_cached) runs on one rank.
// Pipeline parallel (spec.stage): the decoder holds only its stage's parameters (models/
// causal_lm.h, StageRange), under their Hugging Face names; the residual stream [B, T, C]
// (rows under sequence parallel) is what crosses between stages.
// Sequence parallel (spec.tp.sequence_parallel): the residual stream between embedding and
// head is this rank's token rows [N/tp, C] of the [N = B*T, C] tokens (B*T must divide by
// tp). The embedding reduce-scatters its lookups to those rows (and adds the learned
// positions of those rows), the blocks gather and scatter around attention and MLP
// (nn/prenorm_block.h), and the final norm's rows are gathered for the head, which sees all
// tokens: forward returns logits [B, T, Vl] as without. The gradients of the learned
// positions and the final norm, partial then, are summed over the group.
//
// Activation checkpointing (models/causal_lm.h): a full-checkpointed group's input stays
// here (kept_, sharing the storage of the tensor it was: the block before's output, x0_ or
// the pipeline's received input), and so does the chunk's output when its last group
// released it; the blocks release the rest (nn/decoder_block.h). Backward acquires a group's
// units in backward order once, for both its recompute and its backward, so the recompute
// fires no hook a forward would (ZeRO-3's gathered parameters are in place for it).
// Positions: a row's tokens sit at 0..T-1 or at the packed ids given; a KV prefix of length
// P shifts them to P.. for the learned position table and the rotary tables, as transformers
// does, while packed-row masking uses the unshifted ids.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/models/causal_lm.h"
#include "loom/nn/buffers.h"
#include "loom/nn/decoder_block.h"
#include "loom/nn/embedding.h"
#include "loom/nn/lm_head.h"
#include "loom/nn/norm.h"

namespace loom::models {

struct DecoderSpec {
  // Hugging Face names: the token table is tok_embed + ".weight"; pos_embed (learned
  // positions, max_positions rows) is "" for none; block l is block_prefix + l; an untied
  // head is lm_head + ".weight".
  std::string tok_embed, pos_embed, block_prefix, final_norm, lm_head = "lm_head";
  int64_t vocab = 0, hidden = 0, layers = 0, max_positions = 0;
  std::string max_positions_key;       // its config.json key, for errors
  int64_t kv_heads = 0, kv_width = 0;  // per layer: key/value heads, their width NKV * D
  // The KV cache holds keys and values [capacity, kv_width] each per layer; false: only the
  // first (MLA caches one [latent | rotary key] row per token, nn/mla_attention.h).
  bool cache_values = true;
  bool tied_head = true;
  float init_std = 0.02f;
  std::vector<float> rope_inv_freq;  // rotary embeddings (D/2 frequencies); empty: none
  float rope_scale = 1.0f;           // the tables' multiplier (yarn's attention factor)
  nn::TensorParallel tp;
  StageRange stage;
  // Builders, called in parameter-declaration order: blocks 0..layers-1, then the final norm.
  std::function<std::unique_ptr<nn::DecoderBlock>(nn::ParamStore&, const std::string& name)>
      make_block;
  std::function<std::unique_ptr<nn::Norm>(nn::ParamStore&, const std::string& name)> make_norm;
};

class Decoder : public CausalLM {
 public:
  nn::ParamStore& params() override { return ps_; }
  const Tensor& forward(const Tensor& ids, const Tensor& pos = Tensor()) override;
  double backward(const Tensor& targets, float grad_scale) override;
  const Tensor& forward_stage(const Tensor& ids, const Tensor& pos, const Tensor& x_in,
                              int chunk) override;
  double backward_stage(const Tensor& targets, float grad_scale, const Tensor& dout,
                        int chunk) override;
  const Tensor& input_grad(int chunk) const override { return dinput_[chunk]; }
  Shape stage_io_shape(int64_t B, int64_t T) const override { return stream_shape(B, T); }
  bool in_other_stage(const std::string& name) const override;
  // Also a routed expert ("<block>.<...>.experts.<e>.") of another expert-parallel rank.
  bool held_elsewhere(const std::string& name) const override;
  std::vector<MoeLayer> moe_layers() const override;  // the blocks whose MLP is a MoE
  nn::Parameter* tied_embedding() const override {
    return spec_.tied_head && tok_embed_ ? tok_embed_->weight() : nullptr;
  }
  bool first_stage() const override { return first_; }
  bool last_stage() const override { return last_; }
  void loss_sums(const Tensor& targets, double* per_row) override;
  KVCache new_cache() override;
  const Tensor& forward_cached(const Tensor& ids, KVCache& cache) override;
  int64_t vocab_size() const override { return spec_.vocab; }
  int64_t max_positions() const override { return spec_.max_positions; }
  std::vector<nn::Linear*> linears() override;
  void add_bottleneck_adapters(const nn::AdapterSpec& spec) override;
  void add_kv_prefix(const nn::PrefixSpec& spec) override;
  int64_t kv_heads() const override { return spec_.kv_heads; }
  int num_layers() const override { return static_cast<int>(spec_.layers); }
  int unit_of(const std::string& param_name) const override;
  // The head reads the token embedding's table (GPT-2, SmolLM2) rather than its own.
  bool tied_head() const { return spec_.tied_head; }
  // The logits' first column in the full vocabulary (0 unless tensor-parallel).
  int64_t vocab_first() const { return head_->vocab_first(); }

 protected:
  // Declares every parameter, and lays out their buffers (values zero until init or load)
  // unless `buffers` says DeclareOnly.
  Decoder(DecoderSpec spec, ParamBuffers buffers);
  const nn::TensorParallel& tensor_parallel() const { return spec_.tp; }
  // Elements the stage's blocks hold for one micro-batch under the activation checkpointing
  // set, from one block's saved elements `layer` and one residual-stream tensor `io` (a
  // group's kept input).
  int64_t blocks_activation_elems(int64_t layer, int64_t io) const;
  // Rows of logits live at once for a micro-batch of n tokens (the loss's chunk, or all).
  int64_t head_rows(int64_t n) const {
    return checkpointing_.loss_chunk_rows > 0 ? std::min(n, checkpointing_.loss_chunk_rows) : n;
  }

 private:
  // Token rows x [N, C] (N = ids' count) = token table rows (+ position rows at abs_pos).
  // Sequence parallel: x is this rank's rows [N/tp, C] of them.
  void embed(const int32_t* ids, const int32_t* abs_pos, int64_t N, Tensor& x);
  // The head's input from the final norm's output: itself, or under sequence parallel its
  // rows gathered to [B, T, C] (head_in_).
  const Tensor& gather_for_head(const Tensor& normed);
  // The shape of the residual stream for a [B, T] batch: [B, T, C] or this rank's rows.
  Shape stream_shape(int64_t B, int64_t T) const;
  // abs_pos_ and the rotary tables for the position ids pos_ shifted by the prefix length.
  void set_positions();
  // Rotary tables [n, D/2] at positions `pos` (none when the model has no rotary embedding).
  void rope_tables(const int32_t* pos, int64_t n, Tensor& cos, Tensor& sin) const;
  // Full activation checkpointing: the group [first, last] of blocks_ that block i of `chunk`
  // belongs to, or nullopt when it keeps everything.
  std::optional<std::pair<size_t, size_t>> checkpoint_group(size_t i, int chunk) const;

  DecoderSpec spec_;
  std::vector<std::pair<int64_t, int64_t>> chunks_;  // this rank's layers (spec.stage)
  bool first_, last_;  // holds the embeddings / the final norm and head
  nn::ParamStore ps_;
  std::unique_ptr<nn::VocabParallelEmbedding> tok_embed_;  // first stage; tied head's copy
  std::unique_ptr<nn::Embedding> pos_embed_;               // learned positions (GPT-2)
  std::vector<std::unique_ptr<nn::DecoderBlock>> blocks_;  // the chunks' layers in order
  std::vector<int64_t> layer_of_;                          // blocks_[i] is layer layer_of_[i]
  std::vector<size_t> chunk_start_;  // chunk k: blocks_[chunk_start_[k], chunk_start_[k + 1])
  std::unique_ptr<nn::Norm> final_norm_;
  std::unique_ptr<nn::LMHead> head_;
  nn::Scratch scratch_;
  Tensor ids_, x0_;
  std::vector<Tensor> dinput_;     // per chunk: the gradient at its input (not the model's first)
  Tensor head_in_;                 // sequence parallel: the final norm's rows gathered [B, T, C]
  Tensor pos_, abs_pos_;           // position ids [B, T] of the forward; + prefix length
  nn::Positions where_;            // what the blocks see (packed ids, rotary tables)
  std::vector<Tensor> kept_;       // per block: its group's input, when it starts one
  std::vector<Tensor> chunk_out_;  // per chunk: its output, when its last group released it
  std::vector<char> recompute_;    // per chunk: its last forward released groups
  bool pos_is_custom_ = false;     // pos_ came from the caller (packed rows)
};

}  // namespace loom::models
