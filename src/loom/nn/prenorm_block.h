// The residual wiring GPT-2 and the Llama family share (a pre-norm transformer block):
//   h   = x + ad1(attn(norm1(x)))
//   out = h + ad2(mlp(norm2(h)))
// ad1/ad2 are optional Houlsby adapters (PEFT), absent by default. The attention call
// differs per architecture (rotary tables, KV cache), so a model's block runs it and
// hands its output to finish():  forward(x) = finish(x, attn().forward(norm1().forward(x)))
//   finish  : x [B, T, C], attention output [B, T, C] -> out [B, T, C] (owned by the block)
//   backward: dout -> dx (dx zeroed by the caller; written with +=)
// Parameters are declared in the order norm1, norm2, attn, mlp (the Norm/Attn/Mlp types
// are built by the factories passed to the constructor, in that order).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/kernels/cpu/elementwise.h"
#include "loom/nn/bottleneck_adapter.h"
#include "loom/nn/buffers.h"
#include "loom/nn/linear.h"

namespace loom::nn {

template <class Norm, class Attn, class Mlp>
class PreNormBlock {
 public:
  template <class MakeN1, class MakeN2, class MakeA, class MakeM>
  PreNormBlock(MakeN1 n1, MakeN2 n2, MakeA a, MakeM m)
      : norm1_(n1()), norm2_(n2()), attn_(a()), mlp_(m()) {}

  Norm& norm1() { return norm1_; }
  Attn& attn() { return attn_; }

  const Tensor& finish(const Tensor& x, const Tensor& attn_out) {
    ensure(h_, x.shape());
    ensure(out_, x.shape());
    const Tensor& a = attn_adapter_ ? attn_adapter_->forward(attn_out) : attn_out;
    kernels::add(h_.f32(), x.f32(), a.f32(), x.numel());
    const Tensor& m0 = mlp_.forward(norm2_.forward(h_));
    const Tensor& m = mlp_adapter_ ? mlp_adapter_->forward(m0) : m0;
    kernels::add(out_.f32(), h_.f32(), m.f32(), x.numel());
    return out_;
  }

  void backward(const Tensor& dout, const Tensor& dx, Scratch& scratch) {
    Tensor dh = scratch.zeros("block.dh", dout.shape());  // gradient at h
    dh.copy_from(dout);
    Tensor dn = scratch.zeros("block.dn", dout.shape());  // gradient at a norm's output
    mlp_.backward(through(mlp_adapter_.get(), dout, scratch), dn, scratch);
    norm2_.backward(dn, dh);
    dn = scratch.zeros("block.dn", dout.shape());
    attn_.backward(through(attn_adapter_.get(), dh, scratch), dn, scratch);
    norm1_.backward(dn, dx);
    kernels::add_inplace(dx.f32(), dh.f32(), dx.numel());
  }

  void linears(std::vector<Linear*>& out) {
    for (Linear* l : attn_.linears()) out.push_back(l);
    for (Linear* l : mlp_.linears()) out.push_back(l);
  }

  void add_adapters(ParamStore& ps, const std::string& name, int64_t C, const AdapterSpec& s) {
    attn_adapter_ = std::make_unique<BottleneckAdapter>(ps, name + ".attn_adapter", C, s);
    mlp_adapter_ = std::make_unique<BottleneckAdapter>(ps, name + ".mlp_adapter", C, s);
  }

 private:
  // The gradient at a sublayer's output, given the gradient at its adapter's output.
  static Tensor through(BottleneckAdapter* ad, const Tensor& dy, Scratch& scratch) {
    if (!ad) return dy;
    Tensor d = scratch.zeros("block.dsub", dy.shape());
    ad->backward(dy, d, scratch);
    return d;
  }

  Norm norm1_, norm2_;
  Attn attn_;
  Mlp mlp_;
  std::unique_ptr<BottleneckAdapter> attn_adapter_, mlp_adapter_;
  Tensor h_, out_;  // residual after attention, block output
};

}  // namespace loom::nn
