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

// Vocabulary-parallel cross-entropy, the per-rank parts (Megatron's
// vocab_parallel_cross_entropy): logits [N, Vl] are the columns [v0, v0 + Vl) of the full
// logits [N, V]; the caller reduces over the ranks between the calls: the row maxima (max),
// then the target logits and the sums of exponentials (sum). Row n's loss is then
// log(sumexp[n]) - tgt[n]. Ignored rows give 0 everywhere.
//   vp_row_max     : mx[n] = max_j x[n, j] (-inf when Vl == 0)
//   vp_row_partials: sumexp[n] = sum_j exp(x[n, j] - mx[n]); tgt[n] = x[n, t - v0] - mx[n]
//                    when the target t falls in this rank's columns, else 0
//   vp_backward    : x <- grad_scale * (exp(x - mx) / sumexp - onehot(t - v0))
void vp_row_max(const float* logits, int64_t N, int64_t Vl, double* mx);
void vp_row_partials(const float* logits, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                     int64_t V, const double* mx, double* sumexp, double* tgt);
void vp_backward(float* logits, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                 const double* mx, const double* sumexp, float grad_scale);

}  // namespace loom::kernels
