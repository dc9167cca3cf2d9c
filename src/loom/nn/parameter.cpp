#include "loom/nn/parameter.h"

#include <algorithm>

#include "loom/kernels/cpu/elementwise.h"
#include "loom/tensor/rng.h"
#include "loom/util/error.h"

namespace loom::nn {

Parameter* ParamStore::add(const std::string& name, const Shape& shape, ParamKind kind,
                           float init_std, float init_value) {
  LOOM_CHECK(find(name) == nullptr, "parameter " + name + " declared twice");
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->shape = shape;
  p->full_shape = shape;
  p->kind = kind;
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
  if (group)
    std::stable_sort(order.begin(), order.end(),
                     [&](const Parameter* a, const Parameter* b) { return group(*a) < group(*b); });
  size_t total = 0;
  for (Parameter* p : order) {
    p->offset = p->grad_offset = total;
    total += shape_numel(p->shape);
  }
  const size_t total_grad = total;
  for (auto& p : params_) {
    if (p->trainable) continue;
    p->offset = total;
    if (!p->quantized()) total += shape_numel(p->shape);
  }
  Tensor values = Tensor::zeros({static_cast<int64_t>(total)});
  grads_ = Tensor::zeros({static_cast<int64_t>(total_grad)});
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const int64_t n = shape_numel(p.shape);
    Tensor old = p.value;
    p.value = p.quantized() ? Tensor() : values.slice0(p.offset, p.offset + n).reshape(p.shape);
    if (i < n_materialized_ && old.defined() && p.value.defined()) p.value.copy_from(old);
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
    if (!p->trainable && !p->quantized()) total += shape_numel(p->shape);
  Tensor values = Tensor::zeros({static_cast<int64_t>(total)});
  size_t at = 0;
  for (auto& p : params_) {
    Tensor old = p->value;
    if (p->trainable || p->quantized()) {
      if (p->trainable) p->value = Tensor();
      continue;
    }
    p->offset = at;
    p->value = values.slice0(at, at + shape_numel(p->shape)).reshape(p->shape);
    p->value.copy_from(old);
    at += shape_numel(p->shape);
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
  if (p.init_bound > 0.0f) {
    const double b = p.init_bound;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      v[i] = static_cast<float>((2.0 * rng_uniform(seed, stream, i) - 1.0) * b);
  } else if (p.init_std > 0.0f) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      v[i] = static_cast<float>(rng_normal(seed, stream, i) * p.init_std);
  } else {
    for (int64_t i = 0; i < n; ++i) v[i] = p.init_value;
  }
}

void ParamStore::init(uint64_t seed) {
  LOOM_CHECK(materialized(), "ParamStore::init() before materialize()");
  for (auto& p : params_)
    if (!p->quantized()) init_one(*p, seed);
}

void ParamStore::init_new(uint64_t seed) {
  LOOM_CHECK(materialized(), "ParamStore::init_new() before materialize()");
  for (size_t i = n_fresh_; i < params_.size(); ++i) init_one(*params_[i], seed);
}

void ParamStore::zero_grads() {
  if (grads_.defined()) kernels::zero(grads_.f32(), grads_.numel());
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
    n += p->quantized() ? static_cast<int64_t>(p->quant->bytes.size())
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
