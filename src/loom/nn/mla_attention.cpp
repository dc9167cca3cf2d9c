#include "loom/nn/mla_attention.h"

#include <algorithm>
#include <cstring>

#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/rope.h"
#include "loom/util/error.h"

namespace loom::nn {

namespace {
// transformers' q_a_layernorm and kv_a_layernorm keep RMSNorm's default eps.
constexpr float kLatentNormEps = 1e-6f;

// Dr rotary values from the checkpoint's order into the kernel's ([evens | odds] when
// interleaved), and back (adding) for gradients.
void lay_out(float* dst, const float* src, int64_t Dr, bool interleave) {
  if (!interleave) {
    std::memcpy(dst, src, Dr * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < Dr / 2; ++i) {
    dst[i] = src[2 * i];
    dst[Dr / 2 + i] = src[2 * i + 1];
  }
}
void add_back(float* dst, const float* src, int64_t Dr, bool interleave) {
  for (int64_t i = 0; i < Dr / 2; ++i) {
    dst[interleave ? 2 * i : i] += src[i];
    dst[interleave ? 2 * i + 1 : Dr / 2 + i] += src[Dr / 2 + i];
  }
}
}  // namespace

MlaAttention::MlaAttention(ParamStore& ps, const std::string& name, const MlaDims& d,
                           float init_std)
    : d_(d) {
  LOOM_CHECK(d.rope > 0 && d.rope % 2 == 0,
             name + ": qk_rope_head_dim must be even and positive for rotary embeddings");
  LOOM_CHECK(d.kv_lora_rank > 0 && d.nope >= 0 && d.v > 0,
             name + ": kv_lora_rank and v_head_dim must be positive");
  const int64_t C = d.hidden, H = d.n_head;
  // Declared in transformers' module order.
  if (d.q_lora_rank > 0) {
    q_a_ = std::make_unique<Linear>(ps, name + ".q_a_proj", C, d.q_lora_rank, d.bias, init_std);
    q_norm_ = std::make_unique<RMSNorm>(ps, name + ".q_a_layernorm", d.q_lora_rank, kLatentNormEps);
    q_b_ =
        std::make_unique<Linear>(ps, name + ".q_b_proj", d.q_lora_rank, H * qd(), false, init_std);
  } else {
    q_ = std::make_unique<Linear>(ps, name + ".q_proj", C, H * qd(), false, init_std);
  }
  kv_a_ = std::make_unique<Linear>(ps, name + ".kv_a_proj_with_mqa", C, d.kv_lora_rank + d.rope,
                                   d.bias, init_std);
  kv_norm_ =
      std::make_unique<RMSNorm>(ps, name + ".kv_a_layernorm", d.kv_lora_rank, kLatentNormEps);
  kv_b_ = std::make_unique<Linear>(ps, name + ".kv_b_proj", d.kv_lora_rank, H * (d.nope + d.v),
                                   false, init_std);
  o_ = std::make_unique<Linear>(ps, name + ".o_proj", H * d.v, C, d.bias, init_std);
}

std::vector<Linear*> MlaAttention::linears() {
  std::vector<Linear*> out;
  for (Linear* l : {q_.get(), q_a_.get(), q_b_.get(), kv_a_.get(), kv_b_.get(), o_.get()})
    if (l) out.push_back(l);
  return out;
}

void MlaAttention::release_activations() {
  for (Linear* l : linears()) l->release_activations();
  if (q_norm_) q_norm_->release_activations();
  kv_norm_->release_activations();
  lat_in_ = qh_ = kh_ = vh_ = ctx_ = ctx_v_ = lse_ = cos_ = sin_ = krot_ = Tensor();
}

void MlaAttention::attach_prefix(KVPrefix*, int64_t) {
  throw Error(
      "prefix tuning is not supported with multi-head latent attention (its cache is a "
      "compressed latent, not per-head keys and values)");
}

void MlaAttention::build_queries(const float* q, int64_t n, const Tensor& cos, const Tensor& sin) {
  const int64_t H = d_.n_head, Dn = d_.nope, Dr = d_.rope, Dq = qd(), Dh = hd();
  float* qh = qh_.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) {
      float* dst = qh + (r * H + h) * Dh;
      const float* src = q + (r * H + h) * Dq;
      std::memcpy(dst, src, Dn * sizeof(float));
      lay_out(dst + Dn, src + Dn, Dr, d_.interleave);
    }
  kernels::rope_forward(qh + Dn, cos.f32(), sin.f32(), n, H, Dr, H * Dh, Dh);
}

void MlaAttention::build_keys_values(const float* kv, const float* krot, int64_t krot_stride,
                                     int64_t n) {
  const int64_t H = d_.n_head, Dn = d_.nope, Dr = d_.rope, Dv = d_.v, Dh = hd();
  float *kh = kh_.f32(), *vh = vh_.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const float* src = kv + (r * H + h) * (Dn + Dv);
      float* k = kh + (r * H + h) * Dh;
      std::memcpy(k, src, Dn * sizeof(float));
      std::memcpy(k + Dn, krot + r * krot_stride, Dr * sizeof(float));
      std::memcpy(vh + (r * H + h) * Dh, src + Dn, Dv * sizeof(float));
    }
}

const Tensor& MlaAttention::project_out(const Shape& rows) {
  const int64_t H = d_.n_head, Dv = d_.v, Dh = hd(), n = rows[0] * rows[1];
  ensure(ctx_v_, {rows[0], rows[1], H * Dv});
  const float* c = ctx_.f32();
  float* cv = ctx_v_.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n * H; ++r) std::memcpy(cv + r * Dv, c + r * Dh, Dv * sizeof(float));
  return o_->forward(ctx_v_);
}

const Tensor& MlaAttention::forward(const Tensor& x, const Positions& p) {
  const int64_t B = x.dim(0), T = x.dim(1), N = B * T, H = d_.n_head, R = d_.kv_lora_rank,
                Dr = d_.rope, Dh = hd();
  const Tensor& q = q_ ? q_->forward(x) : q_b_->forward(q_norm_->forward(q_a_->forward(x)));
  const Tensor& ckv = kv_a_->forward(x);  // [B, T, R + Dr]
  ensure(lat_in_, {B, T, R});
  ensure(krot_, {B, T, Dr});
  for (int64_t r = 0; r < N; ++r) {
    const float* src = ckv.f32() + r * (R + Dr);
    std::memcpy(lat_in_.f32() + r * R, src, R * sizeof(float));
    lay_out(krot_.f32() + r * Dr, src + R, Dr, d_.interleave);
  }
  cos_ = p.rope_cos;
  sin_ = p.rope_sin;
  kernels::rope_forward(krot_.f32(), cos_.f32(), sin_.f32(), N, 1, Dr, Dr);
  const Tensor& kv = kv_b_->forward(kv_norm_->forward(lat_in_));  // [B, T, H*(Dn+Dv)]
  for (Tensor* t : {&qh_, &kh_, &vh_}) ensure(*t, {B, T, H * Dh});
  build_queries(q.f32(), N, cos_, sin_);
  build_keys_values(kv.f32(), krot_.f32(), Dr, N);
  kernels::AttnDims ad{B, T, H, H, Dh, H * Dh, H * Dh, p.packed};
  ad.scale = d_.scale;
  ensure(lse_, {B, H, T});
  ensure(ctx_, {B, T, H * Dh});
  pos_ = p.packed;
  kernels::attention_forward(ctx_.f32(), lse_.f32(), qh_.f32(), kh_.f32(), vh_.f32(), ad);
  return project_out({B, T});
}

void MlaAttention::backward(const Tensor& dy, const Tensor& dx, Scratch& scratch) {
  const int64_t B = ctx_.dim(0), T = ctx_.dim(1), N = B * T, H = d_.n_head, R = d_.kv_lora_rank,
                Dn = d_.nope, Dr = d_.rope, Dv = d_.v, Dq = qd(), Dh = hd();
  Tensor dctx_v = scratch.zeros("mla.dctx_v", {B, T, H * Dv});
  o_->backward(dy, dctx_v);
  Tensor dctx = scratch.zeros("mla.dctx", {B, T, H * Dh});
  for (int64_t r = 0; r < N * H; ++r)
    std::memcpy(dctx.f32() + r * Dh, dctx_v.f32() + r * Dv, Dv * sizeof(float));
  Tensor dqh = scratch.take("mla.dqh", {B, T, H * Dh});
  Tensor dkh = scratch.take("mla.dkh", {B, T, H * Dh});
  Tensor dvh = scratch.take("mla.dvh", {B, T, H * Dh});
  kernels::AttnDims ad{B, T, H, H, Dh, H * Dh, H * Dh, pos_};
  ad.scale = d_.scale;
  kernels::attention_backward(dqh.f32(), dkh.f32(), dvh.f32(), dctx.f32(), qh_.f32(), kh_.f32(),
                              vh_.f32(), ctx_.f32(), lse_.f32(), ad);
  kernels::rope_backward(dqh.f32() + Dn, cos_.f32(), sin_.f32(), N, H, Dr, H * Dh, Dh);
  kernels::rope_backward(dkh.f32() + Dn, cos_.f32(), sin_.f32(), N, H, Dr, H * Dh, Dh);
  // Back to the projections' layouts; the shared rotary key's gradient sums over heads.
  Tensor dq = scratch.zeros("mla.dq", {B, T, H * Dq});
  Tensor dkv = scratch.zeros("mla.dkv", {B, T, H * (Dn + Dv)});
  Tensor dckv = scratch.zeros("mla.dckv", {B, T, R + Dr});
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t i = r * H + h;
      std::memcpy(dq.f32() + i * Dq, dqh.f32() + i * Dh, Dn * sizeof(float));
      add_back(dq.f32() + i * Dq + Dn, dqh.f32() + i * Dh + Dn, Dr, d_.interleave);
      float* g = dkv.f32() + i * (Dn + Dv);
      std::memcpy(g, dkh.f32() + i * Dh, Dn * sizeof(float));
      std::memcpy(g + Dn, dvh.f32() + i * Dh, Dv * sizeof(float));
      add_back(dckv.f32() + r * (R + Dr) + R, dkh.f32() + i * Dh + Dn, Dr, d_.interleave);
    }
  Tensor dlat = scratch.zeros("mla.dlat", {B, T, R});
  kv_b_->backward(dkv, dlat);
  Tensor dlat_in = scratch.zeros("mla.dlat_in", {B, T, R});
  kv_norm_->backward(dlat, dlat_in);
  for (int64_t r = 0; r < N; ++r)
    std::memcpy(dckv.f32() + r * (R + Dr), dlat_in.f32() + r * R, R * sizeof(float));
  kv_a_->backward(dckv, dx);
  if (q_) {
    q_->backward(dq, dx);
    return;
  }
  Tensor dqn = scratch.zeros("mla.dqn", {B, T, d_.q_lora_rank});
  q_b_->backward(dq, dqn);
  Tensor dqa = scratch.zeros("mla.dqa", {B, T, d_.q_lora_rank});
  q_norm_->backward(dqn, dqa);
  q_a_->backward(dqa, dx);
}

const Tensor& MlaAttention::forward_cached(const Tensor& x, const Positions& p, const Tensor& kc,
                                           const Tensor&, int64_t past) {
  const int64_t n = x.dim(1), L = past + n, H = d_.n_head, R = d_.kv_lora_rank, Dr = d_.rope,
                W = R + Dr, Dh = hd();
  const Tensor& q = q_ ? q_->forward(x) : q_b_->forward(q_norm_->forward(q_a_->forward(x)));
  const Tensor& ckv = kv_a_->forward(x);
  ensure(lat_in_, {1, n, R});
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(lat_in_.f32() + r * R, ckv.f32() + r * W, R * sizeof(float));
  const Tensor& lat = kv_norm_->forward(lat_in_);
  float* rows = kc.f32() + past * W;  // this step's cache rows: [latent | rotated key]
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(rows + r * W, lat.f32() + r * R, R * sizeof(float));
    lay_out(rows + r * W + R, ckv.f32() + r * W + R, Dr, d_.interleave);
  }
  kernels::rope_forward(rows + R, p.rope_cos.f32(), p.rope_sin.f32(), n, 1, Dr, W);
  Tensor lat_all = Tensor::zeros({1, L, R});
  for (int64_t r = 0; r < L; ++r)
    std::memcpy(lat_all.f32() + r * R, kc.f32() + r * W, R * sizeof(float));
  const Tensor& kv = kv_b_->forward(lat_all);
  ensure(qh_, {1, n, H * Dh});
  ensure(kh_, {1, L, H * Dh});
  ensure(vh_, {1, L, H * Dh});
  build_queries(q.f32(), n, p.rope_cos, p.rope_sin);
  build_keys_values(kv.f32(), kc.f32() + R, W, L);
  ensure(ctx_, {1, n, H * Dh});
  kernels::attention_forward_cached(ctx_.f32(), qh_.f32(), kh_.f32(), vh_.f32(), n, past, H, H, Dh,
                                    H * Dh, H * Dh, d_.scale);
  return project_out({1, n});
}

}  // namespace loom::nn
