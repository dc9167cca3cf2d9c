#include "loom/nn/lm_head.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/nn/buffers.h"
#include "loom/nn/weight_ops.h"
#include "loom/util/error.h"

namespace loom::nn {

namespace {
const Tensor kNoLogits;  // what a chunked forward returns
}  // namespace

LMHead::LMHead(Parameter* weight, int64_t vocab, const TensorParallel& tp)
    : w_(weight), V_(vocab), v0_(weight->shard.sharded() ? weight->shard.offset : 0), tp_(tp) {}

const Tensor& LMHead::forward(const Tensor& h, int64_t chunk_rows) {
  const int64_t Vl = w_->shape[0], C = w_->shape[1], N = h.numel() / C;
  LOOM_CHECK(h.dim(-1) == C, w_->name + ": head input " + shape_str(h.shape()));
  LOOM_CHECK(chunk_rows >= 0, "internal: negative head chunk");
  h_ = h;
  chunk_rows_ = chunk_rows;
  if (chunk_rows_ > 0) {
    // The chunk buffer is kept from step to step (it is live at the step's peak anyway, and
    // a fresh one costs a page fault per 4 KiB: 12.5k a step for GPT-2's, ~25 ms); a
    // whole-batch buffer from an unchunked call is not.
    if (logits_.defined() && logits_.shape() != Shape{std::min(chunk_rows_, N), Vl})
      logits_ = Tensor();
    return kNoLogits;
  }
  Shape out = h.shape();
  out.back() = Vl;
  ensure(logits_, out);
  weight_forward(logits_.f32(), h.f32(), *w_, nullptr, N);
  return logits_;
}

double LMHead::chunk_loss(float* x, const int32_t* t, int64_t n, const float* grad_scale,
                          double* per_token) {
  const int64_t Vl = w_->shape[0];
  if (!tp_.active())
    return grad_scale ? kernels::cross_entropy_backward(x, t, n, Vl, *grad_scale)
                      : kernels::cross_entropy_loss(x, t, n, Vl);
  // Megatron's vocab-parallel cross-entropy: stats = sums of exponentials, target logits.
  std::vector<double> mx(n), stats(2 * n);
  kernels::vp_row_max(x, n, Vl, mx.data());
  tp_.comm->all_reduce_max(mx.data(), n);
  kernels::vp_row_partials(x, t, n, Vl, v0_, V_, mx.data(), stats.data(), stats.data() + n);
  tp_.comm->all_reduce_sum(stats.data(), 2 * n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double l = t[i] == kernels::kIgnoreIndex ? 0.0 : std::log(stats[i]) - stats[n + i];
    if (per_token) per_token[i] = l;
    sum += l;
  }
  if (grad_scale) kernels::vp_backward(x, t, n, Vl, v0_, mx.data(), stats.data(), *grad_scale);
  return sum;
}

double LMHead::backward(const Tensor& targets, float grad_scale, const Tensor& dh) {
  const int64_t C = w_->shape[1], N = h_.numel() / C;
  LOOM_CHECK(h_.defined(), w_->name + ": backward called before forward");
  LOOM_CHECK(targets.numel() == N, "targets " + shape_str(targets.shape()) +
                                       " do not match the head's input " + shape_str(h_.shape()));
  const int32_t* t = targets.i32();
  double loss_sum = 0.0;
  if (chunk_rows_ == 0) {
    loss_sum = chunk_loss(logits_.f32(), t, N, &grad_scale, nullptr);
    weight_backward(dh.f32(), logits_.f32(), h_.f32(), *w_, nullptr, N);
  } else {
    // A row whose target is ignored (a prompt token, padding) has dlogits 0: it adds nothing
    // to dh (left 0) or dW, so only the target rows go through the head, gathered chunk by
    // chunk into [rows, C]. In SFT that skips the prompt's share of the largest GEMMs.
    const TargetRows tr = target_rows(t, N);
    if (tr.gathered) ensure(dhg_, {tr.rows, C});
    const int64_t K = static_cast<int64_t>(tr.keep.size());
    for (int64_t k0 = 0; k0 < K; k0 += tr.rows) {
      const int64_t n = std::min(tr.rows, K - k0);
      const Chunk c = gather(tr, t, k0, n);
      float* d = dh.f32() + k0 * C;
      if (tr.gathered) {
        std::fill_n(dhg_.f32(), n * C, 0.0f);
        d = dhg_.f32();
      }
      float* x = logits_.f32();
      weight_forward(x, c.h, *w_, nullptr, n);
      loss_sum += chunk_loss(x, c.t, n, &grad_scale, nullptr);
      weight_backward(d, x, c.h, *w_, nullptr, n);
      for (int64_t i = 0; tr.gathered && i < n; ++i)
        std::copy_n(dhg_.f32() + i * C, C, dh.f32() + tr.keep[k0 + i] * C);
    }
  }
  if (!tp_.sequence_split()) copy_to_region_backward(tp_, dh);
  return loss_sum;
}

void LMHead::loss_sums(const Tensor& targets, double* per_row) {
  const int64_t Vl = w_->shape[0], C = w_->shape[1], N = h_.numel() / C;
  LOOM_CHECK(targets.ndim() == 2 && targets.numel() == N, "targets " + shape_str(targets.shape()) +
                                                              " do not match the head's input " +
                                                              shape_str(h_.shape()));
  const int64_t B = targets.dim(0), T = targets.dim(1);
  const int32_t* t = targets.i32();
  std::fill(per_row, per_row + B, 0.0);
  // Adds n rows of logits x (targets tt; row i is token row row_of(i)) to their sequences'
  // sums, a run of one sequence's rows at a time.
  std::vector<double> per_token;
  auto add = [&](float* x, const int32_t* tt, int64_t n, auto row_of) {
    if (tp_.active()) {  // per token: the statistics are reduced over the group
      per_token.resize(static_cast<size_t>(n));
      chunk_loss(x, tt, n, nullptr, per_token.data());
      for (int64_t i = 0; i < n; ++i) per_row[row_of(i) / T] += per_token[i];
      return;
    }
    for (int64_t a = 0; a < n;) {
      const int64_t row = row_of(a) / T;
      int64_t e = a + 1;
      while (e < n && row_of(e) / T == row) ++e;
      per_row[row] += chunk_loss(x + a * Vl, tt + a, e - a, nullptr, nullptr);
      a = e;
    }
  };
  if (chunk_rows_ == 0) return add(logits_.f32(), t, N, [](int64_t i) { return i; });
  // Chunked: as backward, only the rows with a target go through the head (an ignored
  // target's loss is 0), in chunks of target rows.
  const TargetRows tr = target_rows(t, N);
  const int64_t K = static_cast<int64_t>(tr.keep.size());
  for (int64_t k0 = 0; k0 < K; k0 += tr.rows) {
    const int64_t n = std::min(tr.rows, K - k0);
    const Chunk c = gather(tr, t, k0, n);
    weight_forward(logits_.f32(), c.h, *w_, nullptr, n);
    add(logits_.f32(), c.t, n, [&](int64_t i) { return tr.keep[k0 + i]; });
  }
}

LMHead::TargetRows LMHead::target_rows(const int32_t* t, int64_t N) {
  const int64_t C = w_->shape[1];
  TargetRows tr;
  for (int64_t i = 0; i < N; ++i)
    if (t[i] != kernels::kIgnoreIndex) tr.keep.push_back(i);
  tr.rows = std::min(chunk_rows_, N);
  tr.gathered = static_cast<int64_t>(tr.keep.size()) < N;
  ensure(logits_, {tr.rows, w_->shape[0]});
  if (tr.gathered) {
    ensure(hg_, {tr.rows, C});
    tg_.resize(static_cast<size_t>(tr.rows));
  }
  return tr;
}

LMHead::Chunk LMHead::gather(const TargetRows& tr, const int32_t* t, int64_t k0, int64_t n) {
  const int64_t C = w_->shape[1];
  if (!tr.gathered) return {h_.f32() + k0 * C, t + k0};  // every row has a target: in place
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(h_.f32() + tr.keep[k0 + i] * C, C, hg_.f32() + i * C);
    tg_[i] = t[tr.keep[k0 + i]];
  }
  return {hg_.f32(), tg_.data()};
}

}  // namespace loom::nn
