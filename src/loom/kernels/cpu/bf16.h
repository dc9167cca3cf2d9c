// bfloat16 storage: the upper 16 bits of an IEEE fp32 (sign, 8 exponent bits, 7 mantissa
// bits), so it spans fp32's range with 3 significant decimal digits. Conversion from fp32
// rounds to nearest, ties to even (as PyTorch and oneDNN do); NaN stays a (quiet) NaN and
// infinities stay infinite. Widening to fp32 is exact. Products of two bf16 values are exact
// in fp32 (8 + 8 significant bits), which is why bf16 GEMMs accumulate in fp32.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom::kernels {

using bf16 = uint16_t;

inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round half to even on the dropped 16 bits
  return static_cast<bf16>(u >> 16);
}

inline float from_bf16(bf16 h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Whole buffers (OpenMP over chunks for large n).
void to_bf16(const float* x, bf16* y, int64_t n);
void from_bf16(const bf16* x, float* y, int64_t n);

}  // namespace loom::kernels
