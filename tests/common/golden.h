// Reading golden fixtures (tests/fixtures/<model>/golden.safetensors, made by the scripts
// in scripts/) and comparing against them.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/safetensors.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/models/causal_lm.h"

namespace loom::test {

namespace fs = std::filesystem;

struct Golden {
  io::SafetensorsFile file;
  explicit Golden(const fs::path& dir)
      : file(io::SafetensorsFile::open(dir / "golden.safetensors")) {}

  const io::StTensorView& get(const std::string& name) const {
    const io::StTensorView* t = file.find(name);
    if (!t) throw Error("golden.safetensors has no tensor " + name);
    return *t;
  }
  std::vector<float> f32(const std::string& name) const {
    const auto& t = get(name);
    EXPECT_EQ(t.dtype, io::StDType::F32) << name;
    std::vector<float> v(t.numel());
    std::memcpy(v.data(), t.data.data(), v.size() * 4);
    return v;
  }
  std::vector<int32_t> ids(const std::string& name) const {
    const auto& t = get(name);
    EXPECT_EQ(t.dtype, io::StDType::I64) << name;
    std::vector<int32_t> v(t.numel());
    const int64_t* p = reinterpret_cast<const int64_t*>(t.data.data());
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(p[i]);
    return v;
  }
  double meta(const std::string& key) const { return std::stod(file.metadata().at(key)); }
};

inline Tensor i32_tensor(const std::vector<int32_t>& v, const Shape& shape) {
  Tensor t = Tensor::zeros(shape, DType::I32);
  std::copy(v.begin(), v.end(), t.i32());
  return t;
}

// Our [out, in] parameter in HF's layout (Conv1D stores [in, out]).
inline std::vector<float> hf_layout(const models::CausalLM& m, const nn::Parameter& p,
                                    const float* v) {
  std::vector<float> out(v, v + p.value.numel());
  if (m.hf_transposed(p)) {
    const int64_t rows = p.shape[0], cols = p.shape[1];
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t i = 0; i < cols; ++i) out[i * rows + o] = v[o * cols + i];
  }
  return out;
}

// Checks one forward/backward of the model in `dir` against its golden file: logits max
// abs error, loss, and every parameter's gradient (relative L2 error).
inline void check_logits_loss_grads(const fs::path& dir, double logit_tol = 1e-4,
                                    double loss_tol = 1e-5, double grad_tol = 1e-4) {
  Golden g(dir);
  auto model = io::load_hf_model(dir);
  const auto& shape = g.get("input_ids").shape;
  const int64_t B = shape[0], T = shape[1];
  Tensor ids = i32_tensor(g.ids("input_ids"), {B, T});
  Tensor tg = i32_tensor(g.ids("targets"), {B, T});
  const Tensor& logits = model->forward(ids);
  std::vector<float> ref = g.f32("logits");
  ASSERT_EQ(logits.numel(), static_cast<int64_t>(ref.size()));
  double max_abs = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    max_abs = std::max(max_abs, std::fabs(double(logits.f32()[i]) - ref[i]));
  EXPECT_LE(max_abs, logit_tol) << "logits max abs error";
  const int64_t n = kernels::count_targets(tg.i32(), B * T);
  auto check_loss_and_grads = [&](const char* head) {
    model->params().zero_grads();
    const double loss = model->backward(tg, 1.0f / n) / n;
    EXPECT_NEAR(loss, g.f32("loss")[0], loss_tol) << head;
    for (auto& p : model->params().all()) {
      if (!p->trainable) continue;  // buffers (DeepSeek-V3's routing bias) have no gradient
      std::vector<float> ours = hf_layout(*model, *p, p->grad.f32());
      std::vector<float> theirs = g.f32("grad." + p->name);
      ASSERT_EQ(ours.size(), theirs.size()) << p->name;
      EXPECT_LE(rel_err(ours.data(), theirs.data(), ours.size()), grad_tol)
          << "grad of " << p->name << ", " << head;
    }
  };
  check_loss_and_grads("whole head");
  // The chunked head training runs (5 token rows at a time: chunks cross sequences, the
  // last one is partial) against the same reference; its evaluation sums equal the whole
  // head's to fp32 rounding (a chunk's logits come from a GEMM of fewer rows, which OpenBLAS
  // may block differently).
  std::vector<double> whole(B), chunked(B);
  model->forward(ids);
  model->loss_sums(tg, whole.data());
  models::ActivationCheckpointing ac;
  ac.loss_chunk_rows = 5;
  model->set_activation_checkpointing(ac);
  EXPECT_FALSE(model->forward(ids).defined()) << "a chunked head returns no logits";
  model->loss_sums(tg, chunked.data());
  for (int64_t b = 0; b < B; ++b) EXPECT_NEAR(chunked[b], whole[b], 1e-6 * std::fabs(whole[b]));
  model->forward(ids);
  check_loss_and_grads("head in chunks of 5 rows");
}

}  // namespace loom::test
