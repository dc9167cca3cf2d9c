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
// Sequence parallel: x, h and out are this rank's rows [N/tp, C] (N = B*T), and so are the
// norms' and adapters' inputs and outputs. A norm's output rows are gathered to [B, T, C]
// (gather_from_sequence: f's place) for attention or the MLP, whose row-parallel layer
// reduce-scatters back to rows (g's place). The norms and adapters then see only this
// rank's rows: backward sums their gradients over the group (SequencePartialGrads).
#pragma once

#include <memory>
#include <string>
#include <type_traits>
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
  Mlp& mlp() { return mlp_; }
  MoE* moe() override {
    if constexpr (std::is_same_v<Mlp, MoE>)
      return &mlp_;
    else
      return nullptr;
  }

  const Tensor& forward(const Tensor& x, const Positions& p) override {
    return finish(x, p, attn_.forward(enter(norm1_.forward(x), p, attn_in_), p));
  }
  const Tensor& forward_cached(const Tensor& x, const Positions& p, const Tensor& kc,
                               const Tensor& vc, int64_t past) override {
    return finish(x, p, attn_.forward_cached(norm1_.forward(x), p, kc, vc, past));
  }

  void backward(const Tensor& dout, const Tensor& dx, Scratch& scratch) override {
    SequencePartialGrads partial(tp_, replicated_params());
    // The sublayers' inputs are [B, T, C] (gathered rows under SP, where dout is rows).
    const Shape in = tp_.sequence_split() ? attn_in_.shape() : dout.shape();
    Tensor dh = scratch.zeros("block.dh", dout.shape());  // gradient at h
    dh.copy_from(dout);
    Tensor dn = scratch.zeros("block.dn", in);
    mlp_.backward(through(mlp_adapter_.get(), dout, scratch), dn, scratch);
    norm2_.backward(enter_backward(dn, dout.shape(), scratch), dh);
    dn = scratch.zeros("block.dn", in);
    attn_.backward(through(attn_adapter_.get(), dh, scratch), dn, scratch);
    norm1_.backward(enter_backward(dn, dout.shape(), scratch), dx);
    kernels::add_inplace(dx.f32(), dh.f32(), dx.numel());
    partial.sum_over_sequence();
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

  void release_activations() override {
    norm1_.release_activations();
    norm2_.release_activations();
    attn_.release_activations();
    mlp_.release_activations();
    for (auto* ad : {attn_adapter_.get(), mlp_adapter_.get()})
      if (ad) ad->release_activations();
    h_ = out_ = attn_in_ = mlp_in_ = Tensor();
  }

 private:
  // x [B, T, C], attention output [B, T, C] -> the block's output (residuals, MLP, adapters).
  // (Sequence parallel: all three are this rank's rows [N/tp, C].)
  const Tensor& finish(const Tensor& x, const Positions& p, const Tensor& attn_out) {
    ensure(h_, x.shape());
    ensure(out_, x.shape());
    const Tensor& a = attn_adapter_ ? attn_adapter_->forward(attn_out) : attn_out;
    kernels::add(h_.f32(), x.f32(), a.f32(), x.numel());
    const Tensor& m0 = mlp_.forward(enter(norm2_.forward(h_), p, mlp_in_));
    const Tensor& m = mlp_adapter_ ? mlp_adapter_->forward(m0) : m0;
    kernels::add(out_.f32(), h_.f32(), m.f32(), x.numel());
    return out_;
  }

  // A sublayer's input from a norm's output n: n itself (f's forward is the identity), or
  // under sequence parallel all ranks' rows of it gathered into `full` [B, T, C].
  const Tensor& enter(const Tensor& n, const Positions& p, Tensor& full) {
    if (!tp_.sequence_split()) return n;
    ensure(full, {p.batch, p.seq, n.dim(-1)});
    gather_from_sequence_forward(tp_, n, full);
    return full;
  }

  // The gradient at a norm's output (shape `rows`) from dn, the partial sums at its
  // sublayer's input: f's backward all-reduces dn in place; gather_from_sequence's
  // reduce-scatters it to this rank's rows.
  Tensor enter_backward(const Tensor& dn, const Shape& rows, Scratch& scratch) {
    if (!tp_.sequence_split()) {
      copy_to_region_backward(tp_, dn);
      return dn;
    }
    Tensor d = scratch.zeros("block.dn_rows", rows);
    gather_from_sequence_backward(tp_, dn, d);
    return d;
  }

  // Parameters replicated over the tp group (their gradients are partial under SP).
  std::vector<Parameter*> replicated_params() const {
    std::vector<Parameter*> out = norm1_.params();
    for (Parameter* p : norm2_.params()) out.push_back(p);
    for (const auto* ad : {attn_adapter_.get(), mlp_adapter_.get()})
      if (ad)
        for (Parameter* p : ad->params()) out.push_back(p);
    return out;
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
  Tensor h_, out_;           // residual after attention, block output
  Tensor attn_in_, mlp_in_;  // sequence parallel: the gathered norm outputs [B, T, C]
};

}  // namespace loom::nn
