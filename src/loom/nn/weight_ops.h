// Products with a weight parameter W [out, in] whatever form it is held in: f32 (through
// BLAS) or frozen ggml blocks (tile by tile, kernels/cpu/qmatmul.h). Linear layers, LM
// heads and embeddings call these, so a quantized base needs no code of its own elsewhere.
//   weight_forward : y[N, out] = x[N, in] @ W^T (+ b)
//   weight_backward: dx[N, in] += dy @ W (dx may be null); dW += dy^T x and db += sum_n dy
//                    when those parameters are trainable
//   weight_rows    : out[n] (=|+=) W[ids[n]]  (embedding lookup)
#pragma once

#include "loom/nn/parameter.h"

namespace loom::nn {

void weight_forward(float* y, const float* x, const Parameter& w, const Parameter* b, int64_t N);
void weight_backward(float* dx, const float* dy, const float* x, Parameter& w, Parameter* b,
                     int64_t N);
void weight_rows(float* out, const int32_t* ids, int64_t N, const Parameter& w, bool accumulate);

}  // namespace loom::nn
