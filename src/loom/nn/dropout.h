// Dropout whose mask is keyed by logical position, not by rank or call order: element i of
// token row `row` in module `stream` at optimizer step `step` is kept when
// hash32(mix64(rng_u64(seed + step, stream, 0) + row) mod 2^32, i) >= p * 2^32, where row
// counts tokens from the start of the step's global batch (first_row + n) and i is the
// column in the full (unsplit) activation. Every parallel layout that sees the same global batch
// therefore drops the same elements, and backward recomputes the mask instead of storing it.
#pragma once

#include <cstdint>

namespace loom::nn {

// Set by the trainer before each micro-batch; modules hold a pointer to their model's.
struct DropoutContext {
  bool training = false;  // false (evaluation, generation): dropout is the identity
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t first_row = 0;  // global token row of the micro-batch's first token
};

// One module's mask at one micro-batch: row(n, v, width) applies it to row n of the
// micro-batch (v: width values, columns [col0, col0 + width) of the full row), in place.
class DropoutMask {
 public:
  DropoutMask(float p, const DropoutContext& ctx, uint64_t stream, int64_t col0 = 0);
  void row(int64_t n, float* v, int64_t width) const { row_at(first_row_ + n, v, width); }
  // The same for a row given by its place in the global batch (first_row + n of its own
  // micro-batch): rows gathered from elsewhere (a MoE expert's tokens) keep their mask.
  void row_at(int64_t global_row, float* v, int64_t width) const;

 private:
  float keep_scale_;
  uint32_t threshold_;  // dropped when the element's hash is below p * 2^32
  uint64_t key_;
  int64_t first_row_, col0_;
};

// v[rows, width] *= mask / (1 - p), in place. Forward applies it to a copy of the input;
// backward applies the same call to the gradient. v may be columns [col0, col0 + width) of
// wider rows, as a tensor-parallel shard of x is: elements are keyed by (row, col0 + i), so
// the shard drops exactly the elements one process drops.
void dropout_apply(float* v, int64_t rows, int64_t width, float p, const DropoutContext& ctx,
                   uint64_t stream, int64_t col0 = 0);

}  // namespace loom::nn
