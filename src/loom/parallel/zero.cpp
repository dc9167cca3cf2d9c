#include "loom/parallel/zero.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "loom/kernels/cpu/elementwise.h"
#include "loom/nn/weight_ops.h"
#include "loom/optim/clip.h"
#include "loom/util/error.h"
#include "loom/util/profile.h"

namespace loom::parallel {

// ---------------------------------------------------------------------------------------
// Partition

ZeroPartition ZeroPartition::make(const std::vector<int64_t>& lens, int world, int rank,
                                  const std::vector<bool>& expert, int expert_world,
                                  int expert_rank) {
  ZeroPartition p;
  p.world = world;
  p.rank = rank;
  p.expert_world = expert_world > 0 ? expert_world : world;
  p.expert_rank = expert_world > 0 ? expert_rank : rank;
  p.expert = expert;
  p.expert.resize(lens.size(), false);
  int64_t start = 0;
  for (size_t u = 0; u < lens.size(); ++u) {
    const int64_t L = lens[u], N = p.world_of(u);
    const int64_t c = (L + N - 1) / N;
    p.unit_start.push_back(start);
    p.unit_len.push_back(L);
    p.piece.push_back(c);
    p.shard_offset.push_back(p.shard_len);
    p.shard_len += c;
    start += L;
  }
  return p;
}

int64_t ZeroPartition::piece_end(size_t u) const {
  return std::min(unit_len[u], (rank_of(u) + 1) * piece[u]);
}

ZeroMemory ZeroPartition::memory(int stage, int64_t frozen_bytes, const StateBytes& b,
                                 int64_t micro_batches) const {
  int64_t total = 0;
  std::vector<int64_t> padded;
  for (size_t u = 0; u < unit_len.size(); ++u) {
    total += unit_len[u];
    padded.push_back(piece[u] * world_of(u));
  }
  std::sort(padded.rbegin(), padded.rend());
  padded.resize(std::max<size_t>(padded.size(), 3), 0);
  const int64_t all_padded = std::accumulate(padded.begin(), padded.end(), int64_t{0}),
                top3 = padded[0] + padded[1] + padded[2];
  const int64_t f = b.comm;  // the buffers hold what is communicated
  ZeroMemory m;
  // Mixed precision at stages 1-2 (StateBytes::loom_mixed): the weights held whole in their
  // 16 bits alone, the fp32 master sharded beside the moments.
  const bool working = b.half > 0 && (stage == 1 || stage == 2);
  m.params = frozen_bytes + (working ? b.half * total
                                     : b.param * (stage >= 3 ? shard_len : total) +
                                           (stage >= 3 ? 0 : b.half * total));
  m.grads = b.grad * (stage >= 2 ? shard_len : total);
  m.optimizer = (b.optimizer + (working ? b.param : 0)) * (stage >= 1 ? shard_len : total);
  // Buffers the engine allocates around the collectives (at most): stage 1 receives the
  // reduce-scattered shard and stages every padded unit (the last backward starts each unit's
  // reduce-scatter as soon as it is complete, and nothing bounds how many are in flight; a
  // pipeline stage's reduce_grads starts all at once); stages 2 and 3 hold the gradients of
  // up to three units (one being computed, kInflight = 2 being reduced; a tied embedding's
  // lives through the backward) and their received pieces; stage 3 also holds the gathered
  // parameters of up to three units (the current one, the prefetched next one, a tied
  // embedding held from lookup to head). Bounded with the three largest units.
  if (stage == 1) m.buffers = f * (shard_len + all_padded);
  // Stages 2-3 also keep the pairwise sums' pieces (fp32, a shard each at most).
  if (stage >= 2)
    m.buffers =
        f * (top3 + top3 / world) + 4 * shard_len * MicroBatchSum::sum_buffers(micro_batches);
  if (stage >= 3) m.buffers += (b.param + b.half) * top3;
  return m;
}

// ---------------------------------------------------------------------------------------
// Gradient accumulators: f32, or 16 bits under grad_accum_dtype

namespace {
uint16_t* bits(const Tensor& t) { return static_cast<uint16_t*>(t.raw()); }

kernels::Half half_of(const Tensor& t) {
  return t.dtype() == DType::BF16 ? kernels::Half::bf16 : kernels::Half::f16;
}

// acc[0, n) += x[0, n), in acc's dtype (one rounding per element for 16 bits).
void add_into(const Tensor& acc, const float* x, int64_t n) {
  if (n <= 0) return;
  if (acc.dtype() == DType::F32) return kernels::add_inplace(acc.f32(), x, n);
  kernels::add_to_half(half_of(acc), x, bits(acc), n);
}

// acc[0, n) as f32.
void widen_into(const Tensor& acc, float* out, int64_t n) {
  if (n <= 0) return;
  if (acc.dtype() == DType::F32) return void(std::memcpy(out, acc.f32(), n * sizeof(float)));
  kernels::from_half(half_of(acc), bits(acc), out, n);
}
}  // namespace

// ---------------------------------------------------------------------------------------
// Pairwise sum over micro-batches

void MicroBatchSum::add(const Tensor& acc, Tensor piece, int64_t n) {
  int level = 0;
  // Carry: the new partial absorbs equal-level partials on top of the stack (they cover
  // the micro-batches just before it), then the accumulator's when it is next.
  while (!stack_.empty() && stack_.back().level == level) {
    kernels::add_inplace(piece.f32(), stack_.back().sum.f32(), n);
    stack_.pop_back();
    ++level;
  }
  if (stack_.empty() && (acc_level_ < 0 || acc_level_ == level)) {
    add_into(acc, piece.f32(), n);  // onto zero: the piece itself
    acc_level_ = level + (acc_level_ < 0 ? 0 : 1);
    return;
  }
  stack_.push_back({std::move(piece), level});
}

void MicroBatchSum::finish(const Tensor& acc, int64_t n) {
  if (!stack_.empty()) {
    Tensor rest = std::move(stack_.back().sum);  // lowest level first, upward
    for (size_t i = stack_.size() - 1; i-- > 0;)
      kernels::add_inplace(rest.f32(), stack_[i].sum.f32(), n);
    add_into(acc, rest.f32(), n);
  }
  stack_.clear();
  acc_level_ = -1;
}

int64_t MicroBatchSum::sum_buffers(int64_t micro_batches) {
  int64_t most = 0;
  for (int64_t k = 1; k <= micro_batches; k = 2 * k + 1) ++most;  // 1, 3, 7, ... 2^b - 1
  return std::max<int64_t>(most - 1, 0);
}

// ---------------------------------------------------------------------------------------
// Engine state

namespace {
constexpr size_t kInflight = 2;  // stage 2/3: unit gradients waiting for their reduce-scatter
}

struct ZeroEngine::Unit {
  std::vector<nn::Parameter*> params;               // trainable ones, in flat order
  std::vector<std::vector<nn::Parameter*>> copies;  // the same, of each add_context()
  int64_t start = 0, len = 0;                       // flat range
  bool expert = false;                              // reduced over edp (ZeroEngine::comm)
  int expert_part = -1;                             // a model unit's expert unit, if any
  Tensor grad;                                      // stage >= 2: this backward's gradient, padded
  Tensor value;                                     // stage 3: gathered parameters, padded
  // A gather in flight: stage 3's (prefetch) into `value`, or under mixed precision (every
  // stage-3 gather, stages 1-2's after each step) into `half`, with the small values into
  // `packed` (each rank's small_max apart).
  dist::Request gather, gather_small;
  Tensor packed;
  int refs = 0;  // stage 3: acquire() minus release()
  // Working weights under mixed precision (stages 1-2: always held; stage 3: while
  // acquired): the 16-bit image of the padded unit (the matrices' `half` data are views
  // into it) and the f32 values of the unit's other parameters (`small`: norms, biases,
  // adapters) back to back.
  Tensor half, small;
  struct Run {
    int64_t at, n, small_at;  // a small parameter: its place in the unit and in `small`
  };
  std::vector<Run> small_runs;
  int64_t small_max = 0;  // the most small elements any rank's piece holds
};

// A reduction in flight: which units, and the buffers it reads from and writes to.
struct ZeroEngine::Pending {
  std::vector<int> units;
  dist::Request req;
  Tensor staged;  // stage 1: the padded copy of a unit's gradient
  Tensor piece;   // stage >= 1: this rank's summed piece
  // communication_data_type 16-bit: what travels (stage 0: the bucket, widened back into
  // `out`; stages >= 1: the padded unit, and the received piece).
  Tensor wire, wire_piece;
  float* out = nullptr;
};

namespace {
// A model unit's trainable parameters in flat order: its dense part, then its expert part.
std::pair<std::vector<nn::Parameter*>, std::vector<nn::Parameter*>> split_unit(
    const std::vector<nn::Parameter*>& group) {
  std::vector<nn::Parameter*> dense, expert;
  for (nn::Parameter* p : group)
    if (p->trainable) (p->expert ? expert : dense).push_back(p);
  for (auto* v : {&dense, &expert})
    std::sort(v->begin(), v->end(),
              [](auto* a, auto* b) { return a->grad_offset < b->grad_offset; });
  return {dense, expert};
}

// The parts of a unit's small parameters (Unit::small_runs) inside the piece [lo, hi):
// fn(unit_at, small_at, n, k), k the piece's small elements before this part; returns
// their count.
template <typename Runs, typename Fn>
int64_t for_piece_runs(const Runs& runs, int64_t lo, int64_t hi, Fn&& fn) {
  int64_t k = 0;
  for (const auto& r : runs) {
    const int64_t a = std::max(lo, r.at), b = std::min(hi, r.at + r.n);
    if (a >= b) continue;
    fn(a, r.small_at + (a - r.at), b - a, k);
    k += b - a;
  }
  return k;
}
}  // namespace

ZeroEngine::ZeroEngine(models::CausalLM& model, dist::Communicator& dp, const ZeroConfig& cfg,
                       const optim::AdamWConfig& adamw, const nn::TensorParallel& tp,
                       dist::Communicator* edp)
    : model_(model), comm_(dp), edp_(edp), cfg_(cfg), tp_(tp) {
  LOOM_CHECK(cfg.stage >= 0 && cfg.stage <= 3,
             "zero_optimization.stage must be 0, 1, 2 or 3, got " + std::to_string(cfg.stage));
  LOOM_CHECK(!cfg.accum || cfg.stage >= 2,
             "internal: 16-bit gradient accumulation needs ZeRO stage 2 or 3");
  nn::ParamStore& ps = model.params();
  // Units and their flat ranges: each unit's trainable parameters are one contiguous run,
  // units in increasing order (ParamStore::materialize with the model's unit_of: the dense
  // parts in model order, then the expert parts).
  std::vector<std::vector<nn::Parameter*>> groups = model.units();
  units_.resize(groups.size());
  for (size_t u = 0; u < groups.size(); ++u) {
    auto [dense, expert] = split_unit(groups[u]);
    units_[u].params = std::move(dense);
    if (expert.empty()) continue;
    units_[u].expert_part = static_cast<int>(units_.size());
    Unit e;
    e.params = std::move(expert);
    e.expert = true;
    units_.push_back(std::move(e));
  }
  std::vector<int64_t> lens;
  std::vector<bool> is_expert;
  int64_t at = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    unit.start = at;
    for (nn::Parameter* p : unit.params) {
      LOOM_CHECK(static_cast<int64_t>(p->grad_offset) == at,
                 "ZeRO: trainable parameters of unit " + std::to_string(u) +
                     " are not one contiguous run (" + p->name + ")");
      at += p->value.numel();
    }
    unit.len = at - unit.start;
    lens.push_back(unit.len);
    is_expert.push_back(unit.expert);
  }
  LOOM_CHECK(at == ps.trainable_numel(), "ZeRO: units do not cover the trainable parameters");
  dist::Communicator& ecomm = edp_ ? *edp_ : comm_;
  part_ =
      ZeroPartition::make(lens, comm_.size(), comm_.rank(), is_expert, ecomm.size(), ecomm.rank());

  // Stage 0 buckets: consecutive units of one group in the order their gradients complete
  // (L+1 down to 0, then a prefix), merged while flat-adjacent until reduce_bucket_size
  // elements.
  if (cfg_.stage == 0) {
    std::vector<int> ready_order;
    const int L = model.num_layers(), M = static_cast<int>(groups.size());
    for (int u = L + 1; u >= 0; --u) ready_order.push_back(u);
    for (int u = L + 2; u < M; ++u) ready_order.push_back(u);
    for (int i = 0; i < M; ++i)
      if (const int e = units_[ready_order[i]].expert_part; e >= 0) ready_order.push_back(e);
    std::vector<int> cur;
    int64_t cur_len = 0;
    for (int u : ready_order) {
      if (units_[u].len == 0) continue;
      const bool adjacent =
          cur.empty() || (units_[u].start + units_[u].len == units_[cur.back()].start &&
                          units_[u].expert == units_[cur.back()].expert);
      if (!cur.empty() && (!adjacent || cur_len >= cfg_.reduce_bucket_size)) {
        buckets_.push_back(cur);
        cur.clear();
        cur_len = 0;
      }
      cur.push_back(u);
      cur_len += units_[u].len;
    }
    if (!cur.empty()) buckets_.push_back(cur);
  }

  // What this rank updates: every element at stage 0, its pieces otherwise.
  const int64_t frozen_bytes = ps.value_bytes() - 4 * ps.trainable_numel();
  if (cfg_.stage == 0) {
    opt_ = std::make_unique<optim::AdamW>(ps, adamw);
    for (Unit& unit : units_)
      for (nn::Parameter* p : unit.params)
        owned_.push_back({p, 0, p->value.numel(), static_cast<int64_t>(p->grad_offset)});
  } else {
    opt_ = std::make_unique<optim::AdamW>(adamw, part_.shard_len);
    for (size_t u = 0; u < units_.size(); ++u) {
      const int64_t lo = part_.piece_begin(u), hi = part_.piece_end(u);
      for (nn::Parameter* p : units_[u].params) {
        const int64_t p0 = static_cast<int64_t>(p->grad_offset) - units_[u].start,
                      p1 = p0 + p->value.numel();
        const int64_t a = std::max(lo, p0), b = std::min(hi, p1);
        if (a < b) owned_.push_back({p, a - p0, b - p0, part_.shard_offset[u] + (a - lo)});
      }
    }
    shard_grads_ = cfg_.accum ? nn::half_zeros({part_.shard_len}, *cfg_.accum)
                              : Tensor::zeros({part_.shard_len});
  }
  master_sharded_ = cfg_.stage >= 3 || (cfg_.stage >= 1 && cfg_.half);
  working_ = master_sharded_ && cfg_.stage <= 2;
  gather16_ = cfg_.stage >= 3 && cfg_.half.has_value();
  if (master_sharded_) {
    // The master copy of this rank's pieces; the store drops its trainable values.
    shard_values_ = Tensor::zeros({part_.shard_len});
    for (const OwnedRun& r : owned_)
      std::memcpy(shard_values_.f32() + r.state_offset, r.param->value.f32() + r.begin,
                  (r.end - r.begin) * sizeof(float));
  }
  if (working_ || gather16_) {
    // Each unit's layout of 16-bit matrices and small parameters; at stages 1-2 also the
    // first working weights, from the whole values while they exist (what sync_working()
    // gathers after every step, without the communication).
    for (size_t i = 0; i < units_.size(); ++i) {
      Unit& u = units_[i];
      int64_t small = 0;
      for (nn::Parameter* p : u.params) {
        const int64_t at = static_cast<int64_t>(p->grad_offset) - u.start, n = p->value.numel();
        if (nn::takes_half(*p)) {
          if (!working_) continue;
          if (!u.half.defined())
            u.half = nn::half_zeros({part_.piece[i] * part_.world_of(i)}, *cfg_.half);
          kernels::to_half(*cfg_.half, p->value.f32(), bits(u.half) + at, n);
        } else {
          u.small_runs.push_back({at, n, small});
          small += n;
        }
      }
      if (working_) {
        u.small = Tensor::zeros({small});
        for (const Unit::Run& r : u.small_runs)
          std::memcpy(u.small.f32() + r.small_at, ps.flat_values().f32() + u.start + r.at,
                      r.n * sizeof(float));
      }
      for (int rank = 0; rank < part_.world_of(i); ++rank) {
        const int64_t lo = rank * part_.piece[i], hi = std::min(u.len, lo + part_.piece[i]);
        u.small_max = std::max(u.small_max, for_piece_runs(u.small_runs, lo, hi, [](auto...) {}));
      }
    }
  }
  if (master_sharded_) ps.drop_trainable_values();
  if (cfg_.stage >= 2) {
    ps.drop_grads();
    sums_.resize(units_.size());
  }
  if (cfg_.half) nn::use_half_weights(ps, *cfg_.half);
  if (working_)
    for (Unit& u : units_) point_working(u);
  StateBytes bytes = cfg_.half ? StateBytes::loom_mixed() : StateBytes{};
  if (cfg_.comm) bytes.comm = 2;
  if (cfg_.accum) bytes.grad = 2;
  mem_ = part_.memory(cfg_.stage, frozen_bytes, bytes, cfg_.micro_batches);
  model_.set_unit_hooks(this);
}

ZeroEngine::~ZeroEngine() {
  model_.set_unit_hooks(nullptr);
  for (models::CausalLM* c : contexts_) c->set_unit_hooks(nullptr);
}

void ZeroEngine::add_context(models::CausalLM& ctx) {
  // The views as the engine left them (dropped values and gradients at stages 3 and 2).
  ctx.params().share_from(model_.params());
  std::vector<std::vector<nn::Parameter*>> groups = ctx.units();
  LOOM_CHECK(groups.size() <= units_.size(), "internal: an activation context's units differ");
  auto add = [&](size_t u, std::vector<nn::Parameter*> copy) {
    LOOM_CHECK(copy.size() == units_[u].params.size(),
               "internal: an activation context's unit " + std::to_string(u) + " differs");
    units_[u].copies.push_back(std::move(copy));
  };
  for (size_t u = 0; u < groups.size(); ++u) {
    auto [dense, expert] = split_unit(groups[u]);
    add(u, std::move(dense));
    if (units_[u].expert_part >= 0) add(units_[u].expert_part, std::move(expert));
  }
  contexts_.push_back(&ctx);
  ctx.set_unit_hooks(this);
}

void ZeroEngine::point(Unit& u, Tensor nn::Parameter::*field, const Tensor& buf) {
  auto set = [&](const std::vector<nn::Parameter*>& params) {
    int64_t off = 0;
    for (nn::Parameter* p : params) {
      const int64_t n = shape_numel(p->shape);
      p->*field = buf.defined() ? buf.slice0(off, off + n).reshape(p->shape) : Tensor();
      off += n;
    }
  };
  set(u.params);
  for (const auto& copy : u.copies) set(copy);
}

void ZeroEngine::point_working(Unit& u) {
  auto set = [&](const std::vector<nn::Parameter*>& params) {
    size_t k = 0;  // the next small run
    int64_t at = 0;
    for (nn::Parameter* p : params) {
      const int64_t n = shape_numel(p->shape);
      if (k < u.small_runs.size() && u.small_runs[k].at == at) {
        const int64_t s = u.small_runs[k++].small_at;
        p->value = u.small.slice0(s, s + n).reshape(p->shape);
      } else {
        p->value = Tensor();
        nn::HalfCopy& h = *p->half;  // shared by the contexts' copies
        h.data = u.half.slice0(at, at + n).reshape(p->shape);
        h.gathered = true;
        h.stale = false;
      }
      at += n;
    }
  };
  set(u.params);
  for (const auto& copy : u.copies) set(copy);
}

dist::Communicator& ZeroEngine::comm(size_t unit) const {
  return units_[unit].expert && edp_ ? *edp_ : comm_;
}

bool ZeroEngine::writes(const OwnedRun& r) const {
  return cfg_.stage > 0 || comm(unit_of(*r.param).first).rank() == 0;
}

float* ZeroEngine::owned_value(const OwnedRun& r) {
  if (master_sharded_) return shard_values_.f32() + r.state_offset;
  return r.param->value.f32() + r.begin;
}

// ---------------------------------------------------------------------------------------
// Step path

void ZeroEngine::zero_grads() {
  if (cfg_.stage <= 1 && !grads_cleared_) model_.params().zero_grads();
  grads_cleared_ = false;
  if (cfg_.stage >= 1) shard_grads_.zero_();
}

void ZeroEngine::begin_micro_batch(bool last) { last_micro_ = last; }

void ZeroEngine::begin_backward() { in_backward_ = true; }

void ZeroEngine::end_backward() {
  in_backward_ = false;
  if (cfg_.stage >= 2 || last_micro_) wait_all();
  if (last_micro_) finish_sums();
}

void ZeroEngine::reduce_grads() {
  if (cfg_.stage <= 1) {
    last_micro_ = true;
    const int L = model_.num_layers(), n = model_.num_units();
    for (int u = L + 1; u >= 0; --u) grads_ready(u);  // the order backward completes them
    for (int u = L + 2; u < n; ++u) grads_ready(u);
  }
  wait_all();
  finish_sums();
}

void ZeroEngine::finish_sums() {
  for (size_t u = 0; u < sums_.size(); ++u)
    sums_[u].finish(shard_piece(u), part_.piece_end(u) - part_.piece_begin(u));
}

Tensor ZeroEngine::shard_piece(size_t u) const {
  const int64_t at = part_.shard_offset[u];
  return shard_grads_.slice0(at,
                             at + std::max<int64_t>(part_.piece_end(u) - part_.piece_begin(u), 0));
}

std::pair<int, int64_t> ZeroEngine::unit_of(const nn::Parameter& p) const {
  for (size_t u = 0; u < units_.size(); ++u) {
    const int64_t at = static_cast<int64_t>(p.grad_offset) - units_[u].start;
    if (p.trainable && at >= 0 && at < units_[u].len) return {static_cast<int>(u), at};
  }
  throw Error("internal: " + p.name + " is not a trainable parameter of the engine's model");
}

Tensor ZeroEngine::reduced_grad(const nn::Parameter& p) {
  if (cfg_.stage == 0) return p.grad;
  const auto [u, p0] = unit_of(p);
  const int64_t c = part_.piece[u], lo = part_.piece_begin(u), hi = part_.piece_end(u);
  Tensor unit = Tensor::zeros({c * part_.world_of(u)});
  widen_into(shard_piece(u), unit.f32() + lo, hi - lo);
  {
    prof::ScopedPhase ph(prof::Phase::Comm);
    comm(u).all_gather(unit.f32() + lo, unit.f32(), c);
  }
  return unit.slice0(p0, p0 + shape_numel(p.shape)).reshape(p.shape);
}

void ZeroEngine::add_to_reduced_grad(const nn::Parameter& p, const Tensor& extra) {
  LOOM_CHECK(extra.shape() == p.shape, "internal: a gradient of " + shape_str(extra.shape()) +
                                           " added to " + p.name + " " + shape_str(p.shape));
  if (cfg_.stage == 0) {
    kernels::add_inplace(p.grad.f32(), extra.f32(), extra.numel());
    return;
  }
  // My piece [lo, hi) of the unit, where p covers [p0, p0 + n).
  const auto [u, p0] = unit_of(p);
  const int64_t n = shape_numel(p.shape);
  const int64_t a = std::max(part_.piece_begin(u), p0), b = std::min(part_.piece_end(u), p0 + n);
  if (a < b)
    add_into(shard_piece(u).slice0(a - part_.piece_begin(u), b - part_.piece_begin(u)),
             extra.f32() + (a - p0), b - a);
}

double ZeroEngine::grad_sq_norm() {
  // Stage 0 under expert parallelism: each rank holds its expert slice's summed gradients
  // (the same on every rank of its edp group); they count on edp rank 0 and are summed
  // over dp, as the ZeRO pieces of stages 1-3 are.
  const bool split = cfg_.stage == 0 && edp_ && edp_->size() < comm_.size();
  double s[2] = {0.0, 0.0};  // dense, expert (split only)
  const bool stage_copy = std::any_of(owned_.begin(), owned_.end(),
                                      [](const OwnedRun& r) { return r.param->stage_copy; });
  const Tensor& flat = model_.params().flat_grads();
  if (!tp_.active() && !stage_copy) {
    if (cfg_.stage > 0) {
      s[0] = optim::sum_of_squares(shard_grads_);
    } else if (!split) {
      s[0] = optim::sum_of_squares(flat);
    } else {
      for (const Unit& u : units_)
        s[u.expert] += optim::sum_of_squares(flat.slice0(u.start, u.start + u.len));
    }
  } else {
    // Each tp rank holds different shards: sum them over the group, each replicated
    // parameter (norms, row-parallel biases, replicated key/value slices) counted once.
    for (const OwnedRun& r : owned_) {
      if (!nn::primary_copy(*r.param, tp_.rank()) || r.param->stage_copy) continue;
      const int64_t at =
          cfg_.stage == 0 ? static_cast<int64_t>(r.param->grad_offset) + r.begin : r.state_offset;
      const Tensor& g = cfg_.stage == 0 ? flat : shard_grads_;
      s[split && r.param->expert] += optim::sum_of_squares(g.slice0(at, at + (r.end - r.begin)));
    }
    if (tp_.active()) tp_.comm->all_reduce_sum(s, 2);
  }
  if (split) {
    if (edp_->rank() != 0) s[1] = 0.0;
    comm_.all_reduce_sum(&s[1], 1);
  }
  if (cfg_.stage > 0) comm_.all_reduce_sum(&s[0], 1);  // padding elements are zero
  return s[0] + s[1];
}

std::optional<ZeroEngine::NonFinite> ZeroEngine::first_non_finite() const {
  std::vector<float> wide;
  for (const OwnedRun& r : owned_) {
    const int64_t n = r.end - r.begin;
    const float* g;
    if (cfg_.stage == 0) {
      g = model_.params().flat_grads().f32() + r.param->grad_offset + r.begin;
    } else {
      wide.resize(n);
      widen_into(shard_grads_.slice0(r.state_offset, r.state_offset + n), wide.data(), n);
      g = wide.data();
    }
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(g[i])) return NonFinite{&r, r.begin + i, g[i]};
  }
  return std::nullopt;
}

void ZeroEngine::optimizer_step(float lr, float clip_coef) {
  // A prefetch left over from a forward (evaluation, or the tied head's look-ahead) would
  // hold values from before this update.
  drop_prefetches();
  if (cfg_.stage == 0) {
    mark_updated();  // before: the step itself rewrites (and marks fresh) the 16-bit copies
    opt_->step(model_.params(), lr, clip_coef, /*clear_grads=*/true);
    grads_cleared_ = true;
    return;
  }
  segments_.clear();
  for (const OwnedRun& r : owned_) {
    optim::AdamW::Segment seg{owned_value(r), nullptr, r.state_offset, r.end - r.begin,
                              opt_->config().decays(r.param->kind)};
    if (cfg_.accum) {
      seg.grad16 = bits(shard_grads_) + r.state_offset;
      seg.grad_format = *cfg_.accum;
    } else {
      seg.grad = shard_grads_.f32() + r.state_offset;
    }
    segments_.push_back(seg);
    // Stages 1-2 under mixed precision: the update also rounds a matrix's run into its
    // place in the unit's 16-bit image, which sync_working then gathers as it is.
    if (working_ && nn::takes_half(*r.param)) {
      const auto [u, at] = unit_of(*r.param);
      segments_.back().half = {bits(units_[u].half) + at + r.begin, *cfg_.half};
    }
  }
  opt_->step(segments_, lr, clip_coef);
  if (working_)
    sync_working(/*rounded=*/true);
  else if (cfg_.stage <= 2)
    sync_params();
  mark_updated();
}

void ZeroEngine::mark_updated() {
  for (const Unit& u : units_)
    for (nn::Parameter* p : u.params) nn::mark_half_stale(*p);
}

void ZeroEngine::sync_params() {
  prof::ScopedPhase ph(prof::Phase::Comm);
  // Each unit: my updated piece into a padded staging buffer at my slot, gather in place.
  float* values = model_.params().flat_values().f32();
  for (size_t u = 0; u < units_.size(); ++u) {
    const int64_t L = units_[u].len, c = part_.piece[u];
    if (L == 0) continue;
    Tensor staged = Tensor::zeros({c * part_.world_of(u)});
    const int64_t lo = part_.piece_begin(u), hi = part_.piece_end(u);
    if (hi > lo)
      std::memcpy(staged.f32() + lo, values + units_[u].start + lo, (hi - lo) * sizeof(float));
    comm(u).all_gather(staged.f32() + lo, staged.f32(), c);
    std::memcpy(values + units_[u].start, staged.f32(), L * sizeof(float));
  }
}

void ZeroEngine::sync_working(bool rounded) {
  prof::ScopedPhase ph(prof::Phase::Comm);
  // Every unit's gathers in flight at once.
  for (size_t i = 0; i < units_.size(); ++i)
    if (units_[i].len > 0) start_working_gather(i, rounded);
  for (size_t i = 0; i < units_.size(); ++i)
    if (units_[i].len > 0) finish_working_gather(i);
}

void ZeroEngine::start_working_gather(size_t i, bool rounded) {
  Unit& u = units_[i];
  const int64_t c = part_.piece[i], lo = part_.piece_begin(i), hi = part_.piece_end(i);
  const float* master = shard_values_.f32() + part_.shard_offset[i];
  if (u.half.defined()) {
    uint16_t* mine = bits(u.half) + lo;
    if (hi > lo && !rounded) kernels::to_half(*cfg_.half, master, mine, hi - lo);
    u.gather = comm(i).iall_gather(mine, bits(u.half), c);
  }
  // Each rank's piece [lo, hi) holds up to small_max small elements, sent packed (padded
  // to small_max).
  if (u.small_max > 0) {
    u.packed = Tensor::zeros({u.small_max * part_.world_of(i)});
    float* mine = u.packed.f32() + part_.rank_of(i) * u.small_max;
    for_piece_runs(u.small_runs, lo, hi, [&](int64_t at, int64_t, int64_t n, int64_t k) {
      std::memcpy(mine + k, master + (at - lo), n * sizeof(float));
    });
    u.gather_small = comm(i).iall_gather(mine, u.packed.f32(), u.small_max);
  }
}

void ZeroEngine::finish_working_gather(size_t i) {
  Unit& u = units_[i];
  u.gather.wait();
  u.gather_small.wait();
  if (!u.packed.defined()) return;
  for (int rank = 0; rank < part_.world_of(i); ++rank) {
    const int64_t lo = rank * part_.piece[i];
    const float* from = u.packed.f32() + rank * u.small_max;
    for_piece_runs(u.small_runs, lo, std::min(u.len, lo + part_.piece[i]),
                   [&](int64_t, int64_t small_at, int64_t n, int64_t k) {
                     std::memcpy(u.small.f32() + small_at, from + k, n * sizeof(float));
                   });
  }
  u.packed = Tensor();
}

// ---------------------------------------------------------------------------------------
// Hooks: gradients

void ZeroEngine::grads_ready(int unit) {
  grads_ready_one(unit);
  if (const int e = units_[unit].expert_part; e >= 0) grads_ready_one(e);
}

void ZeroEngine::grads_ready_one(int unit) {
  if (units_[unit].len == 0) return;
  if (cfg_.stage <= 1 && !last_micro_) return;  // accumulate locally until the last one
  if (cfg_.stage == 0) {
    // A bucket starts when its last unit (in ready order) is complete.
    for (const auto& b : buckets_) {
      if (b.back() != unit) continue;
      const Unit& lo = units_[b.back()];  // lowest flat start
      const Unit& hi = units_[b.front()];
      float* g = model_.params().flat_grads().f32() + lo.start;
      const int64_t n = hi.start + hi.len - lo.start;
      auto p = std::make_unique<Pending>();
      p->units = b;
      if (cfg_.comm) {
        p->wire = nn::half_zeros({n}, *cfg_.comm);
        kernels::to_half(*cfg_.comm, g, bits(p->wire), n);
        p->out = g;
        p->req = comm(b[0]).iall_reduce_sum(*cfg_.comm, bits(p->wire), n);
      } else {
        p->req = comm(b[0]).iall_reduce_sum(g, n);
      }
      pending_.push_back(std::move(p));
    }
  } else {
    launch_reduce(unit);
  }
  progress();
}

void ZeroEngine::launch_reduce(int unit) {
  Unit& u = units_[unit];
  const int64_t c = part_.piece[unit], N = part_.world_of(unit);
  auto p = std::make_unique<Pending>();
  p->units = {unit};
  p->piece = Tensor::zeros({c});
  const float* send;
  if (cfg_.stage == 1) {  // the unit's accumulated gradient, padded
    p->staged = Tensor::zeros({c * N});
    std::memcpy(p->staged.f32(), model_.params().flat_grads().f32() + u.start,
                u.len * sizeof(float));
    send = p->staged.f32();
  } else {
    send = u.grad.f32();  // allocated padded in acquire()
  }
  if (cfg_.comm) {
    p->wire = nn::half_zeros({c * N}, *cfg_.comm);
    kernels::to_half(*cfg_.comm, send, bits(p->wire), c * N);
    p->staged = Tensor();
    p->wire_piece = nn::half_zeros({c}, *cfg_.comm);
    p->req = comm(unit).ireduce_scatter_sum(*cfg_.comm, bits(p->wire), bits(p->wire_piece), c);
  } else {
    p->req = comm(unit).ireduce_scatter_sum(send, p->piece.f32(), c);
  }
  pending_.push_back(std::move(p));
  // Bound the gradient memory in flight (stage 2/3 allocate a unit's gradient per backward).
  while (cfg_.stage >= 2 && pending_.size() > kInflight) {
    pending_.front()->req.wait();
    finish(*pending_.front());
    pending_.erase(pending_.begin());
  }
}

void ZeroEngine::finish(Pending& p) {
  if (cfg_.stage == 0) {  // reduced in place, or in its 16-bit form
    if (p.out) kernels::from_half(*cfg_.comm, bits(p.wire), p.out, p.wire.numel());
    return;
  }
  if (p.wire_piece.defined())
    kernels::from_half(*cfg_.comm, bits(p.wire_piece), p.piece.f32(), p.piece.numel());
  const int u = p.units[0];
  const int64_t n = part_.piece_end(u) - part_.piece_begin(u);
  if (cfg_.stage >= 2)
    sums_[u].add(shard_piece(u), std::move(p.piece), n);
  else
    add_into(shard_piece(u), p.piece.f32(), n);
  if (cfg_.stage >= 2) {
    point(units_[u], &nn::Parameter::grad, Tensor());
    units_[u].grad = Tensor();
  }
}

void ZeroEngine::progress() {
  // A unit's reductions retire in the order they started (its pairwise sum takes the
  // micro-batches in order), whichever completes first.
  auto earlier_of_unit = [&](size_t i) {
    for (size_t k = 0; k < i; ++k)
      if (pending_[k]->units == pending_[i]->units) return true;
    return false;
  };
  for (size_t i = 0; i < pending_.size();) {
    if (!earlier_of_unit(i) && pending_[i]->req.test()) {
      finish(*pending_[i]);
      pending_.erase(pending_.begin() + i);
    } else {
      ++i;
    }
  }
}

void ZeroEngine::wait_all() {
  prof::ScopedPhase ph(prof::Phase::Comm);
  for (auto& p : pending_) {
    p->req.wait();
    finish(*p);
  }
  pending_.clear();
}

// ---------------------------------------------------------------------------------------
// Hooks: parameters (stage 3) and per-unit gradient buffers (stage 2/3)

bool ZeroEngine::gathered(const Unit& u) const {
  return u.value.defined() || (gather16_ && u.half.defined());
}

void ZeroEngine::start_gather(int unit, bool fp32) {
  Unit& u = units_[unit];
  const int64_t c = part_.piece[unit];
  if (gather16_ && !fp32) {
    // The matrices as the 16-bit image of the padded unit (this rank's piece rounded from
    // the master: the same bits as rounding after an fp32 gather, half the bytes), the
    // small parameters packed in f32.
    u.half = nn::half_zeros({c * part_.world_of(unit)}, *cfg_.half);
    start_working_gather(unit);
    return;
  }
  u.value = Tensor::zeros({c * part_.world_of(unit)});
  float* mine = u.value.f32() + part_.rank_of(unit) * c;
  const int64_t n = part_.piece_end(unit) - part_.piece_begin(unit);
  if (n > 0) std::memcpy(mine, shard_values_.f32() + part_.shard_offset[unit], n * sizeof(float));
  u.gather = comm(unit).iall_gather(mine, u.value.f32(), c);
}

void ZeroEngine::acquire(int unit) {
  acquire_one(unit);
  if (const int e = units_[unit].expert_part; e >= 0) acquire_one(e);
  // Stage 3: prefetch the model unit that runs next (forward goes up, backward down).
  const int next = in_backward_ ? unit - 1 : unit + 1;
  if (cfg_.stage >= 3 && next >= 0 && next < model_.num_units())
    for (const int n : {next, units_[next].expert_part})
      if (n >= 0 && units_[n].len > 0 && !gathered(units_[n])) start_gather(n);
  progress();
}

void ZeroEngine::acquire_one(int unit) {
  Unit& u = units_[unit];
  if (u.len == 0) return;
  if (cfg_.stage >= 3 && u.refs++ == 0) {
    if (!gathered(u)) start_gather(unit);
    u.gather.wait();
    if (gather16_) {
      const Unit::Run* last = u.small_runs.empty() ? nullptr : &u.small_runs.back();
      u.small = Tensor::zeros({last ? last->small_at + last->n : 0});
      finish_working_gather(unit);
      point_working(u);
    } else {
      point(u, &nn::Parameter::value, u.value);
      for (nn::Parameter* p : u.params) nn::mark_half_stale(*p);
    }
  }
  if (cfg_.stage >= 2 && in_backward_ && !u.grad.defined()) {
    u.grad = Tensor::zeros({part_.piece[unit] * part_.world_of(unit)});
    point(u, &nn::Parameter::grad, u.grad);
  }
}

void ZeroEngine::release(int unit) {
  release_one(unit);
  if (const int e = units_[unit].expert_part; e >= 0) release_one(e);
}

void ZeroEngine::release_one(int unit) {
  Unit& u = units_[unit];
  if (cfg_.stage < 3 || u.len == 0) return;
  if (--u.refs > 0) return;
  point(u, &nn::Parameter::value, Tensor());
  for (nn::Parameter* p : u.params)
    if (p->half) p->half->data = Tensor();
  u.value = Tensor();
  u.half = Tensor();
  u.small = Tensor();
}

void ZeroEngine::gather_all(int root) {
  if (working_ || gather16_) {
    // The fp32 values from the master shards, each unit's f32 values pointed at them on
    // the root until release_all().
    for (size_t i = 0; i < units_.size(); ++i) {
      Unit& u = units_[i];
      if (u.len == 0) continue;
      start_gather(static_cast<int>(i), /*fp32=*/true);
      u.gather.wait();
      if (comm(i).rank() == root)
        point(u, &nn::Parameter::value, u.value);
      else
        u.value = Tensor();
    }
    return;
  }
  if (cfg_.stage < 3) return;
  // Same acquire order on every rank, so the gathers (and their prefetches) pair up.
  for (int u = 0; u < model_.num_units(); ++u) {
    acquire(u);
    for (const int i : {u, units_[u].expert_part})
      if (i >= 0 && comm(i).rank() != root) release_one(i);
  }
}

void ZeroEngine::release_all() {
  if (working_) {
    for (Unit& u : units_) {
      u.value = Tensor();
      point_working(u);
    }
    return;
  }
  if (gather16_) {  // gather_all's fp32 values (no unit is acquired between steps)
    for (Unit& u : units_) {
      u.value = Tensor();
      point(u, &nn::Parameter::value, Tensor());
    }
    return;
  }
  if (cfg_.stage < 3) return;
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].refs > 0) release_one(static_cast<int>(u));  // held on the root only
  drop_prefetches();
}

void ZeroEngine::drop_prefetches() {
  for (Unit& u : units_) {
    if (u.refs == 0 && gathered(u)) {
      u.gather.wait();
      u.gather_small.wait();
      u.value = Tensor();
      u.half = Tensor();
      u.packed = Tensor();
    }
  }
}

}  // namespace loom::parallel
