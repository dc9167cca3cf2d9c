#include "loom/nn/parameter.h"

#include <algorithm>

#include "loom/kernels/cpu/elementwise.h"
#include "loom/tensor/rng.h"
#include "loom/util/error.h"

namespace loom::nn {

namespace {
// p's shard as three nested extents of the full tensor, row-major: outer (the dimensions
// before `dim`) x parts x block (the block's rows times the trailing dimensions).
struct ShardGeometry {
  int64_t outer = 1, parts = 1, full_block = 1, local_block = 1, first = 0;
};

ShardGeometry geometry(const Parameter& p) {
  ShardGeometry g;
  if (!p.shard.sharded()) {
    g.full_block = g.local_block = shape_numel(p.shape);
    return g;
  }
  const int d = p.shard.dim;
  int64_t inner = 1;
  for (int i = 0; i < d; ++i) g.outer *= p.full_shape[i];
  for (size_t i = d + 1; i < p.full_shape.size(); ++i) inner *= p.full_shape[i];
  g.parts = p.shard.parts;
  g.full_block = p.full_shape[d] / p.shard.parts * inner;
  g.local_block = p.shard.size * inner;
  g.first = p.shard.offset * inner;
  return g;
}
}  // namespace

int64_t full_index(const Parameter& p, int64_t local) {
  const ShardGeometry g = geometry(p);
  const int64_t block = local / g.local_block;  // (outer index, part) flattened
  return block * g.full_block + g.first + local % g.local_block;
}

void shard_from_full(const Parameter& p, const float* full, float* local) {
  const ShardGeometry g = geometry(p);
  for (int64_t b = 0; b < g.outer * g.parts; ++b)
    std::copy_n(full + b * g.full_block + g.first, g.local_block, local + b * g.local_block);
}

void shard_to_full(const Parameter& p, const float* local, float* full) {
  const ShardGeometry g = geometry(p);
  for (int64_t b = 0; b < g.outer * g.parts; ++b)
    std::copy_n(local + b * g.local_block, g.local_block, full + b * g.full_block + g.first);
}

void for_full_runs(const Parameter& p, int64_t begin, int64_t end,
                   const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const ShardGeometry g = geometry(p);
  for (int64_t i = begin; i < end;) {
    const int64_t n = std::min(end - i, g.local_block - i % g.local_block);
    fn(i, i / g.local_block * g.full_block + g.first + i % g.local_block, n);
    i += n;
  }
}

Parameter* ParamStore::add(const std::string& name, const Shape& shape, ParamKind kind,
                           float init_std, float init_value, const ShardSpec& shard) {
  LOOM_CHECK(find(name) == nullptr, "parameter " + name + " declared twice");
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->full_shape = shape;
  p->shape = shape;
  p->shard = shard;
  p->kind = kind;
  p->trainable = kind != ParamKind::Buffer;
  if (shard.sharded()) {
    const int d = shard.dim;
    LOOM_CHECK(d < static_cast<int>(shape.size()) && shard.parts >= 1 &&
                   shape[d] % shard.parts == 0 && shard.size > 0 && shard.offset >= 0 &&
                   shard.offset + shard.size <= shape[d] / shard.parts,
               "parameter " + name + ": shard of dim " + std::to_string(d) + " (" +
                   std::to_string(shard.parts) + " parts, rows " + std::to_string(shard.offset) +
                   "+" + std::to_string(shard.size) + ") outside " + shape_str(shape));
    p->shape[d] = shard.parts * shard.size;
  }
  p->init_std = init_std;
  p->init_value = init_value;
  params_.push_back(std::move(p));
  return params_.back().get();
}

void ParamStore::materialize(const std::function<int(const Parameter&)>& group) {
  // Trainable values first, in the same order and at the same offsets as their gradients,
  // so [0, trainable_numel) of the value buffer lines up with the gradient buffer (what a
  // ZeRO shard of parameters, gradients and optimizer state indexes); frozen values after.
  std::vector<Parameter*> order;
  for (auto& p : params_) {
    LOOM_CHECK(!(p->quantized() && p->trainable),
               "parameter " + p->name + " is quantized and cannot be trained");
    if (p->trainable) order.push_back(p.get());
  }
  auto key = [&](const Parameter* p) { return std::pair{p->expert, group ? group(*p) : 0}; };
  std::stable_sort(order.begin(), order.end(),
                   [&](const Parameter* a, const Parameter* b) { return key(a) < key(b); });
  size_t total = 0;
  for (Parameter* p : order) {
    p->offset = p->grad_offset = total;
    total += shape_numel(p->shape);
  }
  const size_t total_grad = total;
  for (auto& p : params_) {
    if (p->trainable) continue;
    p->offset = total;
    if (p->has_f32()) total += shape_numel(p->shape);
  }
  Tensor values = Tensor::zeros({static_cast<int64_t>(total)});
  grads_ = Tensor::zeros({static_cast<int64_t>(total_grad)});
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const int64_t n = shape_numel(p.shape);
    Tensor old = p.value;
    p.value = p.has_f32() ? values.slice0(p.offset, p.offset + n).reshape(p.shape) : Tensor();
    if (i < n_materialized_ && old.defined() && p.value.defined()) p.value.copy_from(old);
    // The old layout's copy is dead once moved: its pages go back as the loop goes, so laying
    // out a loaded f32 model again (PEFT's parameters added) peaks near one store, not two.
    if (old.shares_storage(values_)) old.release_pages();
    p.grad =
        p.trainable ? grads_.slice0(p.grad_offset, p.grad_offset + n).reshape(p.shape) : Tensor();
  }
  values_ = values;
  n_fresh_ = n_materialized_;
  n_materialized_ = params_.size();
}

void ParamStore::drop_trainable_values() {
  size_t total = 0;
  for (auto& p : params_)
    if (!p->trainable && p->has_f32()) total += shape_numel(p->shape);
  Tensor values = Tensor::zeros({static_cast<int64_t>(total)});
  size_t at = 0;
  for (auto& p : params_) {
    Tensor old = p->value;
    if (p->trainable) {
      p->value = Tensor();
    } else if (p->has_f32()) {
      p->offset = at;
      p->value = values.slice0(at, at + shape_numel(p->shape)).reshape(p->shape);
      p->value.copy_from(old);
      at += shape_numel(p->shape);
    }
    if (old.shares_storage(values_)) old.release_pages();  // as materialize() does
  }
  values_ = values;
}

void ParamStore::drop_grads() {
  grads_ = Tensor::zeros({0});
  for (auto& p : params_) p->grad = Tensor();
}

void ParamStore::init_one(Parameter& p, uint64_t seed) {
  float* v = p.value.f32();
  const int64_t n = p.value.numel();
  const uint64_t stream = stream_id(p.name);
  const bool sharded = p.shard.sharded();
  if (p.init_bound > 0.0f) {
    const double b = p.init_bound;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = sharded ? full_index(p, i) : i;
      v[i] = static_cast<float>((2.0 * rng_uniform(seed, stream, e) - 1.0) * b);
    }
  } else if (p.init_std > 0.0f) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = sharded ? full_index(p, i) : i;
      v[i] = static_cast<float>(rng_normal(seed, stream, e) * p.init_std);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) v[i] = p.init_value;
  }
}

void ParamStore::init(uint64_t seed) {
  LOOM_CHECK(materialized(), "ParamStore::init() before materialize()");
  for (auto& p : params_)
    if (p->has_f32()) init_one(*p, seed);
}

void ParamStore::init_new(uint64_t seed) {
  LOOM_CHECK(materialized(), "ParamStore::init_new() before materialize()");
  for (size_t i = n_fresh_; i < params_.size(); ++i) init_one(*params_[i], seed);
}

void ParamStore::zero_grads() {
  if (grads_.defined()) kernels::zero(grads_.f32(), grads_.numel());
}

void ParamStore::share_from(const ParamStore& owner) {
  LOOM_CHECK(params_.size() == owner.params_.size(),
             "internal: an activation context declares " + std::to_string(params_.size()) +
                 " parameters, its stage " + std::to_string(owner.params_.size()));
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const Parameter& o = *owner.params_[i];
    LOOM_CHECK(p.name == o.name && p.shape == o.shape,
               "internal: activation context parameter " + p.name + " " + shape_str(p.shape) +
                   " is not its stage's " + o.name + " " + shape_str(o.shape));
    p.trainable = o.trainable;
    p.stage_copy = o.stage_copy;
    p.offset = o.offset;
    p.grad_offset = o.grad_offset;
    p.value = o.value;
    p.grad = o.grad;
    p.quant = o.quant;
    p.half = o.half;
  }
  values_ = owner.values_;
  grads_ = owner.grads_;
}

Parameter* ParamStore::find(const std::string& name) const {
  for (auto& p : params_)
    if (p->name == name) return p.get();
  return nullptr;
}

int64_t ParamStore::numel() const {
  int64_t n = 0;
  for (auto& p : params_) n += shape_numel(p->shape);
  return n;
}

int64_t ParamStore::value_bytes() const {
  int64_t n = 0;
  for (auto& p : params_)
    n += p->quantized()      ? static_cast<int64_t>(p->quant->bytes.size())
         : p->held_in_half() ? static_cast<int64_t>(p->half->data.nbytes())
                             : shape_numel(p->shape) * static_cast<int64_t>(sizeof(float));
  return n;
}

int64_t ParamStore::trainable_numel() const {
  int64_t n = 0;
  for (auto& p : params_)
    if (p->trainable) n += shape_numel(p->shape);
  return n;
}

}  // namespace loom::nn
