#include "loom/nn/dropout.h"

#include <cmath>

#include "loom/tensor/rng.h"

namespace loom::nn {

namespace {
// murmur3's 32-bit finaliser: a bijection with full avalanche, in 32-bit multiplies that
// vectorise (the 64-bit mixer does not on AVX2: dropout over every LoRA input was ~10% of a
// SmolLM2 LoRA step with it).
inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}
}  // namespace

DropoutMask::DropoutMask(float p, const DropoutContext& ctx, uint64_t stream, int64_t col0)
    : keep_scale_(1.0f / (1.0f - p)),
      key_(rng_u64(ctx.seed + static_cast<uint64_t>(ctx.step), stream, 0)),
      first_row_(ctx.first_row),
      col0_(col0) {
  const double t = std::ldexp(static_cast<double>(p), 32);
  threshold_ = t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

void DropoutMask::row_at(int64_t global_row, float* v, int64_t width) const {
  const auto row_key = static_cast<uint32_t>(mix64(key_ + static_cast<uint64_t>(global_row)));
  // Locals, not members, in the loop: v could alias keep_scale_, and GCC then keeps the
  // loop scalar (it was 9% of a LoRA step).
  const auto c0 = static_cast<uint32_t>(col0_);
  const uint32_t threshold = threshold_;
  const float keep_scale = keep_scale_;
  for (int64_t i = 0; i < width; ++i) {
    const uint32_t h = fmix32(row_key ^ ((c0 + static_cast<uint32_t>(i)) * 0x9E3779B9u));
    v[i] = h < threshold ? 0.0f : v[i] * keep_scale;
  }
}

void dropout_apply(float* v, int64_t rows, int64_t width, float p, const DropoutContext& ctx,
                   uint64_t stream, int64_t col0) {
  const DropoutMask mask(p, ctx, stream, col0);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < rows; ++n) mask.row(n, v + n * width, width);
}

}  // namespace loom::nn
