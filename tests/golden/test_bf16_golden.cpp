// Golden bf16: Loom's forward with the tiny GPT-2 and Llama fixtures held in bf16
// (loom generate --dtype bf16, and the products of bf16 training) against transformers
// running the same folders with dtype=torch.bfloat16 (scripts/make_bf16_fixtures.py).
// Tolerance, and why: the two do not round the same things. transformers in bf16 rounds
// every weight and every activation (residual stream, norm outputs, attention scores) to
// bf16 after each op; Loom rounds the weights and each product's operands and keeps the
// rest in fp32 (torch.autocast's rule). Neither is the other's exact answer; both are bf16
// approximations of the fp32 model, each off by bf16's 2^-8 relative step accumulated over
// the layers. So: Loom's bf16 logits must be no further from fp32 than transformers' bf16
// logits are (relative L2, measured: transformers 7.0e-3 on both fixtures), and Loom's and
// transformers' bf16 logits within twice that of each other. A wrong product (weights not
// rounded, a stale copy, a transposed operand) is off by far more than 1e-2.
#include <gtest/gtest.h>

#include "common/golden.h"
#include "loom/io/model_loader.h"
#include "loom/nn/weight_ops.h"

namespace loom {
namespace {

double rel_l2(const float* a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

void check_bf16(const std::string& name) {
  const std::filesystem::path dir = test::fixture_dir() / name;
  io::SafetensorsFile g = io::SafetensorsFile::open(dir / "golden_bf16.safetensors");
  auto f32 = [&](const char* k) {
    const io::StTensorView* t = g.find(k);
    EXPECT_NE(t, nullptr) << k;
    std::vector<float> v(t->numel());
    std::memcpy(v.data(), t->data.data(), v.size() * 4);
    return v;
  };
  const std::vector<float> hf_bf16 = f32("logits_bf16"), hf_fp32 = f32("logits_fp32");
  const io::StTensorView* ids_view = g.find("input_ids");
  ASSERT_NE(ids_view, nullptr);
  const int64_t B = ids_view->shape[0], T = ids_view->shape[1];
  Tensor ids = Tensor::zeros({B, T}, DType::I32);
  const int64_t* src = reinterpret_cast<const int64_t*>(ids_view->data.data());
  for (int64_t i = 0; i < B * T; ++i) ids.i32()[i] = static_cast<int32_t>(src[i]);

  auto model = io::load_model(dir.string());
  const Tensor& fp32 = model->forward(ids);
  EXPECT_LE(rel_l2(fp32.f32(), hf_fp32), 1e-5) << name << ": the fp32 forward";
  for (auto& p : model->params().all()) p->trainable = false;
  nn::hold_frozen_in_half(model->params(), kernels::Half::bf16);
  const Tensor& bf16 = model->forward(ids);
  ASSERT_EQ(static_cast<size_t>(bf16.numel()), hf_bf16.size());
  const double hf_off = rel_l2(hf_bf16.data(), hf_fp32);
  const double loom_off = rel_l2(bf16.f32(), hf_fp32);
  const double between = rel_l2(bf16.f32(), hf_bf16);
  std::printf(
      "%s: relative L2 from fp32: transformers bf16 %.3e, loom bf16 %.3e; loom bf16 "
      "from transformers bf16 %.3e\n",
      name.c_str(), hf_off, loom_off, between);
  EXPECT_GT(hf_off, 1e-3) << "the fixture's bf16 logits are not bf16";
  EXPECT_GT(loom_off, 1e-4) << name << ": Loom's forward did not run in bf16";
  EXPECT_LE(loom_off, hf_off) << name;
  EXPECT_LE(between, 2 * hf_off) << name;
}

TEST(GoldenBf16, Gpt2AgainstTransformersInBf16) { check_bf16("gpt2_tiny"); }
TEST(GoldenBf16, LlamaAgainstTransformersInBf16) { check_bf16("llama_tiny"); }

}  // namespace
}  // namespace loom
