// Linear layer y = x W^T + b with W [out, in] (nn.Linear's layout; GPT-2's Conv1D
// checkpoints are transposed on load/save in io/). W may be f32 or a frozen quantized
// weight (nn/weight_ops.h); a LoRA branch may be attached (PEFT), adding scale * B A x.
//   forward : x [..., in] -> y [..., out]   (saves x)
//   backward: dy [..., out] -> dx += ...    (dW, db accumulate when trainable)
// Under tensor parallelism (nn/tensor_parallel.h) a Linear is one of Megatron's two splits,
// built as ColumnParallelLinear or RowParallelLinear below; `in`/`out` stay the full sizes
// and the parameters carry their shard (full-tensor coordinates, nn/parameter.h):
//   column: output rows split, W [out/tp, in], b [out/tp]; x replicated -> y [..., out/tp].
//           The caller applies f (copy_to_region) once before the layers that share x.
//   row   : input columns split, W [out, in/tp]; x [..., in/tp] -> partial sums, reduced
//           here (g), then the whole bias added once.
//           With tp.sequence_parallel the reduce is a reduce-scatter to this rank's rows:
//           x [N, in/tp] (N rows, all tokens) -> y [N/tp, out], the bias added to those;
//           backward takes dy [N/tp, out] and all-gathers it to [N, out] first, so the bias
//           gradient (summed over all N rows) is whole on every rank, as without.
// A LoRA branch on a split layer is split with it (nn/lora.h).
#pragma once

#include <memory>
#include <string>

#include "loom/nn/lora.h"
#include "loom/nn/parameter.h"
#include "loom/nn/tensor_parallel.h"

namespace loom::nn {

enum class Split { none, column, row };

class Linear {
 public:
  Linear(ParamStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
         float init_std);
  const Tensor& forward(const Tensor& x);
  void backward(const Tensor& dy, const Tensor& dx);  // dx may be undefined (not needed)

  // Adds a LoRA branch (declares lora_A/lora_B in ps; materialize ps again afterwards).
  LoRA& attach_lora(ParamStore& ps, const LoraSpec& spec, const DropoutContext* ctx);
  LoRA* lora() const { return lora_.get(); }

  const std::string& name() const { return name_; }  // module name, e.g. "...self_attn.q_proj"
  Parameter* weight() const { return w_; }
  Parameter* bias() const { return b_; }
  int64_t in_features() const { return in_; }  // local (this rank's) sizes
  int64_t out_features() const { return out_; }
  const Tensor& output() const { return y_; }  // last forward's y
  // Drops x, y and the branch's saved tensors (activation checkpointing); the next forward
  // allocates y again.
  void release_activations();

 protected:
  // A split of W over tp: column with `parts` output blocks split alike, of which ranks
  // share each slice `replicas` at a time (key/value heads fewer than the ranks); or row.
  Linear(ParamStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
         float init_std, Split split, const TensorParallel& tp, int parts, int replicas);

 private:
  const Tensor& forward_to_sequence(const Tensor& x);  // row-parallel, sequence parallel

  std::string name_;
  Parameter* w_;
  Parameter* b_ = nullptr;
  int64_t in_, out_;
  Split split_ = Split::none;
  TensorParallel tp_;
  int replicas_ = 1;
  std::unique_ptr<LoRA> lora_;
  Tensor x_, y_;
  Tensor full_;  // row-parallel, sequence parallel: partial sums / gathered dy [N, out]
};

// Megatron's ColumnParallelLinear (gather_output=False): y [..., out/tp] = x W_r^T + b_r.
// parts: out is that many equal blocks, each split over the ranks (GPT-2's c_attn: 3).
// replicas: ranks that hold the same slice (tp / replicas slices; their gradients, partial
// sums over the ranks' own heads, are summed over those ranks in backward).
class ColumnParallelLinear : public Linear {
 public:
  ColumnParallelLinear(ParamStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
                       float init_std, const TensorParallel& tp, int parts = 1, int replicas = 1)
      : Linear(ps, name, in, out, bias, init_std, Split::column, tp, parts, replicas) {}
};

// Megatron's RowParallelLinear (input_is_parallel=True): y = g(x_r W_r^T) + b.
class RowParallelLinear : public Linear {
 public:
  RowParallelLinear(ParamStore& ps, const std::string& name, int64_t in, int64_t out, bool bias,
                    float init_std, const TensorParallel& tp)
      : Linear(ps, name, in, out, bias, init_std, Split::row, tp, 1, 1) {}
};

}  // namespace loom::nn
