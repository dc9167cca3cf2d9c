// Products with a frozen weight kept in ggml blocks equal BLAS on the dequantized matrix,
// and a model whose weights stay quantized gives the logits of the same model dequantized.
#include <gtest/gtest.h>

#include <cstring>

#include "common/test_util.h"
#include "loom/kernels/cpu/matmul.h"
#include "loom/kernels/cpu/qmatmul.h"

namespace loom {
namespace {

// Q8_0 blocks of `w` [rows, cols]: per 32 values an f16 scale d = max|x| / 127 and 32 int8
// q = round(x / d), as ggml's reference quantizer.
QuantMatrix quantize_q8_0(const Tensor& w) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  QuantMatrix q = QuantMatrix::empty(GgmlType::Q8_0, rows, cols);
  std::byte* out = q.bytes.data();
  for (int64_t b = 0; b < rows * cols / 32; ++b, out += 34) {
    const float* x = w.f32() + b * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const _Float16 d = static_cast<_Float16>(amax / 127.0f);
    std::memcpy(out, &d, 2);
    const float id = d == 0 ? 0.0f : 1.0f / static_cast<float>(d);
    for (int i = 0; i < 32; ++i)
      reinterpret_cast<int8_t*>(out + 2)[i] = static_cast<int8_t>(std::lround(x[i] * id));
  }
  return q;
}

TEST(QMatmul, EqualsBlasOnTheDequantizedMatrix) {
  // 300 rows of 4096: two tiles of the kernel's 2^20-float row blocking (256 rows, then a
  // ragged 44).
  const int64_t N = 7, C = 4096, OC = 300;
  Tensor w = Tensor::zeros({OC, C}), x = Tensor::zeros({N, C}), b = Tensor::zeros({OC});
  test::fill_normal(w, 1, 0.1f);
  test::fill_normal(x, 2);
  test::fill_normal(b, 3);
  QuantMatrix q = quantize_q8_0(w);
  Tensor deq = Tensor::zeros({OC, C});
  q.dequantize_rows(0, OC, deq.f32());
  Tensor y = Tensor::zeros({N, OC}), ref = Tensor::zeros({N, OC});
  kernels::qmatmul_forward(y.f32(), x.f32(), q, b.f32(), N);
  kernels::matmul_forward(ref.f32(), x.f32(), deq.f32(), b.f32(), N, C, OC);
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.f32()[i], ref.f32()[i], 1e-4);
  // Accumulating (a LoRA branch already in y): y + x W^T + b, bias included once.
  Tensor acc = Tensor::zeros({N, OC});
  test::fill_normal(acc, 6);
  std::vector<float> start(acc.f32(), acc.f32() + acc.numel());
  kernels::qmatmul_forward(acc.f32(), x.f32(), q, b.f32(), N, /*accumulate=*/true);
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(acc.f32()[i], start[i] + ref.f32()[i], 1e-4);
  std::copy(start.begin(), start.end(), acc.f32());
  kernels::matmul_forward(acc.f32(), x.f32(), deq.f32(), b.f32(), N, C, OC, /*accumulate=*/true);
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(acc.f32()[i], start[i] + ref.f32()[i], 1e-4);
  Tensor dy = Tensor::zeros({N, OC}), dx = Tensor::zeros({N, C}), dref = Tensor::zeros({N, C});
  test::fill_normal(dy, 4);
  test::fill_normal(dx, 5);
  dref.copy_from(dx);  // both accumulate
  kernels::qmatmul_backward(dx.f32(), dy.f32(), q, N);
  kernels::matmul_backward(dref.f32(), nullptr, nullptr, dy.f32(), x.f32(), deq.f32(), N, C, OC);
  for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_NEAR(dx.f32()[i], dref.f32()[i], 1e-4);
  // Embedding rows: exact.
  std::vector<int32_t> ids = {5, 0, 299, 5};
  Tensor e = Tensor::zeros({4, C});
  kernels::qembedding_forward(e.f32(), ids.data(), 4, q, false);
  for (int n = 0; n < 4; ++n)
    ASSERT_EQ(0, std::memcmp(e.f32() + n * C, deq.f32() + ids[n] * C, C * sizeof(float)));
  ids[1] = 300;
  EXPECT_THROW(kernels::qembedding_forward(e.f32(), ids.data(), 4, q, false), Error);
}

}  // namespace
}  // namespace loom
