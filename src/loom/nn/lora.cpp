#include "loom/nn/lora.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "loom/nn/buffers.h"
#include "loom/tensor/rng.h"
#include "loom/util/error.h"
#include "loom/util/profile.h"

namespace loom::nn {

float LoraSpec::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<float>(r)) : alpha / static_cast<float>(r);
}

LoRA::LoRA(ParamStore& ps, const std::string& linear_name, int64_t in, int64_t out,
           const LoraSpec& spec, const DropoutContext* ctx)
    : spec_(spec), in_(in), out_(out), ctx_(ctx), stream_(stream_id(linear_name + ".lora")) {
  LOOM_CHECK(spec.r > 0, linear_name + ": LoRA rank r must be positive");
  LOOM_CHECK(spec.dropout >= 0.0f && spec.dropout < 1.0f,
             linear_name + ": lora_dropout must be in [0, 1)");
  a_ = ps.add(linear_name + ".lora_A.weight", {spec.r, in}, ParamKind::Weight, 0.0f);
  a_->init_bound = 1.0f / std::sqrt(static_cast<float>(in));
  b_ = ps.add(linear_name + ".lora_B.weight", {out, spec.r}, ParamKind::Weight, 0.0f, 0.0f);
}

namespace {
// The dropped input is not kept between forward and backward (it would cost an [N, in]
// copy per LoRA layer): the mask is a function of the position, so backward rebuilds it in
// this workspace, which every LoRA layer of the thread shares.
float* workspace(int64_t n) {
  static thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}
}  // namespace

const float* LoRA::dropped_input() const {
  const int64_t N = x_.numel() / in_;
  float* xd = workspace(N * in_);
  std::memcpy(xd, x_.f32(), N * in_ * sizeof(float));
  dropout_apply(xd, N, in_, spec_.dropout, *ctx_, stream_);
  return xd;
}

void LoRA::forward_add(const Tensor& x, const Tensor& y) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  const int64_t N = x.numel() / in_, r = spec_.r;
  x_ = x;
  dropped_ = spec_.dropout > 0.0f && ctx_ && ctx_->training;
  const float* xd = dropped_ ? dropped_input() : x.f32();
  ensure(u_, {N, r});
  // u[N, r] = xd @ A^T ; y[N, out] += scale * u @ B^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, in_, 1.0f, xd, in_, a_->value.f32(),
              in_, 0.0f, u_.f32(), r);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out_, r, spec_.scale(), u_.f32(), r,
              b_->value.f32(), r, 1.0f, y.f32(), out_);
}

void LoRA::backward(const Tensor& dy, const Tensor& dx) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  const int64_t N = u_.dim(0), r = spec_.r;
  const float s = spec_.scale();
  const float* xd = dropped_ ? dropped_input() : x_.f32();
  // du[N, r] = s * dy @ B
  Tensor du = Tensor::zeros({N, r});
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, r, out_, s, dy.f32(), out_,
              b_->value.f32(), r, 0.0f, du.f32(), r);
  // dB[out, r] += s * dy^T u ; dA[r, in] += du^T xd
  if (b_->trainable)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out_, r, N, s, dy.f32(), out_, u_.f32(), r,
                1.0f, b_->grad.f32(), r);
  if (a_->trainable)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, in_, N, 1.0f, du.f32(), r, xd, in_,
                1.0f, a_->grad.f32(), in_);
  if (!dx.defined()) return;
  if (!dropped_) {  // dx += du @ A
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in_, r, 1.0f, du.f32(), r,
                a_->value.f32(), in_, 1.0f, dx.f32(), in_);
    return;
  }
  float* dxd = workspace(N * in_);  // xd is no longer needed
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in_, r, 1.0f, du.f32(), r,
              a_->value.f32(), in_, 0.0f, dxd, in_);
  dropout_apply(dxd, N, in_, spec_.dropout, *ctx_, stream_);
  float* d = dx.f32();
  const float* g = dxd;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N * in_; ++i) d[i] += g[i];
}

void LoRA::merge_into(float* W) const {
  // W[out, in] += s * B[out, r] @ A[r, in]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, out_, in_, spec_.r, spec_.scale(),
              b_->value.f32(), spec_.r, a_->value.f32(), in_, 1.0f, W, in_);
}

}  // namespace loom::nn
