// The residual wiring GPT-2 and the Llama family share (a pre-norm transformer block):
//   h   = x + ad1(attn(norm1(x)))
//   out = h + ad2(mlp(norm2(h)))
// ad1/ad2 are optional Houlsby adapters (PEFT), absent by default. The shapes are
// DecoderBlock's. Attn takes (x, Positions) and (x, Positions, kc, vc, past) for the cached
// pass; Norm and Mlp take x. Parameters are declared in the order norm1, norm2, attn, mlp
// (the Norm/Attn/Mlp types are built by the factories passed to the constructor, in that
// order: Hugging Face's order for GPT-2 and Llama).
// Tensor parallel: attention and MLP each begin with column-parallel layers and end with a
// row-parallel one (its reduce is g), so each is entered through f: backward all-reduces
// the gradient at their input once (nn/tensor_parallel.h). Norms and adapters are
// replicated.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/kernels/cpu/elementwise.h"
#include "loom/nn/decoder_block.h"
#include "loom/nn/tensor_parallel.h"

namespace loom::nn {

template <class Norm, class Attn, class Mlp>
class PreNormBlock final : public DecoderBlock {
 public:
  template <class MakeN1, class MakeN2, class MakeA, class MakeM>
  PreNormBlock(MakeN1 n1, MakeN2 n2, MakeA a, MakeM m, const TensorParallel& tp = {})
      : norm1_(n1()), norm2_(n2()), attn_(a()), mlp_(m()), tp_(tp) {}

  Attn& attn() { return attn_; }

  const Tensor& forward(const Tensor& x, const Positions& p) override {
    return finish(x, attn_.forward(norm1_.forward(x), p));
  }
  const Tensor& forward_cached(const Tensor& x, const Positions& p, const Tensor& kc,
                               const Tensor& vc, int64_t past) override {
    return finish(x, attn_.forward_cached(norm1_.forward(x), p, kc, vc, past));
  }

  void backward(const Tensor& dout, const Tensor& dx, Scratch& scratch) override {
    Tensor dh = scratch.zeros("block.dh", dout.shape());  // gradient at h
    dh.copy_from(dout);
    Tensor dn = scratch.zeros("block.dn", dout.shape());  // gradient at a norm's output
    mlp_.backward(through(mlp_adapter_.get(), dout, scratch), dn, scratch);
    copy_to_region_backward(tp_, dn);
    norm2_.backward(dn, dh);
    dn = scratch.zeros("block.dn", dout.shape());
    attn_.backward(through(attn_adapter_.get(), dh, scratch), dn, scratch);
    copy_to_region_backward(tp_, dn);
    norm1_.backward(dn, dx);
    kernels::add_inplace(dx.f32(), dh.f32(), dx.numel());
  }

  void linears(std::vector<Linear*>& out) override {
    for (Linear* l : attn_.linears()) out.push_back(l);
    for (Linear* l : mlp_.linears()) out.push_back(l);
  }

  void add_adapters(ParamStore& ps, const std::string& name, int64_t C,
                    const AdapterSpec& s) override {
    attn_adapter_ = std::make_unique<BottleneckAdapter>(ps, name + ".attn_adapter", C, s);
    mlp_adapter_ = std::make_unique<BottleneckAdapter>(ps, name + ".mlp_adapter", C, s);
  }

  void attach_prefix(KVPrefix* prefix, int64_t layer) override {
    attn_.attach_prefix(prefix, layer);
  }

 private:
  // x [B, T, C], attention output [B, T, C] -> the block's output (residuals, MLP, adapters).
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
  TensorParallel tp_;
  std::unique_ptr<BottleneckAdapter> attn_adapter_, mlp_adapter_;
  Tensor h_, out_;  // residual after attention, block output
};

}  // namespace loom::nn
