// The LM head and its loss as one module: logits = h W^T with W [V, C] (the model's own
// lm_head.weight, or the token embedding's table when tied), then softmax cross-entropy
// fused into backward (kernels/cpu/cross_entropy.h).
//   forward : h [B, T, C] -> logits [B, T, Vl]   (owned; saves h)
//   backward: targets [B, T] (i32, -100 = ignore), grad_scale, dh [B, T, C] zeroed by the
//             caller -> the SUM of token losses; the logits buffer becomes dlogits,
//             dh = dlogits W, dW += dlogits^T h when W trains. grad_scale is
//             1 / (target tokens of the whole step).
// Chunked (forward's chunk_rows > 0, what training and evaluation use): forward only saves
// h; backward and loss_sums run the head over chunk_rows token rows at a time, each chunk's
// logits becoming its dlogits in one [chunk_rows, Vl] buffer, so the [B T, Vl] logits are
// never all live (for a 49k vocabulary and 1024 tokens, 200 MB against 50 MB at 256 rows).
// Both run only the rows whose target is not ignored (their loss and dlogits are 0: they
// add nothing to the sums, dh or dW), gathered into chunks, so SFT skips the head on the
// prompt's tokens. The results equal the whole head's but for the order dW's sum and each
// sequence's loss are accumulated in.
// Under tensor parallelism the head is vocabulary-parallel (a column-parallel layer over
// the vocabulary): W holds rows [v0, v0 + Vl) of the full table (its shard), the logits are
// that slice, and the loss is Megatron's vocab-parallel cross-entropy (row max, target
// logit and sum of exponentials reduced over the tp group; its backward needs none). h is
// replicated, so dh is a partial sum: backward all-reduces it (f's backward). Under sequence
// parallel the caller gathered h from the ranks' rows and its gather_from_sequence_backward
// reduce-scatters dh, which sums it: backward leaves dh the partial sum.
#pragma once

#include <vector>

#include "loom/nn/parameter.h"
#include "loom/nn/tensor_parallel.h"

namespace loom::nn {

class LMHead {
 public:
  // vocab: the full vocabulary V (W's full rows).
  LMHead(Parameter* weight, int64_t vocab, const TensorParallel& tp = {});
  // chunk_rows 0: the logits are computed and returned; > 0: chunked, forward returns an
  // undefined tensor.
  const Tensor& forward(const Tensor& h, int64_t chunk_rows = 0);
  double backward(const Tensor& targets, float grad_scale, const Tensor& dh);
  // Forward only (evaluation): targets [B, T] -> per_row[b] = the sum of row b's token
  // losses (ignored targets add 0). Unchunked, the logits stay as they are. Collective
  // over tp.
  void loss_sums(const Tensor& targets, double* per_row);
  Parameter* weight() const { return w_; }
  int64_t vocab_first() const { return v0_; }  // the logits' first column in the full vocab

 private:
  // Cross-entropy of n rows of logits x against t: the sum of their losses. With grad_scale
  // (backward) x becomes dlogits; per_token (n; tensor parallel only) gets each row's loss.
  double chunk_loss(float* x, const int32_t* t, int64_t n, const float* grad_scale,
                    double* per_token);

  // The chunked head's rows: the token rows whose target is not ignored, chunks of `rows`
  // of them, gathered into hg_ (their targets into tg_) unless every row has a target.
  struct TargetRows {
    std::vector<int64_t> keep;
    int64_t rows = 0;
    bool gathered = false;
  };
  struct Chunk {
    const float* h;    // [n, C]: the chunk's rows of h
    const int32_t* t;  // [n]: their targets
  };
  TargetRows target_rows(const int32_t* t, int64_t N);  // also sizes logits_, hg_ and tg_
  Chunk gather(const TargetRows& tr, const int32_t* t, int64_t k0, int64_t n);

  Parameter* w_;
  int64_t V_, v0_;
  TensorParallel tp_;
  Tensor h_, logits_;
  Tensor hg_, dhg_;          // chunked: the gathered target rows of h and their dh
  std::vector<int32_t> tg_;  // and their targets
  int64_t chunk_rows_ = 0;
};

}  // namespace loom::nn
