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

void dropout_apply(float* v, int64_t rows, int64_t width, float p, const DropoutContext& ctx,
                   uint64_t stream, int64_t col0) {
  const float keep_scale = 1.0f / (1.0f - p);
  // Dropped when the element's hash is below p * 2^32.
  const double t = std::ldexp(static_cast<double>(p), 32);
  const uint32_t threshold = t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
  const uint64_t key = rng_u64(ctx.seed + static_cast<uint64_t>(ctx.step), stream, 0);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < rows; ++n) {
    const auto row_key =
        static_cast<uint32_t>(mix64(key + static_cast<uint64_t>(ctx.first_row + n)));
    const auto c0 = static_cast<uint32_t>(col0);
    float* row = v + n * width;
    for (int64_t i = 0; i < width; ++i) {
      const uint32_t h = fmix32(row_key ^ ((c0 + static_cast<uint32_t>(i)) * 0x9E3779B9u));
      row[i] = h < threshold ? 0.0f : row[i] * keep_scale;
    }
  }
}

}  // namespace loom::nn
