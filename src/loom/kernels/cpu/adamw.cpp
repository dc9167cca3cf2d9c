#include "loom/kernels/cpu/adamw.h"

#include <cmath>

#include "loom/util/profile.h"

namespace loom::kernels {

namespace {
// The update, the 16-bit copy's rounding R (none: 0, bf16: 1, fp16: 2) and the gradient's
// clearing Z (f32 gradients only) as constants so each loop vectorises without a branch.
template <int R, bool Z, typename G>
void update(float* p, G g, float* m, float* v, uint16_t* half, int64_t n, const AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  const float step_size = static_cast<float>(h.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - h.lr * h.weight_decay;
  const float b1 = h.beta1, b2 = h.beta2, eps = h.eps, gs = h.grad_scale;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = widen(g, i) * gs;
    if constexpr (Z) g[i] = 0.0f;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    p[i] = pi;
    if constexpr (R == 1) half[i] = to_bf16(pi);
    if constexpr (R == 2) half[i] = to_f16(pi);
  }
}

template <bool Z, typename G>
void dispatch(float* p, G g, float* m, float* v, int64_t n, const AdamWHyper& h, HalfOut half) {
  if (!half.data) return update<0, Z>(p, g, m, v, nullptr, n, h);
  if (half.format == Half::bf16) return update<1, Z>(p, g, m, v, half.data, n, h);
  update<2, Z>(p, g, m, v, half.data, n, h);
}
}  // namespace

void adamw_update(float* p, float* g, float* m, float* v, int64_t n, const AdamWHyper& h,
                  HalfOut half, bool clear_grad) {
  prof::ScopedPhase ph(prof::Phase::Optimizer);
  if (clear_grad) return dispatch<true>(p, g, m, v, n, h, half);
  dispatch<false>(p, g, m, v, n, h, half);
}

void adamw_update(float* p, const uint16_t* g, Half g_format, float* m, float* v, int64_t n,
                  const AdamWHyper& h, HalfOut half) {
  prof::ScopedPhase ph(prof::Phase::Optimizer);
  if (g_format == Half::bf16) return dispatch<false>(p, HalfPtr<Half::bf16>{g}, m, v, n, h, half);
  dispatch<false>(p, HalfPtr<Half::f16>{g}, m, v, n, h, half);
}

}  // namespace loom::kernels
