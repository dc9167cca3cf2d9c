// Prefix Tuning (Li & Liang 2021) as PEFT implements it for decoder-only models: P virtual
// tokens whose keys and values every layer's attention sees before the real tokens.
// The prefix table [P, L * 2 * KVD] (KVD = num_key_value_heads * head_dim) is PEFT's
// `prompt_embeddings` layout: layer l's keys are columns [2l KVD, (2l+1) KVD) and its
// values [(2l+1) KVD, (2l+2) KVD), kv head g at + g * head_dim. Keys are used as stored
// (no rotary embedding); real tokens take positions P, P+1, ... as in transformers.
// Either the table itself is the parameter (`prefix_encoder.embedding.weight`), or, with
// prefix_projection, PEFT's reparameterisation computes it each step:
//   table = W2 tanh(W1 E + b1) + b2,  E [P, KVD], W1 [H, KVD], W2 [L*2*KVD, H]
// with parameters prefix_encoder.embedding.weight, prefix_encoder.transform.{0,2}.{weight,bias}.
//   forward : -> table [P, L*2*KVD]; also zeroes grad_table()
//   backward: grad_table() (accumulated by the layers' attention) -> parameter gradients
// Tensor parallel: split by key/value head as the attention is. A rank holds the columns of
// its KV heads in each of the 2L key/value blocks: KVD above becomes its width KVD/slices
// (slices = min(tp, NKV); when tp exceeds NKV, tp/NKV ranks hold the same head), and the
// table is ShardSpec{1, 2L, first column, KVD/slices} of the full one (table_shard()).
// Without projection that is the parameter's own shard, so it saves and loads in full
// coordinates; with projection E, W1, b1 are replicated and W2, b2 column-parallel with
// the same 2L blocks. Gradients of a replicated head are summed over its replicas (each
// computes only its query heads' part); with projection the gradient at tanh's output is
// all-reduced over the group (f's backward: each rank has its columns' part).
#pragma once

#include <memory>

#include "loom/kernels/cpu/attention.h"
#include "loom/nn/buffers.h"
#include "loom/nn/linear.h"

namespace loom::nn {

struct PrefixSpec {
  int64_t num_virtual_tokens = 0;
  bool projection = false;
  int64_t encoder_hidden = 0;  // 0: KVD (PEFT's default, encoder_hidden_size = token_dim)
};

class KVPrefix {
 public:
  // kv_width: the full NKV * head_dim; kv_heads (NKV) and tp only matter when tp is active.
  KVPrefix(ParamStore& ps, const PrefixSpec& spec, int64_t n_layers, int64_t kv_width,
           int64_t kv_heads = 1, const TensorParallel& tp = {});
  const Tensor& forward();
  void backward(Scratch& scratch);

  int64_t length() const { return spec_.num_virtual_tokens; }
  int64_t num_layers() const { return layers_; }
  int64_t kv_width() const { return kvd_; }  // this rank's (KVD/slices under tp)
  int64_t full_kv_width() const { return kvd_full_; }
  int64_t stride() const { return 2 * layers_ * kvd_; }  // floats between prefix rows
  // This rank's columns of the full table [P, L*2*KVD] (dim -1: all of it).
  const ShardSpec& table_shard() const { return table_shard_; }
  const float* keys(int64_t layer) const { return table().f32() + 2 * layer * kvd_; }
  const float* values(int64_t layer) const { return keys(layer) + kvd_; }
  float* grad_keys(int64_t layer) { return grad_.f32() + 2 * layer * kvd_; }
  float* grad_values(int64_t layer) { return grad_keys(layer) + kvd_; }
  const Tensor& table() const;  // the last forward's table
  // For a layer's attention: points d's prefix fields at this layer's keys and values, and
  // adds the kernel's per-batch-row gradients dk, dv [B, P, KVD] into grad_table().
  void bind(kernels::AttnDims& d, int64_t layer) const;
  void accumulate(const float* dk, const float* dv, int64_t B, int64_t layer);
  Parameter* embedding() const { return emb_; }
  const PrefixSpec& spec() const { return spec_; }

 private:
  PrefixSpec spec_;
  int64_t layers_, kvd_full_, kvd_;
  TensorParallel tp_;
  int replicas_ = 1;  // ranks holding the same KV heads
  ShardSpec table_shard_;
  Parameter* emb_;
  std::unique_ptr<Linear> w1_;  // projection only
  std::unique_ptr<ColumnParallelLinear> w2_;
  Tensor hidden_, act_, grad_;
};

}  // namespace loom::nn
