// Tensor parallelism as Megatron-LM splits a layer: the ranks of one tensor-parallel group
// each hold a slice of every large matrix, and activations move between "replicated" (every
// rank holds all of x [N, C], N tokens) and "split" with four conjugate mappings. They are
// the only places a TP layer communicates:
//   copy_to_region        f: forward identity,  backward all-reduce of dx
//                            (before column-parallel layers: their dx are partial sums)
//   reduce_from_region    g: forward all-reduce, backward identity
//                            (after a row-parallel layer: its outputs are partial sums)
// With sequence parallel, replicated activations between the layers are split by token
// rows instead (rank r holds rows [r N/tp, (r+1) N/tp)) and f, g become:
//   gather_from_sequence   : forward all-gather of the rows,   backward reduce-scatter
//   reduce_scatter_to_sequence: forward reduce-scatter,        backward all-gather
// Each layer in a block calls the forward of a mapping in its forward and the backward of
// the same mapping in its backward, so one grep for these names finds every TP collective.
// Sequence parallel adds one more: replicated parameters whose layers see only this rank's
// rows (norms, adapters, learned positions) get partial gradients, which
// SequencePartialGrads::sum_over_sequence sums over the group after each backward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/dist/communicator.h"
#include "loom/nn/parameter.h"
#include "loom/tensor/tensor.h"

namespace loom::nn {

struct TensorParallel {
  dist::Communicator* comm = nullptr;  // the tensor-parallel group; null: one rank
  bool sequence_parallel = false;
  // Without a communicator, the layout of rank `layout_rank` of `layout_size` ranks: for
  // plans, which build a model's shapes and never run it (a collective would fail).
  int layout_size = 1, layout_rank = 0;

  int size() const { return comm ? comm->size() : layout_size; }
  int rank() const { return comm ? comm->rank() : layout_rank; }
  bool active() const { return size() > 1; }
  // Sequence parallel in effect: the activations between the TP regions are split by rows.
  bool sequence_split() const { return sequence_parallel && active(); }
  // An extent n split evenly: this rank's share and where it starts.
  int64_t share(int64_t n) const { return n / size(); }
  int64_t first(int64_t n) const { return rank() * share(n); }
};

// The rows of a vocabulary-split table [V, ...] this rank holds: V is padded up to a
// multiple of tp and split evenly; the padding rows are held by nobody, so the last ranks
// may hold fewer rows. Throws (naming `name`) when a rank would hold none.
ShardSpec vocab_shard(int64_t V, const TensorParallel& tp, const std::string& name);

// Replicated slices (key/value heads fewer than the ranks): ranks r with the same
// r / replicas hold the same slice of a parameter, and each computes only its own query
// heads' part of that slice's gradient. Sums g [n], this backward's part (never an
// accumulated gradient: that already holds the sum of earlier micro-batches), over those
// ranks, in place. One all-reduce over the tp group; a no-op when replicas == 1.
void sum_over_replicas(const TensorParallel& tp, int replicas, float* g, int64_t n);

// f and g on a buffer of n floats, in place (no-ops on one rank).
void copy_to_region_backward(const TensorParallel& tp, const Tensor& dx);
void reduce_from_region_forward(const TensorParallel& tp, const Tensor& y);
// Sequence parallel: full [N, ...] <-> this rank's rows [N/tp, ...] (N divisible by tp).
void gather_from_sequence_forward(const TensorParallel& tp, const Tensor& local,
                                  const Tensor& full);
void gather_from_sequence_backward(const TensorParallel& tp, const Tensor& dfull,
                                   const Tensor& dlocal);
void reduce_scatter_to_sequence_forward(const TensorParallel& tp, const Tensor& full,
                                        const Tensor& local);
void reduce_scatter_to_sequence_backward(const TensorParallel& tp, const Tensor& dlocal,
                                         const Tensor& dfull);

// Sequence parallel: the gradients of replicated parameters that saw only this rank's rows
// are partial sums over the tp group. Built before a backward, this snapshots their
// gradients; sum_over_sequence() after it all-reduces what that backward added (one
// collective for all of them, on a copy) and adds the sum back. The accumulated gradient is
// never reduced itself, so earlier micro-batches' contributions are not summed again. Frozen
// parameters are skipped; without sequence_split() both calls do nothing. `leading` >= 0:
// only each gradient's first `leading` elements can change in this backward (a position
// table's rows up to the largest position), and only they are summed.
class SequencePartialGrads {
 public:
  SequencePartialGrads(const TensorParallel& tp, const std::vector<Parameter*>& params,
                       int64_t leading = -1);
  void sum_over_sequence();

 private:
  TensorParallel tp_;
  std::vector<Parameter*> params_;  // the trainable ones
  std::vector<int64_t> count_;      // elements of each that are summed
  std::vector<float> before_;       // those elements, concatenated, before the backward
};

}  // namespace loom::nn
