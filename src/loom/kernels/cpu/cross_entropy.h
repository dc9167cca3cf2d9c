// Softmax cross-entropy over the vocabulary with ignored targets (label == kIgnoreIndex).
// Rows are token positions: logits[N, V], targets[N] (already aligned: target n is the
// label for logits row n).
//   cross_entropy_loss    : returns the SUM of -log softmax(logits)[target] over valid rows.
//   cross_entropy_backward: same sum, and overwrites logits in place with
//                           grad_scale * (softmax - onehot) (zero on ignored rows); the
//                           caller passes grad_scale = 1 / (valid targets in the whole step)
//                           so the step's loss is one mean over all its tokens.
#pragma once

#include <cstdint>

namespace loom::kernels {

inline constexpr int32_t kIgnoreIndex = -100;

double cross_entropy_loss(const float* logits, const int32_t* targets, int64_t N, int64_t V);
double cross_entropy_backward(float* logits, const int32_t* targets, int64_t N, int64_t V,
                              float grad_scale);
int64_t count_targets(const int32_t* targets, int64_t N);

}  // namespace loom::kernels
