// Embedding table [rows, C]: ids [N] -> out [N, C]. Backward scatters into the table's grad.
// VocabParallelEmbedding: the token table split by rows over the tensor-parallel group.
#pragma once

#include <string>

#include "loom/nn/parameter.h"
#include "loom/nn/tensor_parallel.h"

namespace loom::nn {

class Embedding {
 public:
  Embedding(ParamStore& ps, const std::string& name, int64_t rows, int64_t C, float init_std);
  // out [N, C] = table[ids] (accumulate: out += table[ids]).
  void forward(const int32_t* ids, int64_t N, const Tensor& out, bool accumulate);
  void backward(const int32_t* ids, int64_t N, const Tensor& dout);
  Parameter* weight() const { return w_; }

 private:
  Parameter* w_;
  int64_t C_;
};

// Megatron's VocabParallelEmbedding: rank r holds rows vocab_shard(V, tp) of the table [V, C]
// (nn/tensor_parallel.h; the vocabulary padded to a multiple of tp, the padding never held).
//   forward : out [N, C] = g(rows of the ids in this rank's range, zeros for the others)
//   backward: dout [N, C] (replicated) scattered into this rank's rows; no communication
// With tp.sequence_parallel, g is a reduce-scatter to this rank's token rows instead:
//   forward : ids [N] (all tokens) -> out [N/tp, C], rows [r N/tp, (r+1) N/tp)
//   backward: dout [N/tp, C] all-gathered to [N, C], then scattered as above
// On one rank it is an Embedding.
class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(ParamStore& ps, const std::string& name, int64_t V, int64_t C,
                         float init_std, const TensorParallel& tp);
  void forward(const int32_t* ids, int64_t N, const Tensor& out);
  void backward(const int32_t* ids, int64_t N, const Tensor& dout);
  Parameter* weight() const { return w_; }

 private:
  Parameter* w_;
  int64_t V_, C_, first_ = 0, rows_;
  TensorParallel tp_;
  Tensor full_;  // sequence parallel: the partial lookups / gathered dout [N, C]
};

}  // namespace loom::nn
