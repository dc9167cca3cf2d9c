// The order in which one pipeline rank runs its forwards and backwards in a step, as a
// list a reader (or a test) can print. p ranks, m micro-batches, rank r, v model chunks
// per rank (chunk c of rank r is the model's chunk c * p + r):
//   gpipe      : F0 F1 .. F(m-1), then B0 B1 .. B(m-1): every micro-batch's activations held
//   1f1b       : PipeDream-Flush (Megatron's forward_backward_pipelining_without_
//                interleaving): warm-up w = min(p - r - 1, m) forwards, then one forward and
//                one backward while forwards remain, then the last w backwards. Rank r holds
//                at most min(p - r, m) micro-batches' activations.
//   interleaved: Megatron's forward_backward_pipelining_with_interleaving, v > 1, m a
//                multiple of p: the m * v (chunk, micro-batch) passes go in groups of p
//                micro-batches through chunk 0, 1, .. v-1 forward (v-1 .. 0 backward);
//                warm-up (p - r - 1) * 2 + (v - 1) * p of them (all when m = p), then 1F1B.
//                The bubble shrinks to (p - 1) / (v m + p - 1).
// Backwards of a chunk run in micro-batch order, so a rank accumulates its gradients in the
// order one process does. Dependencies (parallel/pipeline_stage.h does the sending): a
// forward of chunk c on rank r > 0 takes its input from rank r - 1's chunk c, on rank 0 from
// rank p - 1's chunk c - 1; backwards mirror it.
#pragma once

#include <string>
#include <vector>

namespace loom::parallel {

struct Pass {
  enum Kind : char { Forward = 'F', Backward = 'B' } kind;
  int micro;      // micro-batch index
  int chunk = 0;  // the rank's model chunk (interleaved)
  bool operator==(const Pass&) const = default;
};

// Throws loom::Error for an unknown schedule or sizes out of range (interleaved: m not a
// multiple of p, named as gradient_accumulation_steps).
std::vector<Pass> stage_schedule(const std::string& schedule, int p, int r, int m, int v = 1);

// The most micro-batches whose activations a rank holds at once: from the forward of a
// micro-batch's first chunk to the backward of it (its last pass on the rank).
int max_in_flight(const std::vector<Pass>& passes);

std::string schedule_str(const std::vector<Pass>& passes);  // "F0 F1 B0 F2 B1 B2"; "F0.1" chunk 1

}  // namespace loom::parallel
