#include "loom/nn/weight_ops.h"

#include <string>
#include <vector>

#include "loom/kernels/cpu/embedding.h"
#include "loom/kernels/cpu/matmul.h"
#include "loom/kernels/cpu/matmul_bf16.h"
#include "loom/kernels/cpu/qmatmul.h"
#include "loom/util/error.h"
#include "loom/util/profile.h"

namespace loom::nn {

Tensor half_zeros(const std::vector<int64_t>& shape, kernels::Half f) {
  return Tensor::zeros(shape, f == kernels::Half::bf16 ? DType::BF16 : DType::F16);
}

namespace {

// w's 16-bit copy, converted from its f32 value when stale (allocated again after a ZeRO-3
// release dropped it).
const uint16_t* half_weight(const Parameter& w) {
  HalfCopy& h = *w.half;
  LOOM_CHECK(!h.gathered || h.data.defined(),
             "internal: " + w.name + "'s gathered 16-bit weight is not in place");
  if (!h.data.defined()) {
    h.data = half_zeros(w.shape, h.format);
    h.stale = true;
  }
  if (h.stale && h.from_value()) {
    kernels::to_half(h.format, w.value.f32(), static_cast<uint16_t*>(h.data.raw()), h.data.numel());
    h.stale = false;
  }
  return static_cast<const uint16_t*>(h.data.raw());
}

// An fp32 activation rounded to the 16-bit format, in a per-thread buffer reused across calls
// (slot: two operands of one product are live at once).
const uint16_t* rounded(kernels::Half f, const float* x, int64_t n, int slot) {
  // The 16-bit GEMM's operand preparation, timed with it (as BLAS's own packing is).
  prof::ScopedPhase ph(prof::Phase::Gemm);
  thread_local std::vector<uint16_t> buf[2];
  buf[slot].resize(static_cast<size_t>(n));
  kernels::to_half(f, x, buf[slot].data(), n);
  return buf[slot].data();
}
}  // namespace

void half_row(const Parameter& w, int64_t r, float* out) {
  const int64_t C = w.shape[1];
  kernels::from_half(w.half->format, half_weight(w) + r * C, out, C);
}

bool takes_half(const Parameter& p) {
  return p.shape.size() == 2 && !p.quantized() && !p.adapter &&
         (p.kind == ParamKind::Weight || p.kind == ParamKind::Embedding);
}

void use_half_weights(ParamStore& ps, kernels::Half format) {
  for (const auto& p : ps.all())
    if (takes_half(*p) && !p->half)
      p->half = std::make_shared<HalfCopy>(HalfCopy{
          format, p->value.defined() ? half_zeros(p->shape, format) : Tensor(), true, false});
}

void hold_frozen_in_half(ParamStore& ps, kernels::Half format,
                         const std::function<int(const Parameter&)>& group) {
  bool any = false;
  for (const auto& p : ps.all()) {
    if (p->trainable || !takes_half(*p) || p->held_in_half()) continue;
    hold_in_half(*p, p->value.f32(), format);  // converted from the f32 value while it exists
    any = true;
  }
  if (any) ps.materialize(group);  // lays the store out without their f32 values
}

void hold_in_half(Parameter& p, const float* v, kernels::Half format) {
  LOOM_CHECK(takes_half(p), "internal: " + p.name + " is not a matrix to hold in 16 bits");
  Tensor data = half_zeros(p.shape, format);
  kernels::to_half(format, v, static_cast<uint16_t*>(data.raw()), data.numel());
  p.half = std::make_shared<HalfCopy>(HalfCopy{format, data, false, true});
  p.trainable = false;
}

void mark_half_stale(const Parameter& p) {
  if (p.half) p.half->stale = true;
}

void weight_forward(float* y, const float* x, const Parameter& w, const Parameter* b, int64_t N,
                    bool accumulate) {
  const float* bias = b ? b->value.f32() : nullptr;
  if (w.quantized()) return kernels::qmatmul_forward(y, x, *w.quant, bias, N, accumulate);
  if (w.half) {
    const int64_t C = w.shape[1];
    return kernels::matmul_forward_half(w.half->format, y, rounded(w.half->format, x, N * C, 0),
                                        half_weight(w), bias, N, C, w.shape[0], accumulate);
  }
  kernels::matmul_forward(y, x, w.value.f32(), bias, N, w.shape[1], w.shape[0], accumulate);
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
  if (w.half) {
    const kernels::Half f = w.half->format;
    const int64_t C = w.shape[1], OC = w.shape[0];
    const uint16_t* dyh = rounded(f, dy, N * OC, 0);
    const uint16_t* xh = w.trainable ? rounded(f, x, N * C, 1) : nullptr;
    return kernels::matmul_backward_half(f, dx, w.trainable ? w.grad.f32() : nullptr, db, dyh, xh,
                                         half_weight(w), N, C, OC);
  }
  kernels::matmul_backward(dx, w.trainable ? w.grad.f32() : nullptr, db, dy, x, w.value.f32(), N,
                           w.shape[1], w.shape[0]);
}

void weight_rows(float* out, const int32_t* ids, int64_t N, const Parameter& w, bool accumulate) {
  if (w.quantized()) return kernels::qembedding_forward(out, ids, N, *w.quant, accumulate);
  if (w.half) {
    const int64_t rows = w.shape[0], C = w.shape[1];
    for (int64_t n = 0; n < N; ++n)
      LOOM_CHECK(ids[n] >= 0 && ids[n] < rows,
                 "token id " + std::to_string(ids[n]) + " at position " + std::to_string(n) +
                     " is outside the embedding table of " + std::to_string(rows) + " rows");
    std::vector<float> row(static_cast<size_t>(C));
    for (int64_t n = 0; n < N; ++n) {
      half_row(w, ids[n], row.data());
      float* o = out + n * C;
      for (int64_t i = 0; i < C; ++i) o[i] = accumulate ? o[i] + row[i] : row[i];
    }
    return;
  }
  kernels::embedding_forward(out, ids, N, w.value.f32(), w.shape[0], w.shape[1], accumulate);
}

}  // namespace loom::nn
