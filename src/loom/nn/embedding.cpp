#include "loom/nn/embedding.h"

#include "loom/kernels/cpu/embedding.h"
#include "loom/nn/weight_ops.h"

namespace loom::nn {

Embedding::Embedding(ParamStore& ps, const std::string& name, int64_t rows, int64_t C,
                     float init_std)
    : C_(C) {
  w_ = ps.add(name + ".weight", {rows, C}, ParamKind::Embedding, init_std);
}

void Embedding::forward(const int32_t* ids, int64_t N, const Tensor& out, bool accumulate) {
  weight_rows(out.f32(), ids, N, *w_, accumulate);
}

void Embedding::backward(const int32_t* ids, int64_t N, const Tensor& dout) {
  if (w_->trainable) kernels::embedding_backward(w_->grad.f32(), ids, N, dout.f32(), C_);
}

}  // namespace loom::nn
