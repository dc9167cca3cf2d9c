// One rank's stage of a pipeline (Megatron's pipeline schedules, GPipe): runs a step's
// micro-batches through the rank's schedule (parallel/pipeline_schedule.h), receiving each
// forward's input from the stage before and each backward's output gradient from the stage
// after, and sending its own on, over the pipeline group (dist::ProcessMesh::pp()). With
// the interleaved schedule the rank holds v model chunks; chunk c's input comes from rank
// r - 1's chunk c (rank 0: rank p - 1's chunk c - 1).
// Activations per micro-batch: a rank keeps several micro-batches in flight, and a model
// keeps one micro-batch's saved tensors inside its modules; so the rank holds one model per
// micro-batch it may hold at once (its activation contexts, max_in_flight of the schedule):
// the first is the stage's model, the others copies of its modules over the same parameters
// (parallel::ZeroEngine::add_context), so gradients accumulate in one place. A micro-batch
// takes a free context at its first forward on the rank and gives it back after its last
// backward.
// Point-to-point: every receive of the step is posted before the first pass (so no send can
// wait on a peer that is itself waiting), each waited for when its pass needs it; a send
// starts as soon as its pass is done and is waited for before its buffer is written again.
// Tags name the receiver's (chunk, micro-batch): 2 (c m + i) for activations, + 1 for
// gradients.
// Trace (util/trace.h): each pass is a span F<i> / B<i> (F<i>.<c> for chunk c > 0) around
// the stage's compute alone; the sends, receives and waits around it carry micro-batch i.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "loom/dist/communicator.h"
#include "loom/models/causal_lm.h"
#include "loom/parallel/pipeline_schedule.h"
#include "loom/parallel/zero.h"

namespace loom::parallel {

struct MicroBatchTensors {
  Tensor ids, pos, targets;  // [B, T]; pos undefined for unpacked rows
};

// What the trainer does around the passes: before_forward(model, i) just before micro-batch
// i's forward on the context that runs it (its dropout state); before_backward and
// after_backward around every backward (the ZeRO engine's gradient buffers).
struct PassHooks {
  std::function<void(models::CausalLM&, int)> before_forward;
  std::function<void()> before_backward, after_backward;
};

class PipelineStage {
 public:
  // contexts[0] is the stage's model; pp: the pipeline group (rank = stage); chunks: the
  // model chunks each rank holds (virtual_stages).
  PipelineStage(std::vector<models::CausalLM*> contexts, dist::Communicator& pp,
                std::string schedule, int chunks = 1);

  // Forward and backward of every micro-batch, gradients accumulated in the stage's
  // parameters. Returns the sum of the token losses on the last stage, 0 on the others.
  double train(const std::vector<MicroBatchTensors>& micro, float grad_scale,
               const PassHooks& hooks);
  // Forward only (evaluation), on the stage's model: returns it on the last stage (its
  // logits ready for loss_sums), nullptr on the others.
  models::CausalLM* forward(const Tensor& ids, const Tensor& pos);
  // Tied embeddings: the first and the last stage each hold the token table. After the
  // engine's reduction over dp, every dp rank of the two swaps the table's summed gradient
  // with its peer and adds it to its own (a + b on one, b + a on the other: the same bits
  // for any dp size and ZeRO stage), so both copies take the same update. No-op elsewhere.
  void sum_tied_grads(ZeroEngine& engine);

  const std::vector<Pass>& last_schedule() const { return passes_; }
  int contexts() const { return static_cast<int>(contexts_.size()); }

 private:
  std::vector<models::CausalLM*> contexts_;
  dist::Communicator& pp_;
  // The ranks before and after this one in model order: a chunk's input comes from the
  // first and its output goes to the second (around the ring between chunks).
  int prev_rank() const { return (pp_.rank() + pp_.size() - 1) % pp_.size(); }
  int next_rank() const { return (pp_.rank() + 1) % pp_.size(); }
  bool model_first(int c) const { return pp_.rank() == 0 && c == 0; }
  bool model_last(int c) const { return pp_.rank() == pp_.size() - 1 && c == chunks_ - 1; }

  std::string schedule_;
  int chunks_;
  std::vector<Pass> passes_;
  std::vector<Tensor> act_in_, grad_in_;  // per (chunk, micro-batch): received input / gradient
};

}  // namespace loom::parallel
