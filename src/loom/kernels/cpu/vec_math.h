// exp and tanh written so that GCC vectorises the loops that call them (libm's expf and
// tanhf are scalar calls without -ffast-math). That needs -fno-trapping-math (CMakeLists):
// without it GCC keeps the clamps below as branches and the whole loop scalar. Accuracy: exp within
// ~2 ulp over
// [-87, 88] (inputs outside are clamped: exp(-inf) gives ~1e-38, not 0); tanh within
// ~1e-7 absolute. That is well inside the 1e-4 parity the golden tests demand.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace loom::kernels {

// No std::floor / std::fmin here: GCC keeps those as scalar calls without -ffast-math.
inline float vexp(float x) {
  x = x > 88.0f ? 88.0f : x;
  x = x < -87.0f ? -87.0f : x;  // also maps -inf to -87
  // x = n ln2 + r, |r| <= ln2 / 2; exp(x) = 2^n * exp(r), exp(r) by its Taylor series to r^6.
  // n = round(x / ln2) by the 1.5 * 2^23 trick (exact in round-to-nearest mode).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

inline float vtanh(float x) { return 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f); }

// The CPU's float vector (GCC's vector extension), for the kernels that keep their
// accumulators in registers (skinny.cpp, attention_tiles.cpp): 16 floats (one zmm) where the
// build targets AVX-512, else 8 (one ymm; two xmm without AVX).
#if defined(__AVX512F__)
constexpr int kVecWidth = 16;
#else
constexpr int kVecWidth = 8;
#endif
typedef float vf __attribute__((vector_size(kVecWidth * sizeof(float))));
inline vf loadv(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void storev(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
// Its lanes' sum, in a fixed order (pairwise).
inline float hsum(vf v) {
  float lane[kVecWidth];
  storev(lane, v);
  for (int w = kVecWidth / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) lane[i] += lane[i + w];
  return lane[0];
}

}  // namespace loom::kernels
