#include "loom/nn/moe.h"

#include <cmath>
#include <cstring>

#include "loom/util/error.h"

namespace loom::nn {

MoE::MoE(ParamStore& ps, const std::string& name, const MoeSpec& s, float init_std)
    : s_(s),
      experts_([&] {
        LOOM_CHECK(s.ep_size >= 1 && s.router.n_experts % s.ep_size == 0,
                   "expert_parallel.size " + std::to_string(s.ep_size) +
                       " does not divide n_routed_experts " + std::to_string(s.router.n_experts));
        // Declared before the router, as transformers' module order has them.
        const int64_t L = s.router.n_experts / s.ep_size;
        std::vector<std::unique_ptr<SwiGluMLP>> v;
        for (int64_t e = s.ep_rank * L; e < (s.ep_rank + 1) * L; ++e) {
          v.push_back(std::make_unique<SwiGluMLP>(ps, name + ".experts." + std::to_string(e),
                                                  s.hidden, s.inter, init_std));
          for (Linear* l : v.back()->linears()) {
            l->weight()->expert = true;
            if (l->bias()) l->bias()->expert = true;
          }
        }
        return v;
      }()),
      router_(ps, name + ".gate", s.router, init_std) {
  const int64_t width = s.shared_width > 0 ? s.shared_width : s.inter * s.n_shared;
  if (width > 0) shared_.emplace(ps, name + "." + s.shared_name, s.hidden, width, init_std);
  if (s.shared_gate) {
    LOOM_CHECK(shared_, name + ": a shared_expert_gate without a shared expert");
    shared_gate_.emplace(ps, name + ".shared_expert_gate", s.hidden, 1, false, init_std);
  }
}

void MoE::set_expert_parallel(const ExpertParallel& ep) {
  LOOM_CHECK(ep.size() == s_.ep_size && ep.rank() == s_.ep_rank,
             "internal: expert-parallel rank " + std::to_string(ep.rank()) + " of " +
                 std::to_string(ep.size()) + " runs a layer declared with experts of rank " +
                 std::to_string(s_.ep_rank) + " of " + std::to_string(s_.ep_size));
  ep_ = ep;
}

bool MoE::holds_expert(int64_t e) const {
  const int64_t L = s_.router.n_experts / s_.ep_size;
  return e >= s_.ep_rank * L && e < (s_.ep_rank + 1) * L;
}

std::vector<Linear*> MoE::linears() {
  std::vector<Linear*> out;
  for (auto& e : experts_)
    for (Linear* l : e->linears()) out.push_back(l);
  if (shared_)
    for (Linear* l : shared_->linears()) out.push_back(l);
  if (shared_gate_) out.push_back(&*shared_gate_);
  return out;
}

void MoE::release_activations() {
  for (auto& e : experts_) e->release_activations();
  router_.release_activations();
  if (shared_) shared_->release_activations();
  if (shared_gate_) shared_gate_->release_activations();
  xs_ = xr_ = ys_ = y_ = wire_ = out_ = sg_ = Tensor();
}

namespace {
void copy_rows(float* dst, const float* src, const std::vector<int64_t>& to, int64_t C) {
  const int64_t n = static_cast<int64_t>(to.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + to[i] * C, src + i * C, C * sizeof(float));
}
void take_rows(float* dst, const float* src, const std::vector<int64_t>& from, int64_t C) {
  const int64_t n = static_cast<int64_t>(from.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * C, src + from[i] * C, C * sizeof(float));
}
// A [rows, C] view of buf, which grows (and never shrinks) as the row counts vary from
// call to call; the contents are whatever the last user left.
Tensor rows_view(Tensor& buf, int64_t rows, int64_t C) {
  if (!buf.defined() || buf.numel() < rows * C)
    buf = Tensor::zeros({std::max<int64_t>(rows * C, 1)});
  return buf.slice0(0, rows * C).reshape({rows, C});
}
}  // namespace

const Tensor& MoE::to_experts(const Tensor& sorted, Tensor& into) {
  if (!ep_.active()) return sorted;
  const int64_t C = sorted.dim(1), P = ep_.size(), R = static_cast<int64_t>(perm_.size());
  std::vector<int64_t> sc(P), rc(P);
  for (int64_t r = 0; r < P; ++r) {
    sc[r] = send_rows_[r] * C;
    rc[r] = recv_rows_[r] * C;
  }
  const Tensor received = rows_view(wire_, R, C);
  ep_.comm->all_to_all(sorted.f32(), sc.data(), received.f32(), rc.data());
  ensure(into, {R, C});
  copy_rows(into.f32(), received.f32(), perm_, C);
  return into;
}

void MoE::from_experts(const Tensor& rows, const Tensor& into) {
  const int64_t C = rows.dim(1);
  const int64_t P = ep_.size(), R = static_cast<int64_t>(perm_.size());
  const Tensor back = rows_view(wire_, R, C);  // received order
  take_rows(back.f32(), rows.f32(), perm_, C);
  std::vector<int64_t> sc(P), rc(P);
  for (int64_t r = 0; r < P; ++r) {
    sc[r] = recv_rows_[r] * C;
    rc[r] = send_rows_[r] * C;
  }
  ep_.comm->all_to_all(back.f32(), sc.data(), into.f32(), rc.data());
}

void MoE::key_expert_dropout(int64_t N) {
  const DropoutContext* ctx = nullptr;
  for (auto& e : experts_)
    for (Linear* l : e->linears())
      if (!ctx && l->lora()) ctx = l->lora()->context();
  if (!ctx) return;  // no LoRA on the experts
  const int64_t K = s_.router.top_k, L = static_cast<int64_t>(eoff_.size()) - 1;
  // Each sorted row's token row in the global batch, carried as the bits of two floats.
  Tensor sorted = Tensor::zeros({N * K, 2});
  for (int64_t i = 0; i < N * K; ++i) {
    const int64_t row = ctx->first_row + i / K;
    std::memcpy(sorted.f32() + slot_[i] * 2, &row, sizeof(row));
  }
  Tensor exchanged;
  const Tensor& mine = to_experts(sorted, exchanged);
  rows_.resize(static_cast<size_t>(eoff_[L]));
  for (int64_t r = 0; r < eoff_[L]; ++r)
    std::memcpy(&rows_[r], mine.f32() + r * 2, sizeof(int64_t));
  for (int64_t j = 0; j < L; ++j)
    for (Linear* l : experts_[j]->linears())
      if (l->lora()) l->lora()->set_rows(rows_.data() + eoff_[j]);
}

const Tensor& MoE::forward(const Tensor& x) {
  const int64_t C = s_.hidden, E = s_.router.n_experts, K = s_.router.top_k, N = x.numel() / C;
  LOOM_CHECK(ep_.size() == s_.ep_size,
             "internal: a layer declared with a slice of the experts runs without its "
             "expert-parallel group (MoE::set_expert_parallel)");
  const int64_t P = ep_.size(), L = E / P;
  router_.forward(x);
  const std::vector<int32_t>& idx = router_.experts();
  // Counting sort of the (token, slot) pairs by expert, tokens in order within each.
  off_.assign(static_cast<size_t>(E + 1), 0);
  for (int32_t e : idx) ++off_[e + 1];
  for (int64_t e = 0; e < E; ++e) off_[e + 1] += off_[e];
  std::vector<int64_t> next(off_.begin(), off_.end() - 1);
  slot_.resize(static_cast<size_t>(N * K));
  for (int64_t i = 0; i < N * K; ++i) slot_[i] = next[idx[i]]++;
  ensure(xs_, {N * K, C});
  take_rows(
      xs_.f32(), x.f32(),
      [&] {
        std::vector<int64_t> src(static_cast<size_t>(N * K));  // sorted row -> token
        for (int64_t i = 0; i < N * K; ++i) src[slot_[i]] = i / K;
        return src;
      }(),
      C);

  // This rank's experts' rows: its own tokens', or under EP every group rank's, regrouped.
  eoff_.assign(static_cast<size_t>(L + 1), 0);
  if (ep_.active()) {
    std::vector<int64_t> send_per(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) send_per[e] = off_[e + 1] - off_[e];
    recv_per_.assign(static_cast<size_t>(E), 0);  // [source][local expert]
    ep_.comm->all_to_all_counts(send_per.data(), recv_per_.data(), L);
    send_rows_.assign(static_cast<size_t>(P), 0);
    recv_rows_.assign(static_cast<size_t>(P), 0);
    dispatched_ = 0;
    for (int64_t r = 0; r < P; ++r)
      for (int64_t j = 0; j < L; ++j) {
        send_rows_[r] += send_per[r * L + j];
        recv_rows_[r] += recv_per_[r * L + j];
        eoff_[j + 1] += recv_per_[r * L + j];
        if (r != ep_.rank()) dispatched_ += send_per[r * L + j] * C;
      }
    for (int64_t j = 0; j < L; ++j) eoff_[j + 1] += eoff_[j];
    // Received order is [source][expert]; the expert order [expert][source].
    perm_.clear();
    std::vector<int64_t> at(eoff_.begin(), eoff_.end() - 1);
    for (int64_t r = 0; r < P; ++r)
      for (int64_t j = 0; j < L; ++j)
        for (int64_t i = 0; i < recv_per_[r * L + j]; ++i) perm_.push_back(at[j]++);
  } else {
    for (int64_t j = 0; j < L; ++j) eoff_[j + 1] = off_[j + 1];
    dispatched_ = 0;
  }
  const Tensor& rows = to_experts(xs_, xr_);
  key_expert_dropout(N);
  // Each of this rank's experts on its rows; outputs gathered in the same order: straight
  // into ys_ on one rank (the expert order is the sorted order), else returned from it.
  ensure(ys_, {N * K, C});
  const Tensor out = ep_.active() ? rows_view(out_, eoff_[L], C) : ys_;
  for (int64_t j = 0; j < L; ++j)
    if (eoff_[j + 1] > eoff_[j]) {
      const Tensor& o = experts_[j]->forward(rows.slice0(eoff_[j], eoff_[j + 1]));
      std::memcpy(out.f32() + eoff_[j] * C, o.f32(), o.numel() * sizeof(float));
    }
  if (ep_.active()) from_experts(out, ys_);

  ensure(y_, x.shape());
  if (shared_) {
    y_.copy_from(shared_->forward(x).reshape(x.shape()));
    if (shared_gate_) {  // y = sigmoid(x . w_g) shared(x)
      const float* z = shared_gate_->forward(x).f32();
      ensure(sg_, {N});
      float* g = sg_.f32();
      float* yp = y_.f32();
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < N; ++t) {
        g[t] = 1.0f / (1.0f + std::exp(-z[t]));
        for (int64_t c = 0; c < C; ++c) yp[t * C + c] *= g[t];
      }
    }
  } else {
    y_.zero_();
  }
  const float* w = router_.weights().f32();
  float* yp = y_.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = t * K + k;
      const float* r = ys_.f32() + slot_[i] * C;
      float* y = yp + t * C;
      for (int64_t c = 0; c < C; ++c) y[c] += w[i] * r[c];
    }
  return y_;
}

void MoE::backward(const Tensor& dy, const Tensor& dx, Scratch& scratch) {
  const int64_t C = s_.hidden, E = s_.router.n_experts, K = s_.router.top_k, N = dy.numel() / C;
  const int64_t L = E / ep_.size();
  const float* w = router_.weights().f32();
  if (shared_gate_) {
    // d shared = g dy; dz = (dy . shared) g (1 - g), through the gate's linear into dx.
    const Tensor& sh = shared_->output();
    Tensor dsh = scratch.zeros("moe.dshared", dy.shape());
    Tensor dz = scratch.zeros("moe.dgate", {N, 1});
    const float* g = sg_.f32();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      float dot = 0.0f;
      for (int64_t c = 0; c < C; ++c) {
        dsh.f32()[t * C + c] = g[t] * dy.f32()[t * C + c];
        dot += dy.f32()[t * C + c] * sh.f32()[t * C + c];
      }
      dz.f32()[t] = dot * g[t] * (1.0f - g[t]);
    }
    shared_gate_->backward(dz.reshape(shared_gate_->output().shape()), dx);
    shared_->backward(dsh, dx, scratch);
  } else if (shared_) {
    shared_->backward(dy, dx, scratch);
  }
  // dys[row of (t, k)] = w[t, k] dy[t]; dw[t, k] = dy[t] . ys[row of (t, k)].
  Tensor dys = scratch.zeros("moe.dys", {N * K, C});
  Tensor dw = scratch.zeros("moe.dw", {N, K});
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N * K; ++i) {
    const float* g = dy.f32() + (i / K) * C;
    const float* r = ys_.f32() + slot_[i] * C;
    float* d = dys.f32() + slot_[i] * C;
    float dot = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      d[c] = w[i] * g[c];
      dot += g[c] * r[c];
    }
    dw.f32()[i] = dot;
  }
  Tensor dye_buf;
  const Tensor& dye = to_experts(dys, dye_buf);
  // The experts' input gradients: straight into the sorted rows on one rank, else
  // returned to them by the reverse exchange.
  Tensor dxs = scratch.zeros("moe.dxs", {N * K, C});
  Tensor dxe = ep_.active() ? scratch.zeros("moe.dxe", {eoff_[L], C}) : dxs;
  for (int64_t j = 0; j < L; ++j)
    if (eoff_[j + 1] > eoff_[j])
      experts_[j]->backward(dye.slice0(eoff_[j], eoff_[j + 1]), dxe.slice0(eoff_[j], eoff_[j + 1]),
                            scratch);
  if (ep_.active()) from_experts(dxe, dxs);
  float* dxp = dx.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const float* r = dxs.f32() + slot_[t * K + k] * C;
      float* d = dxp + t * C;
      for (int64_t c = 0; c < C; ++c) d[c] += r[c];
    }
  router_.backward(dw, dx);
}

}  // namespace loom::nn
