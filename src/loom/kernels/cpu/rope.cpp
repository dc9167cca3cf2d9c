#include "loom/kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>

#include "loom/util/profile.h"

namespace loom::kernels {

double yarn_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

double rope_attention_factor(const RopeScaling& s) {
  if (s.type != "yarn") return 1.0;
  if (s.attention_factor > 0.0) return s.attention_factor;
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

std::vector<float> rope_inv_freq(int64_t D, double theta, const RopeScaling& s) {
  std::vector<float> f(D / 2);
  for (int64_t i = 0; i < D / 2; ++i) {
    // transformers computes base ** (2i / D) in float32; float32 here too.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(D);
    f[i] = 1.0f / std::pow(static_cast<float>(theta), expo);
  }
  if (s.type == "yarn") {
    // Frequencies past the ramp keep their value (extrapolation), those before it are
    // divided by the factor (interpolation), blended linearly across [low, high] dims.
    const double old = static_cast<double>(s.original_max_position_embeddings);
    auto dim_at = [&](double rotations) {
      return D * std::log(old / (rotations * 2.0 * M_PI)) / (2.0 * std::log(theta));
    };
    double low = dim_at(s.beta_fast), high = dim_at(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(D - 1));
    if (low == high) high += 0.001;
    const float factor = static_cast<float>(s.factor);
    for (int64_t i = 0; i < D / 2; ++i) {
      const float ramp = std::clamp(
          (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
          1.0f);
      const float extrapolation = 1.0f - ramp;
      const float pos_freq =
          std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(D));
      f[i] =
          1.0f / (factor * pos_freq) * (1.0f - extrapolation) + (1.0f / pos_freq) * extrapolation;
    }
  } else if (s.type == "linear") {
    for (auto& x : f) x = static_cast<float>(x / s.factor);
  } else if (s.type == "llama3") {
    const double old = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old / s.low_freq_factor, high_wavelen = old / s.high_freq_factor;
    for (auto& x : f) {
      const double wavelen = 2.0 * M_PI / x;
      if (wavelen < high_wavelen) continue;  // high frequencies: unchanged
      if (wavelen > low_wavelen) {
        x = static_cast<float>(x / s.factor);
      } else {  // smooth blend between the two regimes
        const double smooth =
            (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        x = static_cast<float>((1.0 - smooth) * x / s.factor + smooth * x);
      }
    }
  }
  return f;
}

void rope_tables(float* cos_t, float* sin_t, const int32_t* pos, int64_t N,
                 const std::vector<float>& inv_freq, float scale) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  for (int64_t t = 0; t < N; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(pos[t]) * inv_freq[i];  // float32 like transformers
      cos_t[t * half + i] = std::cos(a) * scale;
      sin_t[t * half + i] = std::sin(a) * scale;
    }
}

namespace {
template <bool kInverse>
void rotate(float* x, const float* cos_t, const float* sin_t, int64_t N, int64_t H, int64_t D,
            int64_t stride, int64_t head_stride) {
  prof::ScopedPhase ph(prof::Phase::Attention);
  const int64_t half = D / 2, hs = head_stride > 0 ? head_stride : D;
  const float sign = kInverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* c = cos_t + n * half;
    const float* s = sin_t + n * half;
    for (int64_t h = 0; h < H; ++h) {
      float* v = x + n * stride + h * hs;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], bb = v[i + half], sn = sign * s[i];
        v[i] = a * c[i] - bb * sn;
        v[i + half] = bb * c[i] + a * sn;
      }
    }
  }
}
}  // namespace

void rope_forward(float* x, const float* cos_t, const float* sin_t, int64_t N, int64_t H, int64_t D,
                  int64_t stride, int64_t head_stride) {
  rotate<false>(x, cos_t, sin_t, N, H, D, stride, head_stride);
}

void rope_backward(float* dx, const float* cos_t, const float* sin_t, int64_t N, int64_t H,
                   int64_t D, int64_t stride, int64_t head_stride) {
  rotate<true>(dx, cos_t, sin_t, N, H, D, stride, head_stride);
}

}  // namespace loom::kernels
