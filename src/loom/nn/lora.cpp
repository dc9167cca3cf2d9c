#include "loom/nn/lora.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "loom/kernels/cpu/skinny.h"
#include "loom/nn/buffers.h"
#include "loom/tensor/rng.h"
#include "loom/util/error.h"
#include "loom/util/profile.h"

namespace loom::nn {

float LoraSpec::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<float>(r)) : alpha / static_cast<float>(r);
}

LoRA::LoRA(ParamStore& ps, const std::string& linear_name, int64_t in, int64_t out,
           const LoraSpec& spec, const DropoutContext* ctx, const TensorParallel& tp,
           const ShardSpec& w_shard, int replicas)
    : spec_(spec),
      in_(in),
      out_(out),
      tp_(tp),
      split_dim_(tp.active() ? w_shard.dim : -1),
      replicas_(replicas),
      ctx_(ctx),
      stream_(stream_id(linear_name + ".lora")) {
  LOOM_CHECK(spec.r > 0, linear_name + ": LoRA rank r must be positive");
  LOOM_CHECK(spec.dropout >= 0.0f && spec.dropout < 1.0f,
             linear_name + ": lora_dropout must be in [0, 1)");
  LOOM_CHECK(split_dim_ < 1 || w_shard.parts == 1,
             linear_name + ": LoRA on a row-parallel layer with blocks is not supported");
  ShardSpec as, bs;  // B takes W's row slice (column split), A its column slice (row split)
  if (split_dim_ == 0) {
    bs = w_shard;
    out_ = w_shard.parts * w_shard.size;
  } else if (split_dim_ == 1) {
    as = w_shard;
    in_ = w_shard.size;
    col0_ = w_shard.offset;
  }
  // Bound and init from the full sizes and full-tensor indices: every layout starts from
  // the one-process A.
  a_ = ps.add(linear_name + ".lora_A.weight", {spec.r, in}, ParamKind::Weight, 0.0f, 0.0f, as);
  a_->init_bound = 1.0f / std::sqrt(static_cast<float>(in));
  b_ = ps.add(linear_name + ".lora_B.weight", {out, spec.r}, ParamKind::Weight, 0.0f, 0.0f, bs);
}

namespace {
// B [out, r] as B^T [r, out], the layout the skinny kernels stream along out.
std::vector<float> transposed(const float* B, int64_t out, int64_t r) {
  std::vector<float> t(static_cast<size_t>(out * r));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < r; ++j) t[j * out + o] = B[o * r + j];
  return t;
}
}  // namespace

kernels::RowOp LoRA::dropout_op() const {
  if (!dropped_) return {};
  return [mask = DropoutMask(spec_.dropout, *ctx_, stream_, col0_), w = in_, rows = rows_](
             int64_t n, float* v) {
    if (rows) {
      mask.row_at(rows[n], v, w);
    } else {
      mask.row(n, v, w);
    }
  };
}

// The rank-r products go through kernels/cpu/skinny.h, one pass over the wide operand each
// (BLAS packs x, dy and dx for every one of them and ran this branch at a tenth of its GEMM
// rate: ~2 s of a 10 s SmolLM2 LoRA step with 210 branches).
void LoRA::forward_add(const Tensor& x, const Tensor& y, int64_t row0, bool accumulate) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  const int64_t N = x.numel() / in_, r = spec_.r;
  x_ = x;
  dropped_ = spec_.dropout > 0.0f && ctx_ && ctx_->training;
  ensure(u_, {N, r});
  // u[N, r] = dropout(x) @ A^T, each row of x masked as it is read.
  kernels::skinny_nt(u_.f32(), x.f32(), a_->value.f32(), N, in_, r, 1.0f, dropout_op());
  // Row split: u is this rank's columns' part of A xd; g sums it, so u and B u are whole
  // (y is already reduced: the branch is added once).
  if (split_dim_ == 1) reduce_from_region_forward(tp_, u_);
  const int64_t rows = y.numel() / out_;
  LOOM_CHECK(row0 >= 0 && row0 + rows <= N, a_->name + ": output rows outside the input's");
  // y[rows, out] (=|+=) scale * u @ B^T
  const std::vector<float> bt = transposed(b_->value.f32(), out_, r);
  kernels::skinny_nn(y.f32(), u_.f32() + row0 * r, bt.data(), rows, out_, r, spec_.scale(), {},
                     accumulate);
}

void LoRA::backward(const Tensor& dy, const Tensor& dx) {
  prof::ScopedPhase ph(prof::Phase::Gemm);
  const int64_t N = u_.dim(0), r = spec_.r;
  const float s = spec_.scale();
  const std::vector<float> bt = transposed(b_->value.f32(), out_, r);
  // du[N, r] = s * dy @ B and dB[out, r] += s * dy^T u (summed as dB^T [r, out] = s * u^T dy),
  // in one pass over dy. Column split: dy_r, B_r are this rank's outputs only, so du is its
  // part (with replicated KV slices, dy_r is also only this rank's query heads' part of the
  // slice's gradient; dy is not summed over the replicas here, only dB is below, so the parts
  // of every rank add up to du exactly once).
  Tensor du = Tensor::zeros({N, r});
  std::vector<float> dbt(b_->trainable ? static_cast<size_t>(r * out_) : 0, 0.0f);
  kernels::skinny_nt_tn(du.f32(), b_->trainable ? dbt.data() : nullptr, dy.f32(), bt.data(),
                        u_.f32(), N, out_, r, s);
  if (b_->trainable) {
    // A replicated slice: B's gradient is summed over its replicas, as W's is.
    if (split_dim_ == 0 && replicas_ > 1) sum_over_replicas(tp_, replicas_, dbt.data(), r * out_);
    float* g = b_->grad.f32();
    for (int64_t o = 0; o < out_; ++o)
      for (int64_t j = 0; j < r; ++j) g[o * r + j] += dbt[j * out_ + o];
  }
  Tensor du_sum = du;
  if (a_->trainable && split_dim_ == 0) {
    // Column split: A is replicated and needs the sum of the ranks' parts of du. B_r u is
    // a column-parallel layer over the replicated u, so this is f's backward at u: one
    // all-reduce of du [N, r] (a copy; dx below takes this rank's part), rather than of
    // this backward's dA [r, in] (never of A's accumulated gradient, which holds earlier
    // micro-batches too). N r floats are fewer than r in whenever a micro-batch has fewer
    // tokens than the layer has inputs, no [r, in] scratch is needed, and every rank then
    // computes dA from the same du and xd, so the replicated A gets the same gradient
    // everywhere.
    du_sum = Tensor::zeros({N, r});
    du_sum.copy_from(du);
    copy_to_region_backward(tp_, du_sum);
  }
  // dx[N, in] += dropout'(du @ A) and dA[r, in] += du^T xd, xd = dropout(x), in one pass
  // over x: each row's mask is hashed once (as multipliers, 0 or 1/(1-p)) for both.
  kernels::skinny_nn_tn(dx.defined() ? dx.f32() : nullptr, a_->trainable ? a_->grad.f32() : nullptr,
                        du.f32(), du_sum.f32(), a_->value.f32(), x_.f32(), N, in_, r, 1.0f,
                        dropout_op());
}

void LoRA::merge_into(float* W) const {
  // W[out, in] += s * B[out, r] @ A[r, in]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, out_, in_, spec_.r, spec_.scale(),
              b_->value.f32(), spec_.r, a_->value.f32(), in_, 1.0f, W, in_);
}

}  // namespace loom::nn
