// 16-bit float storage for mixed precision. bfloat16: the upper 16 bits of an IEEE fp32 (sign, 8
// exponent bits, 7 mantissa bits), so it spans fp32's range with 3 significant decimal digits.
// Conversion from fp32 rounds to nearest, ties to even (as PyTorch and oneDNN do); NaN stays a
// (quiet) NaN and infinities stay infinite. Widening to fp32 is exact. Products of two bf16 values
// are exact in fp32 (8 + 8 significant bits), which is why bf16 GEMMs accumulate in fp32. IEEE fp16
// (binary16: 5 exponent bits, 10 mantissa bits, largest finite 65504): rounds to nearest even,
// values of 65520 and above become infinity (the overflow fp16 loss scaling watches for), tiny
// values become subnormals; widening is exact.
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

inline uint16_t to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (a >= 0x38800000u) {                       // normal in fp16 (>= 2^-14)
    uint32_t r = a - ((127u - 15u) << 23);      // rebias the exponent
    r += 0xfffu + ((r >> 13) & 1u);             // round half to even on the dropped 13 bits
    return sign | static_cast<uint16_t>(r >> 13);
  }
  // Subnormal or zero: a multiple of 2^-24; fp32 arithmetic rounds half to even.
  float m;
  std::memcpy(&m, &a, sizeof m);
  m = m * 0x1p24f + 0x1p23f - 0x1p23f;  // integer part, rounded to nearest even
  return sign | static_cast<uint16_t>(m);
}

inline float from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  uint32_t u;
  if (em >= 0x7c00u) {
    u = sign | 0x7f800000u | ((em & 0x3ffu) << 13);  // infinity / NaN
  } else if (em >= 0x0400u) {
    u = sign | ((em << 13) + ((127u - 15u) << 23));  // normal: rebias the exponent
  } else {
    const float m = static_cast<float>(em) * 0x1p-24f;  // zero or subnormal, exact
    std::memcpy(&u, &m, sizeof u);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The two 16-bit formats, for code that holds either (mixed-precision copies of weights).
enum class Half : uint8_t { bf16, f16 };
inline const char* half_name(Half h) { return h == Half::bf16 ? "bf16" : "fp16"; }

// Element reads for loops templated over the data's format (f32, or 16 bits of a format fixed
// at compile time): widen(x, i) is x[i] as fp32.
template <Half F>
struct HalfPtr {
  const uint16_t* p;
};
inline float widen(const float* x, int64_t i) { return x[i]; }
inline float widen(HalfPtr<Half::bf16> x, int64_t i) { return from_bf16(x.p[i]); }
inline float widen(HalfPtr<Half::f16> x, int64_t i) { return from_f16(x.p[i]); }

// Whole buffers (OpenMP over chunks for large n).
void to_bf16(const float* x, bf16* y, int64_t n);
void from_bf16(const bf16* x, float* y, int64_t n);
void to_half(Half h, const float* x, uint16_t* y, int64_t n);
void from_half(Half h, const uint16_t* x, float* y, int64_t n);
// acc[i] = round(widen(acc[i]) + x[i]): a 16-bit accumulator (grad_accum_dtype bf16/fp16)
// takes an fp32 addend with one rounding.
void add_to_half(Half h, const float* x, uint16_t* acc, int64_t n);

}  // namespace loom::kernels
