// Embedding table [rows, C]: ids [N] -> out [N, C]. Backward scatters into the table's grad.
#pragma once

#include <string>

#include "loom/nn/parameter.h"

namespace loom::nn {

class Embedding {
 public:
  Embedding(ParamStore& ps, const std::string& name, int64_t rows, int64_t C, float init_std);
  // out [N, C] = table[ids] (accumulate: out += table[ids]).
  void forward(const int32_t* ids, int64_t N, const Tensor& out, bool accumulate);
  void backward(const int32_t* ids, int64_t N, const Tensor& dout);
  Parameter* weight() const { return w_; }

 private:
  Parameter* w_;
  int64_t C_;
};

}  // namespace loom::nn
