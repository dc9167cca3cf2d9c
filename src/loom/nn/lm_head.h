// The LM head and its loss as one module: logits = h W^T with W [V, C] (the model's own
// lm_head.weight, or the token embedding's table when tied), then softmax cross-entropy
// fused into backward (kernels/cpu/cross_entropy.h).
//   forward : h [B, T, C] -> logits [B, T, Vl]   (owned; saves h)
//   backward: targets [B, T] (i32, -100 = ignore), grad_scale, dh [B, T, C] zeroed by the
//             caller -> the SUM of token losses; the logits buffer becomes dlogits,
//             dh = dlogits W, dW += dlogits^T h when W trains. grad_scale is
//             1 / (target tokens of the whole step).
// Under tensor parallelism the head is vocabulary-parallel (a column-parallel layer over
// the vocabulary): W holds rows [v0, v0 + Vl) of the full table (its shard), the logits are
// that slice, and the loss is Megatron's vocab-parallel cross-entropy (row max, target
// logit and sum of exponentials reduced over the tp group; its backward needs none). h is
// replicated, so dh is a partial sum: backward all-reduces it (f's backward). Under sequence
// parallel the caller gathered h from the ranks' rows and its gather_from_sequence_backward
// reduce-scatters dh, which sums it: backward leaves dh the partial sum.
#pragma once

#include "loom/nn/parameter.h"
#include "loom/nn/tensor_parallel.h"

namespace loom::nn {

class LMHead {
 public:
  // vocab: the full vocabulary V (W's full rows).
  LMHead(Parameter* weight, int64_t vocab, const TensorParallel& tp = {});
  const Tensor& forward(const Tensor& h);
  double backward(const Tensor& targets, float grad_scale, const Tensor& dh);
  // Forward only (evaluation): targets [B, T] -> per_row[b] = the sum of row b's token
  // losses (ignored targets add 0). The logits stay as they are. Collective over tp.
  void loss_sums(const Tensor& targets, double* per_row) const;
  Parameter* weight() const { return w_; }
  const Tensor& logits() const { return logits_; }
  int64_t vocab_first() const { return v0_; }  // the logits' first column in the full vocab

 private:
  Parameter* w_;
  int64_t V_, v0_;
  TensorParallel tp_;
  Tensor h_, logits_;
};

}  // namespace loom::nn
