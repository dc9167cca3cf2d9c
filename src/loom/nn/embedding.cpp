#include "loom/nn/embedding.h"

#include <cstring>
#include <string>

#include "loom/kernels/cpu/embedding.h"
#include "loom/nn/buffers.h"
#include "loom/nn/weight_ops.h"
#include "loom/util/error.h"

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

VocabParallelEmbedding::VocabParallelEmbedding(ParamStore& ps, const std::string& name, int64_t V,
                                               int64_t C, float init_std, const TensorParallel& tp)
    : V_(V), C_(C), rows_(V), tp_(tp) {
  const ShardSpec shard = tp.active() ? vocab_shard(V, tp, name) : ShardSpec{};
  w_ = ps.add(name + ".weight", {V, C}, ParamKind::Embedding, init_std, 0.0f, shard);
  if (shard.sharded()) {
    first_ = shard.offset;
    rows_ = shard.size;
  }
}

void VocabParallelEmbedding::forward(const int32_t* ids, int64_t N, const Tensor& out) {
  if (!tp_.active()) return weight_rows(out.f32(), ids, N, *w_, /*accumulate=*/false);
  for (int64_t n = 0; n < N; ++n)
    LOOM_CHECK(ids[n] >= 0 && ids[n] < V_,
               "token id " + std::to_string(ids[n]) + " at position " + std::to_string(n) +
                   " is outside the vocabulary of " + std::to_string(V_));
  // Under sequence parallel the lookups of all N tokens go to full_, and out gets this
  // rank's rows of their sum.
  const bool split = tp_.sequence_split();
  if (split) ensure(full_, {N, C_});
  // A frozen table kept in ggml blocks (QLoRA base) holds this rank's rows in blocks too.
  const QuantMatrix* q = w_->quantized() ? w_->quant.get() : nullptr;
  const bool half = w_->half != nullptr;  // mixed precision: the 16-bit rows (weight_ops.h)
  const float* table = q || half ? nullptr : w_->value.f32();
  float* o = split ? full_.f32() : out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = ids[n] - first_;
    if (r < 0 || r >= rows_)
      std::memset(o + n * C_, 0, C_ * sizeof(float));
    else if (q)
      q->dequantize_rows(r, r + 1, o + n * C_);
    else if (half)
      half_row(*w_, r, o + n * C_);
    else
      std::memcpy(o + n * C_, table + r * C_, C_ * sizeof(float));
  }
  if (split)
    reduce_scatter_to_sequence_forward(tp_, full_, out);
  else
    reduce_from_region_forward(tp_, out);
}

void VocabParallelEmbedding::backward(const int32_t* ids, int64_t N, const Tensor& dout) {
  if (!w_->trainable) return;
  if (!tp_.active()) return kernels::embedding_backward(w_->grad.f32(), ids, N, dout.f32(), C_);
  float* g = w_->grad.f32();
  const float* d = dout.f32();
  if (tp_.sequence_split()) {  // this rank's rows: every rank's rows of dout are needed
    ensure(full_, {N, C_});
    reduce_scatter_to_sequence_backward(tp_, dout, full_);
    d = full_.f32();
  }
  for (int64_t n = 0; n < N; ++n) {  // serial: ids repeat
    const int64_t r = ids[n] - first_;
    if (r < 0 || r >= rows_) continue;
    for (int64_t c = 0; c < C_; ++c) g[r * C_ + c] += d[n * C_ + c];
  }
}

}  // namespace loom::nn
