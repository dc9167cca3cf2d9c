// LoRA (Hu et al. 2021) on one Linear, as PEFT defines it:
//   y = x W^T + b + scale * B(A(dropout(x)))
//   A [r, in]  Kaiming-uniform (bound 1/sqrt(in), PEFT's kaiming_uniform_(a=sqrt(5)))
//   B [out, r] zero, so training starts from the base model exactly
//   scale = lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA
// Parameter names are the Linear's plus ".lora_A.weight" / ".lora_B.weight" (PEFT's names
// without the adapter name), so `base_model.model.` + name is PEFT's saved key.
//   forward_add: x [N, in], y [N, out] += ...  (saves x and u = A xd [N, r]; the dropout
//                mask is recomputed in backward, not stored). With accumulate false y is
//                set to the branch, and the base product then adds onto it (one pass over
//                y fewer: BLAS zeroes y in its own pass for beta = 0)
//   backward   : dy [N, out] -> dA, dB accumulate; dx [N, in] += (dropout') scale (dy B) A
// Tensor parallel: the branch is split with the Linear it sits on (nn/linear.h), as
// Megatron/NeMo split LoRA, and its parameters keep their PEFT names and full shapes (the
// slice in their ShardSpec, nn/parameter.h). Sizes below are local unless marked full.
//   column (W's rows split; x [N, in] replicated, y_r [N, out/tp]):
//     A [r, in] replicated; B [out, r] split like W's rows (same parts, offset, size; where
//     W's slice is replicated over KV-head replicas, so is B's, its gradient summed over
//     them as W's). u = A xd [N, r] is the same on every rank; y_r += scale * B_r u.
//     backward: dB_r local; du_r = scale * dy_r B_r is this rank's part of du. dx takes it
//     as it is (the block's f sums dx over the ranks), dA the full du = sum over the group.
//   row (W's columns split; x_r [N, in/tp] = columns [first, first + in/tp) of x):
//     A [r, in] split along in like W; B [out, r] replicated. u = sum over the group of
//     A_r xd_r (one all-reduce of [N, r]); after the Linear's reduction, y += scale * B u once.
//     backward: dy is replicated, so dB and du are the same on every rank; dA_r and dx_r
//     are local. No communication.
// The dropout mask is keyed by x's full column index, so every layout drops the elements
// one process drops.
#pragma once

#include <string>

#include "loom/kernels/cpu/skinny.h"
#include "loom/nn/dropout.h"
#include "loom/nn/parameter.h"
#include "loom/nn/tensor_parallel.h"

namespace loom::nn {

struct LoraSpec {
  int64_t r = 8;
  float alpha = 8.0f;
  bool rslora = false;
  float dropout = 0.0f;
  float scale() const;
};

class LoRA {
 public:
  // in, out: the Linear's full sizes. Under tensor parallelism, w_shard is its weight's
  // shard (dim 0: column split, dim 1: row split) and replicas the ranks sharing a column
  // slice; the defaults are one process.
  LoRA(ParamStore& ps, const std::string& linear_name, int64_t in, int64_t out,
       const LoraSpec& spec, const DropoutContext* ctx, const TensorParallel& tp = {},
       const ShardSpec& w_shard = {}, int replicas = 1);
  // y holds rows [row0, row0 + rows of y) of the N rows of x: a row-parallel layer under
  // sequence parallel adds the branch to its own token rows only (u is computed for all N;
  // its backward then takes the all-gathered dy [N, out]).
  void forward_add(const Tensor& x, const Tensor& y, int64_t row0 = 0, bool accumulate = true);
  void backward(const Tensor& dy, const Tensor& dx);  // dx may be undefined
  // W [out, in] += scale * B @ A: the merged weight (export, or inference without the branch).
  // Under tensor parallelism W is this rank's shard, and B_r A or B A_r is exactly its slice.
  void merge_into(float* W) const;
  // Drops the saved x and u (activation checkpointing: a forward again rebuilds them, and the
  // dropout mask, a function of the position, with them).
  void release_activations() { x_ = u_ = Tensor(); }

  Parameter* A() const { return a_; }
  Parameter* B() const { return b_; }
  const LoraSpec& spec() const { return spec_; }
  const DropoutContext* context() const { return ctx_; }
  // Rows of x that are not the micro-batch's tokens in order (a MoE expert's): the dropout
  // of row n is keyed by rows[n], its token's row in the global batch (DropoutMask::row_at).
  // The array must outlive the next backward; nullptr (the default): rows in order.
  void set_rows(const int64_t* rows) { rows_ = rows; }

 private:
  Parameter *a_, *b_;
  LoraSpec spec_;
  int64_t in_, out_;  // local sizes
  TensorParallel tp_;
  int split_dim_ = -1;  // W's split: 0 column, 1 row, -1 none
  int replicas_ = 1;
  int64_t col0_ = 0;  // x's first column within the full x (the dropout's key)
  const DropoutContext* ctx_;
  uint64_t stream_;
  // The dropout of the last forward as a row transform (empty when it applied none).
  kernels::RowOp dropout_op() const;

  const int64_t* rows_ = nullptr;
  bool dropped_ = false;  // the last forward applied dropout
  Tensor x_, u_;
};

}  // namespace loom::nn
