#include "loom/nn/parameter.h"

#include "loom/kernels/cpu/elementwise.h"
#include "loom/tensor/rng.h"
#include "loom/util/error.h"

namespace loom::nn {

Parameter* ParamStore::add(const std::string& name, const Shape& shape, ParamKind kind,
                           float init_std, float init_value) {
  LOOM_CHECK(!materialized(), "parameter " + name + " declared after materialize()");
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

void ParamStore::materialize() {
  LOOM_CHECK(!materialized(), "ParamStore::materialize() called twice");
  size_t total = 0, total_grad = 0;
  for (auto& p : params_) {
    p->offset = total;
    total += shape_numel(p->shape);
    if (p->trainable) {
      p->grad_offset = total_grad;
      total_grad += shape_numel(p->shape);
    }
  }
  values_ = Tensor::zeros({static_cast<int64_t>(total)});
  grads_ = Tensor::zeros({static_cast<int64_t>(total_grad)});
  for (auto& p : params_) {
    p->value = values_.slice0(p->offset, p->offset + shape_numel(p->shape)).reshape(p->shape);
    if (p->trainable)
      p->grad =
          grads_.slice0(p->grad_offset, p->grad_offset + shape_numel(p->shape)).reshape(p->shape);
  }
}

void ParamStore::init(uint64_t seed) {
  LOOM_CHECK(materialized(), "ParamStore::init() before materialize()");
  for (auto& p : params_) {
    float* v = p->value.f32();
    const int64_t n = p->value.numel();
    if (p->init_std > 0.0f) {
      const uint64_t stream = stream_id(p->name);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i)
        v[i] = static_cast<float>(rng_normal(seed, stream, i) * p->init_std);
    } else {
      for (int64_t i = 0; i < n; ++i) v[i] = p->init_value;
    }
  }
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

int64_t ParamStore::trainable_numel() const {
  int64_t n = 0;
  for (auto& p : params_)
    if (p->trainable) n += shape_numel(p->shape);
  return n;
}

}  // namespace loom::nn
