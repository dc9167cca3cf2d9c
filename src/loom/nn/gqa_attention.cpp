#include "loom/nn/gqa_attention.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/rope.h"
#include "loom/util/error.h"

namespace loom::nn {

namespace {
// Ranks sharing one KV head: tp / NKV when tp exceeds NKV, else 1.
int kv_replicas(const GqaDims& d, const TensorParallel& tp) {
  return tp.size() > d.n_kv_head ? static_cast<int>(tp.size() / d.n_kv_head) : 1;
}

GqaDims local_dims(const std::string& name, GqaDims d, const TensorParallel& tp) {
  const int64_t t = tp.size();
  LOOM_CHECK(d.n_kv_head > 0 && d.n_head % d.n_kv_head == 0,
             name + ": num_attention_heads " + std::to_string(d.n_head) +
                 " is not a multiple of num_key_value_heads " + std::to_string(d.n_kv_head));
  LOOM_CHECK(d.n_head % t == 0, "num_attention_heads " + std::to_string(d.n_head) +
                                    " is not divisible by tensor_parallel.size " +
                                    std::to_string(t));
  LOOM_CHECK(d.n_kv_head % t == 0 || t % d.n_kv_head == 0,
             "num_key_value_heads " + std::to_string(d.n_kv_head) + " and tensor_parallel.size " +
                 std::to_string(t) +
                 " do not divide one another (KV heads are split, or replicated when fewer)");
  d.n_head /= t;
  d.n_kv_head = std::max<int64_t>(1, d.n_kv_head / t);
  return d;
}
}  // namespace

GqaAttention::GqaAttention(ParamStore& ps, const std::string& name, const GqaDims& d,
                           float init_std, const TensorParallel& tp)
    : d_(local_dims(name, d, tp)),
      q_(ps, name + ".q_proj", d.hidden, d.n_head * d.head_dim, d.qkv_bias, init_std, tp),
      k_(ps, name + ".k_proj", d.hidden, d.n_kv_head * d.head_dim, d.qkv_bias, init_std, tp, 1,
         kv_replicas(d, tp)),
      v_(ps, name + ".v_proj", d.hidden, d.n_kv_head * d.head_dim, d.qkv_bias, init_std, tp, 1,
         kv_replicas(d, tp)),
      o_(ps, name + ".o_proj", d.n_head * d.head_dim, d.hidden, d.o_bias, init_std, tp) {
  LOOM_CHECK(d.head_dim % 2 == 0, name + ": head_dim must be even for rotary embeddings");
}

const Tensor& GqaAttention::forward(const Tensor& x, const Positions& p) {
  const Tensor &rope_cos = p.rope_cos, &rope_sin = p.rope_sin;
  const int32_t* pos = p.packed;
  const int64_t B = x.dim(0), T = x.dim(1), D = d_.head_dim, NH = d_.n_head, NKV = d_.n_kv_head;
  // The projections' outputs are rotated in place: the rotated q, k are what attention and
  // its backward need, and the un-rotated values are never used again.
  const Tensor& q = q_.forward(x);
  const Tensor& k = k_.forward(x);
  const Tensor& v = v_.forward(x);
  cos_ = rope_cos;
  sin_ = rope_sin;
  kernels::rope_forward(q.f32(), rope_cos.f32(), rope_sin.f32(), B * T, NH, D, NH * D);
  kernels::rope_forward(k.f32(), rope_cos.f32(), rope_sin.f32(), B * T, NKV, D, NKV * D);
  kernels::AttnDims ad{B, T, NH, NKV, D, NH * D, NKV * D, pos};
  if (prefix_) prefix_->bind(ad, layer_);
  ensure(lse_, {B, NH, T});
  ensure(ctx_, {B, T, NH * D});
  pos_ = pos;
  kernels::attention_forward(ctx_.f32(), lse_.f32(), q.f32(), k.f32(), v.f32(), ad);
  return o_.forward(ctx_);
}

const Tensor& GqaAttention::forward_cached(const Tensor& x, const Positions& p, const Tensor& kc,
                                           const Tensor& vc, int64_t past) {
  const Tensor &rope_cos = p.rope_cos, &rope_sin = p.rope_sin;
  const int64_t n = x.dim(1), D = d_.head_dim, NH = d_.n_head, NKV = d_.n_kv_head;
  const Tensor& q = q_.forward(x);
  const Tensor& k = k_.forward(x);
  const Tensor& v = v_.forward(x);
  kernels::rope_forward(q.f32(), rope_cos.f32(), rope_sin.f32(), n, NH, D, NH * D);
  kernels::rope_forward(k.f32(), rope_cos.f32(), rope_sin.f32(), n, NKV, D, NKV * D);
  std::memcpy(kc.f32() + past * NKV * D, k.f32(), n * NKV * D * sizeof(float));
  std::memcpy(vc.f32() + past * NKV * D, v.f32(), n * NKV * D * sizeof(float));
  ensure(ctx_, {1, n, NH * D});
  kernels::attention_forward_cached(ctx_.f32(), q.f32(), kc.f32(), vc.f32(), n, past, NH, NKV, D,
                                    NH * D, NKV * D);
  return o_.forward(ctx_);
}

void GqaAttention::release_activations() {
  for (Linear* l : linears()) l->release_activations();
  lse_ = ctx_ = cos_ = sin_ = Tensor();
}

void GqaAttention::backward(const Tensor& dy, const Tensor& dx, Scratch& scratch) {
  const int64_t B = ctx_.dim(0), T = ctx_.dim(1), D = d_.head_dim, NH = d_.n_head,
                NKV = d_.n_kv_head;
  Tensor dctx = scratch.zeros("gqa.dctx", {B, T, NH * D});
  o_.backward(dy, dctx);
  Tensor dq = scratch.take("gqa.dq", {B, T, NH * D});
  Tensor dk = scratch.take("gqa.dk", {B, T, NKV * D});
  Tensor dv = scratch.take("gqa.dv", {B, T, NKV * D});
  kernels::AttnDims ad{B, T, NH, NKV, D, NH * D, NKV * D, pos_};
  Tensor dpk, dpv;  // per batch row [B, P, NKV*D], summed into the prefix's gradient
  if (prefix_) {
    prefix_->bind(ad, layer_);
    dpk = scratch.take("gqa.dpk", {B, ad.P, NKV * D});
    dpv = scratch.take("gqa.dpv", {B, ad.P, NKV * D});
  }
  kernels::attention_backward(dq.f32(), dk.f32(), dv.f32(), dctx.f32(), q_.output().f32(),
                              k_.output().f32(), v_.output().f32(), ctx_.f32(), lse_.f32(), ad,
                              prefix_ ? dpk.f32() : nullptr, prefix_ ? dpv.f32() : nullptr);
  if (prefix_) prefix_->accumulate(dpk.f32(), dpv.f32(), B, layer_);
  kernels::rope_backward(dq.f32(), cos_.f32(), sin_.f32(), B * T, NH, D, NH * D);
  kernels::rope_backward(dk.f32(), cos_.f32(), sin_.f32(), B * T, NKV, D, NKV * D);
  q_.backward(dq, dx);
  k_.backward(dk, dx);
  v_.backward(dv, dx);
}

}  // namespace loom::nn
