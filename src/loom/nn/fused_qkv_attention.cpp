#include "loom/nn/fused_qkv_attention.h"

#include <cstring>

#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/elementwise.h"
#include "loom/util/error.h"

namespace loom::nn {

FusedQKVAttention::FusedQKVAttention(ParamStore& ps, const std::string& name, int64_t C,
                                     int64_t n_head, float init_std, float proj_init_std,
                                     const TensorParallel& tp)
    : c_attn_(ps, name + ".c_attn", C, 3 * C, true, init_std, tp, /*parts=*/3),
      c_proj_(ps, name + ".c_proj", C, C, true, proj_init_std, tp),
      C_(C / tp.size()),
      NH_(n_head / tp.size()) {
  LOOM_CHECK(C % n_head == 0, name + ": n_embd " + std::to_string(C) +
                                  " is not divisible by n_head " + std::to_string(n_head));
  LOOM_CHECK(n_head % tp.size() == 0, "n_head " + std::to_string(n_head) +
                                          " is not divisible by tensor_parallel.size " +
                                          std::to_string(tp.size()));
}

const Tensor& FusedQKVAttention::forward(const Tensor& x, const Positions& p) {
  const int64_t B = x.dim(0), T = x.dim(1);
  const int32_t* pos = p.packed;
  const Tensor& qkv = c_attn_.forward(x);  // [B, T, 3C]
  const float* q = qkv.f32();
  kernels::AttnDims d{B, T, NH_, NH_, C_ / NH_, 3 * C_, 3 * C_, pos};
  if (prefix_) prefix_->bind(d, layer_);
  ensure(lse_, {B, NH_, T});
  ensure(ctx_, {B, T, C_});
  pos_ = pos;
  kernels::attention_forward(ctx_.f32(), lse_.f32(), q, q + C_, q + 2 * C_, d);
  return c_proj_.forward(ctx_);
}

const Tensor& FusedQKVAttention::forward_cached(const Tensor& x, const Positions&, const Tensor& kc,
                                                const Tensor& vc, int64_t past) {
  const int64_t n = x.dim(1);
  const float* qkv = c_attn_.forward(x).f32();  // [1, n, 3C]
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(kc.f32() + (past + i) * C_, qkv + i * 3 * C_ + C_, C_ * sizeof(float));
    std::memcpy(vc.f32() + (past + i) * C_, qkv + i * 3 * C_ + 2 * C_, C_ * sizeof(float));
  }
  ensure(ctx_, {1, n, C_});
  kernels::attention_forward_cached(ctx_.f32(), qkv, kc.f32(), vc.f32(), n, past, NH_, NH_,
                                    C_ / NH_, 3 * C_, C_);
  return c_proj_.forward(ctx_);
}

void FusedQKVAttention::release_activations() {
  c_attn_.release_activations();
  c_proj_.release_activations();
  lse_ = ctx_ = Tensor();
}

void FusedQKVAttention::backward(const Tensor& dy, const Tensor& dx, Scratch& scratch) {
  const int64_t B = ctx_.dim(0), T = ctx_.dim(1);
  Tensor dctx = scratch.zeros("attn.dctx", {B, T, C_});
  c_proj_.backward(dy, dctx);
  Tensor dqkv = scratch.take("attn.dqkv", {B, T, 3 * C_});
  const float* q = c_attn_.output().f32();  // qkv saved by forward
  float* dq = dqkv.f32();
  kernels::AttnDims d{B, T, NH_, NH_, C_ / NH_, 3 * C_, 3 * C_, pos_};
  Tensor dpk, dpv;  // per batch row [B, P, C], summed into the prefix's gradient
  if (prefix_) {
    prefix_->bind(d, layer_);
    dpk = scratch.take("attn.dpk", {B, d.P, C_});
    dpv = scratch.take("attn.dpv", {B, d.P, C_});
  }
  kernels::attention_backward(dq, dq + C_, dq + 2 * C_, dctx.f32(), q, q + C_, q + 2 * C_,
                              ctx_.f32(), lse_.f32(), d, prefix_ ? dpk.f32() : nullptr,
                              prefix_ ? dpv.f32() : nullptr);
  if (prefix_) prefix_->accumulate(dpk.f32(), dpv.f32(), B, layer_);
  c_attn_.backward(dqkv, dx);
  // The key bias adds q_t . b to every score of query t alike, which softmax cancels: its
  // gradient is exactly zero. Summed in floating point it is rounding noise, which Adam
  // would turn into steps of +-lr (and which differs between parallel layouts), so it is
  // set to the exact value. (A prefix's keys carry no bias, so then it is not zero.)
  Parameter* b = c_attn_.bias();
  if (!prefix_ && b->trainable) kernels::zero(b->grad.f32() + C_, C_);
}

}  // namespace loom::nn
