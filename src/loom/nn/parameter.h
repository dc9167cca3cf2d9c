// Parameters: logical name (Hugging Face's), shape, shard spec, value and gradient.
// Contract: modules declare parameters in their constructors; ParamStore::materialize()
// then lays all values out in one flat f32 buffer and all trainable gradients in another
// (the flat buffers are what optimizers, ZeRO partitioning and grad all-reduce work on).
// Parameter pointers stay valid for the store's lifetime.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/tensor/tensor.h"

namespace loom::nn {

// Which slice of the logical tensor this rank holds. dim == -1: the whole tensor.
// (Tensor parallel sets dim/offset; every layout saves and loads logical tensors.)
struct ShardSpec {
  int dim = -1;
  int64_t offset = 0;
};

// What a parameter is, for rules that depend on it (weight decay exclusions).
enum class ParamKind : uint8_t { Weight, Bias, Norm, Embedding };

struct Parameter {
  std::string name;  // logical name, e.g. "transformer.h.3.attn.c_attn.weight"
  Shape shape;       // local shape (== full_shape when unsharded)
  Shape full_shape;
  ShardSpec shard;
  bool trainable = true;
  ParamKind kind = ParamKind::Weight;
  float init_std = 0.0f;  // normal(0, init_std); 0 with init_value: constant fill
  float init_value = 0.0f;
  size_t offset = 0;       // element offset in the flat value buffer
  size_t grad_offset = 0;  // element offset in the flat grad buffer (trainable only)
  Tensor value;
  Tensor grad;  // undefined when frozen
};

class ParamStore {
 public:
  // Declares a parameter; init is normal(0, init_std) when init_std > 0, else init_value.
  Parameter* add(const std::string& name, const Shape& shape, ParamKind kind, float init_std,
                 float init_value = 0.0f);
  // Allocates the flat buffers and makes every value/grad a view into them.
  void materialize();
  // Fills every value from its init rule, keyed by (seed, name, element) so the result
  // does not depend on layout or order.
  void init(uint64_t seed);
  void zero_grads();

  bool materialized() const { return values_.defined(); }
  const std::vector<std::unique_ptr<Parameter>>& all() const { return params_; }
  Parameter* find(const std::string& name) const;  // nullptr if absent
  Tensor flat_values() const { return values_; }
  Tensor flat_grads() const { return grads_; }
  int64_t numel() const;
  int64_t trainable_numel() const;

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
  Tensor values_, grads_;
};

}  // namespace loom::nn
