// exp and tanh written so that GCC vectorises the loops that call them (libm's expf and
// tanhf are scalar calls without -ffast-math), and the CPU's float vector with an exp of its
// own for kernels that hold their values in registers. The scalar forms need
// -fno-trapping-math (CMakeLists): without it GCC keeps the clamps as branches and the whole
// loop scalar. Accuracy: exp within ~2 ulp over [-87, 88] (inputs outside are clamped:
// exp(-inf) gives ~1e-38, not 0); tanh within ~1e-7 absolute. That is well inside the 1e-4
// parity the golden tests demand.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace loom::kernels {

// exp(x) = p 2^n for x clamped to [-87, 88] (so -inf maps to -87): x = n ln2 + r with
// |r| <= ln2 / 2, p = exp(r) by its Taylor series to r^6, n = round(x / ln2) by the 1.5 * 2^23
// trick (exact in round-to-nearest mode). V is float or the float vector vf below: the same
// operations in the same order for both, so the vector vexp is the scalar one lane by lane,
// bit for bit. No std::floor / std::fmin: GCC keeps those as scalar calls without
// -ffast-math.
template <class V>
inline V exp_parts(V x, V& n) {
  const V hi = V{} + 88.0f, lo = V{} - 87.0f;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const V r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  V p = V{} + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p;
}

inline float vexp(float x) {
  float n;
  const float p = exp_parts(x, n);
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
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
typedef int32_t vi __attribute__((vector_size(kVecWidth * sizeof(int32_t))));
// Lane indices 0, 1, ..., kVecWidth - 1.
inline vi lane_index() {
  vi v;
  for (int i = 0; i < kVecWidth; ++i) v[i] = i;
  return v;
}

// vexp of each lane. Written out because GCC vectorises the scalar one under a lane mask
// (attention's visible columns) by patching the clamped lanes after the fact, ~36
// instructions a vector, against ~26 here; on AVX-512, 2^n is applied by vscalefps, exact as
// the scalar's exponent bits are (n is within the normal exponents for x in [-87, 88]).
inline vf vexp(vf x) {
  vf n;
  const vf p = exp_parts(x, n);
#if defined(__AVX512F__)
  // (The builtin with a defined pass-through: _mm512_scalef_ps's undefined one warns.)
  return __builtin_ia32_scalefps512_mask(p, n, p, -1, _MM_FROUND_CUR_DIRECTION);
#else
  const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  return p * std::bit_cast<vf>(bits);
#endif
}

// Its lanes' sum, in a fixed order (pairwise).
inline float hsum(vf v) {
  float lane[kVecWidth];
  storev(lane, v);
  for (int w = kVecWidth / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) lane[i] += lane[i + w];
  return lane[0];
}

}  // namespace loom::kernels
