// Products with a frozen weight held in ggml blocks (QuantMatrix W [OC, C], nn.Linear's
// layout), for PEFT on a quantized base. W is dequantized a tile of rows at a time into a
// buffer of about kTileFloats floats, so no more than one tile of f32 ever exists:
//   forward : out[N, OC] = inp[N, C] @ W^T (+ b[OC])
//   backward: dinp[N, C] += dout[N, OC] @ W         (no dW: the weight is frozen)
//   lookup  : out[n, :] (=|+=) W[ids[n], :]         (a quantized embedding table)
// Results equal matmul_forward/backward on the dequantized matrix up to summation order.
#pragma once

#include <cstdint>

#include "loom/tensor/ggml_quant.h"

namespace loom::kernels {

void qmatmul_forward(float* out, const float* inp, const QuantMatrix& W, const float* b, int64_t N,
                     bool accumulate = false);
void qmatmul_backward(float* dinp, const float* dout, const QuantMatrix& W, int64_t N);
void qembedding_forward(float* out, const int32_t* ids, int64_t N, const QuantMatrix& W,
                        bool accumulate);

}  // namespace loom::kernels
