// Products with a weight parameter W [out, in] whatever form it is held in: f32 (through
// BLAS), frozen ggml blocks (tile by tile, kernels/cpu/qmatmul.h) or, under mixed
// precision, its 16-bit copy (p.half): then x and dy are rounded to the same format and the
// GEMMs accumulate in fp32 (kernels/cpu/matmul_bf16.h), while the bias, the outputs and the
// gradients stay fp32 - torch.autocast's rule for linear layers. Linear layers, LM heads
// and embeddings call these, so a quantized or 16-bit base needs no code of its own elsewhere.
//   weight_forward : y[N, out] (=|+= with accumulate) x[N, in] @ W^T (+ b)
//   weight_backward: dx[N, in] += dy @ W (dx may be null); dW += dy^T x and db += sum_n dy
//                    when those parameters are trainable
//   weight_rows    : out[n] (=|+=) W[ids[n]]  (embedding lookup; under mixed precision the
//                    16-bit rows widened, as DeepSpeed's bf16 embedding, so the lookup reads
//                    the same values whether the fp32 master is whole or sharded)
#pragma once

#include <functional>

#include "loom/nn/parameter.h"

namespace loom::nn {

void weight_forward(float* y, const float* x, const Parameter& w, const Parameter* b, int64_t N,
                    bool accumulate = false);
void weight_backward(float* dx, const float* dy, const float* x, Parameter& w, Parameter* b,
                     int64_t N);
void weight_rows(float* out, const int32_t* ids, int64_t N, const Parameter& w, bool accumulate);

// A base model's matrix (2-D weight or embedding, not quantized, not a PEFT method's own
// parameter): what gets a 16-bit copy under mixed precision.
bool takes_half(const Parameter& p);
// Mixed precision: gives every f32 matrix (2-D weight or embedding of the base model, not
// quantized) of ps a 16-bit copy in `format`, allocated now where the value is held (model
// state, as loom plan counts it; a ZeRO-3 unit's with its gather), and marks the copies of
// parameters whose values changed.
void use_half_weights(ParamStore& ps, kernels::Half format);
void mark_half_stale(const Parameter& p);
// Keeps every frozen matrix in 16 bits only: converted now, its f32 value dropped and the
// store laid out again (`group` as ParamStore::materialize takes it). A frozen base under
// LoRA in bf16 then takes half the memory; products and lookups read the 16-bit weight.
void hold_frozen_in_half(ParamStore& ps, kernels::Half format,
                         const std::function<int(const Parameter&)>& group = {});
// One matrix of it (takes_half(p)): frozen and held in `format` alone, rounded from v
// (p.shape's values). A loader passes each tensor as it reads it (io::LoadOptions::half), so
// the f32 slot is never written: its pages never become resident, and the next materialize()
// lays the store out without it. The load's peak is then the 16-bit weights plus one tensor.
void hold_in_half(Parameter& p, const float* v, kernels::Half format);
// A zero tensor of `shape` in the 16-bit format f (BF16 or F16).
Tensor half_zeros(const std::vector<int64_t>& shape, kernels::Half f);
// Row r of a matrix held in 16 bits (w.held_in_half() or with a copy), widened to fp32.
void half_row(const Parameter& w, int64_t r, float* out);

}  // namespace loom::nn
