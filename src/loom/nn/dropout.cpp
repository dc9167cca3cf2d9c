#include "loom/nn/dropout.h"

#include "loom/tensor/rng.h"

namespace loom::nn {

void dropout_apply(float* v, int64_t rows, int64_t width, float p, const DropoutContext& ctx,
                   uint64_t stream, int64_t col0, int64_t full_width) {
  const float keep_scale = 1.0f / (1.0f - p);
  const uint64_t seed = ctx.seed + static_cast<uint64_t>(ctx.step);
  const auto stride = static_cast<uint64_t>(full_width > 0 ? full_width : width);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < rows; ++n) {
    const uint64_t base =
        static_cast<uint64_t>(ctx.first_row + n) * stride + static_cast<uint64_t>(col0);
    float* row = v + n * width;
    for (int64_t i = 0; i < width; ++i)
      row[i] = rng_uniform(seed, stream, base + i) < p ? 0.0f : row[i] * keep_scale;
  }
}

}  // namespace loom::nn
