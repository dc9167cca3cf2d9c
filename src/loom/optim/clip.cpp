#include "loom/optim/clip.h"

#include <algorithm>

#include "loom/kernels/cpu/bf16.h"
#include "loom/util/profile.h"

namespace loom::optim {

namespace {
template <typename G>
double squares(G g, int64_t n) {
  constexpr int64_t kBlock = 8192;
  double s = 0.0;
  // Blocks across threads, an explicit simd reduction inside (a plain `parallel for
  // reduction` over doubles is not vectorised without -ffast-math).
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    double part = 0.0;
#pragma omp simd reduction(+ : part)
    for (int64_t i = b0; i < b1; ++i) {
      const double x = kernels::widen(g, i);
      part += x * x;
    }
    s += part;
  }
  return s;
}
}  // namespace

double sum_of_squares(const Tensor& flat) {
  prof::ScopedPhase ph(prof::Phase::Optimizer);
  const int64_t n = flat.numel();
  const auto* h = static_cast<const uint16_t*>(flat.raw());
  if (flat.dtype() == DType::BF16) return squares(kernels::HalfPtr<kernels::Half::bf16>{h}, n);
  if (flat.dtype() == DType::F16) return squares(kernels::HalfPtr<kernels::Half::f16>{h}, n);
  return squares(flat.f32(), n);
}

float clip_coefficient(double global_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  const double coef = max_norm / (global_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

}  // namespace loom::optim
