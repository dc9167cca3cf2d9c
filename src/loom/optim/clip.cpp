#include "loom/optim/clip.h"

#include <algorithm>

#include "loom/util/profile.h"

namespace loom::optim {

double sum_of_squares(const Tensor& flat) {
  prof::ScopedPhase ph(prof::Phase::Optimizer);
  const float* g = flat.f32();
  const int64_t n = flat.numel();
  constexpr int64_t kBlock = 8192;
  double s = 0.0;
  // Blocks across threads, an explicit simd reduction inside (a plain `parallel for
  // reduction` over doubles is not vectorised without -ffast-math).
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    double part = 0.0;
#pragma omp simd reduction(+ : part)
    for (int64_t i = b0; i < b1; ++i) part += static_cast<double>(g[i]) * g[i];
    s += part;
  }
  return s;
}

float clip_coefficient(double global_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  const double coef = max_norm / (global_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

}  // namespace loom::optim
