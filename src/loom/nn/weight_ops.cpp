#include "loom/nn/weight_ops.h"

#include "loom/kernels/cpu/embedding.h"
#include "loom/kernels/cpu/matmul.h"
#include "loom/kernels/cpu/qmatmul.h"

namespace loom::nn {

void weight_forward(float* y, const float* x, const Parameter& w, const Parameter* b, int64_t N) {
  const float* bias = b ? b->value.f32() : nullptr;
  if (w.quantized()) return kernels::qmatmul_forward(y, x, *w.quant, bias, N);
  kernels::matmul_forward(y, x, w.value.f32(), bias, N, w.shape[1], w.shape[0]);
}

void weight_backward(float* dx, const float* dy, const float* x, Parameter& w, Parameter* b,
                     int64_t N) {
  float* db = (b && b->trainable) ? b->grad.f32() : nullptr;
  if (w.quantized()) {  // frozen: only the input gradient, and a bias if it trains
    if (dx) kernels::qmatmul_backward(dx, dy, *w.quant, N);
    if (db)
      kernels::matmul_backward(nullptr, nullptr, db, dy, x, nullptr, N, w.shape[1], w.shape[0]);
    return;
  }
  kernels::matmul_backward(dx, w.trainable ? w.grad.f32() : nullptr, db, dy, x, w.value.f32(), N,
                           w.shape[1], w.shape[0]);
}

void weight_rows(float* out, const int32_t* ids, int64_t N, const Parameter& w, bool accumulate) {
  if (w.quantized()) return kernels::qembedding_forward(out, ids, N, *w.quant, accumulate);
  kernels::embedding_forward(out, ids, N, w.value.f32(), w.shape[0], w.shape[1], accumulate);
}

}  // namespace loom::nn
