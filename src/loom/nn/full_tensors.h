// Full tensors from tensor-parallel shards, for whatever reads a model as one process would
// (checkpoint and adapter writers, `loom verify`). For the scope of a FullTensors object,
// every sharded f32 parameter holds its full tensor on tp rank `root`: value [full_shape],
// shape = full_shape, no shard; the other ranks keep their shards. The destructor puts the
// shards back. Collective over the tp group (construct it on every rank of the group).
// Each full tensor is one all-reduce: the primary copy of every slice (nn/parameter.h)
// writes its elements into zeros, so replicated slices are not counted twice. Quantized
// shards (a frozen base kept in ggml blocks) stay as they are.
#pragma once

#include <vector>

#include "loom/nn/parameter.h"
#include "loom/nn/tensor_parallel.h"

namespace loom::nn {

class FullTensors {
 public:
  FullTensors(ParamStore& ps, const TensorParallel& tp, int root = 0);
  ~FullTensors();
  FullTensors(const FullTensors&) = delete;
  FullTensors& operator=(const FullTensors&) = delete;

 private:
  struct Held {
    Parameter* p;
    Tensor value;
    Shape shape;
    ShardSpec shard;
  };
  std::vector<Held> held_;  // root: the shards replaced for the scope
};

}  // namespace loom::nn
