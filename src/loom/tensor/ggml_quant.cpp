#include "loom/tensor/ggml_quant.h"

#include <cstring>
#include <string>

#include "loom/kernels/cpu/bf16.h"
#include "loom/util/error.h"

namespace loom {

namespace {

// ---------------------------------------------------------------------------------------
// ggml type table

struct TypeTraits {
  uint32_t id;
  const char* name;
  int64_t block_size;
  int64_t type_size;
  bool dequant;
};
constexpr int64_t QK_K = 256;
constexpr TypeTraits kTypes[] = {
    {0, "F32", 1, 4, true},
    {1, "F16", 1, 2, true},
    {2, "Q4_0", 32, 2 + 16, true},
    {3, "Q4_1", 32, 2 + 2 + 16, true},
    {6, "Q5_0", 32, 2 + 4 + 16, false},
    {7, "Q5_1", 32, 2 + 2 + 4 + 16, false},
    {8, "Q8_0", 32, 2 + 32, true},
    {9, "Q8_1", 32, 4 + 4 + 32, false},
    {10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4, false},
    {11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12, false},
    {12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2, true},
    {13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2, true},
    {14, "Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, true},
    {15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8, false},
    {16, "IQ2_XXS", QK_K, 2 + QK_K / 4, false},
    {17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32, false},
    {18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8, false},
    {19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16, false},
    {20, "IQ4_NL", 32, 2 + 16, false},
    {21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, false},
    {22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16, false},
    {23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64, false},
    {24, "I8", 1, 1, false},
    {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},
    {27, "I64", 1, 8, false},
    {28, "F64", 1, 8, false},
    {29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32, false},
    {30, "BF16", 1, 2, true},
    {34, "TQ1_0", QK_K, 2 + 4 * 13, false},
    {35, "TQ2_0", QK_K, 2 + 64, false},
    {39, "MXFP4", 32, 1 + 16, false},
    {40, "NVFP4", 64, 4 + 32, false},
    {41, "Q1_0", 128, 2 + 16, false},
};

const TypeTraits* traits_of(uint32_t id) {
  for (const auto& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}
const TypeTraits& traits(GgmlType t) {
  const TypeTraits* tr = traits_of(static_cast<uint32_t>(t));
  LOOM_CHECK(tr, "ggml type " + std::to_string(static_cast<uint32_t>(t)) + " is unknown");
  return *tr;
}

// ---------------------------------------------------------------------------------------
// Half-precision loads (src may be unaligned)

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline float load_half(const uint8_t* p) { return kernels::from_f16(load_u16(p)); }

// ---------------------------------------------------------------------------------------
// Block dequantizers: one block of `bytes` at p into 32 or 256 floats at y. Operation order
// follows ggml's reference (and gguf-py): e.g. (d * scale) * q - (dmin * min).

inline void deq_q8_0(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const auto* q = reinterpret_cast<const int8_t*>(p + 2);
  for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(q[i]) * d;
}

inline void deq_q4_0(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const uint8_t* q = p + 2;
  for (int i = 0; i < 16; ++i) {
    y[i] = static_cast<float>(static_cast<int>(q[i] & 0x0f) - 8) * d;
    y[i + 16] = static_cast<float>(static_cast<int>(q[i] >> 4) - 8) * d;
  }
}

inline void deq_q4_1(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const float m = load_half(p + 2);
  const uint8_t* q = p + 4;
  for (int i = 0; i < 16; ++i) {
    y[i] = static_cast<float>(q[i] & 0x0f) * d + m;
    y[i + 16] = static_cast<float>(q[i] >> 4) * d + m;
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min packed in 12
// bytes: sub-blocks 0..3 use the low 6 bits of bytes j (scale) and j+4 (min); sub-blocks
// 4..7 take their low 4 bits from byte j+4 (scale: low nibble, min: high nibble) and their
// top 2 bits from the top 2 bits of bytes j-4 (scale) and j (min).
inline void k_scale_min(int j, const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Q4_K block (144 bytes): f16 d, f16 dmin, 12 bytes scales, 128 bytes of nibbles. Each 32
// bytes of nibbles hold two sub-blocks: low nibbles the first, high nibbles the second.
inline void deq_q4_k(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const float dmin = load_half(p + 2);
  const uint8_t* scales = p + 4;
  const uint8_t* q = p + 16;
  for (int g = 0; g < 4; ++g, q += 32, y += 64) {
    uint8_t sc, mn;
    k_scale_min(2 * g, scales, &sc, &mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    k_scale_min(2 * g + 1, scales, &sc, &mn);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l) {
      y[l] = d1 * static_cast<float>(q[l] & 0x0f) - m1;
      y[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// Q5_K block (176 bytes): f16 d, f16 dmin, 12 bytes scales, 32 bytes qh, 128 bytes qs. As
// Q4_K, plus a fifth bit per value: bit s of qh[l] belongs to element l of sub-block s.
inline void deq_q5_k(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const float dmin = load_half(p + 2);
  const uint8_t* scales = p + 4;
  const uint8_t* qh = p + 16;
  const uint8_t* q = p + 48;
  for (int g = 0; g < 4; ++g, q += 32, y += 64) {
    uint8_t sc, mn;
    k_scale_min(2 * g, scales, &sc, &mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    k_scale_min(2 * g + 1, scales, &sc, &mn);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
    const int s1 = 2 * g, s2 = 2 * g + 1;
    for (int l = 0; l < 32; ++l) {
      const int lo = (q[l] & 0x0f) | (((qh[l] >> s1) & 1) << 4);
      const int hi = (q[l] >> 4) | (((qh[l] >> s2) & 1) << 4);
      y[l] = d1 * static_cast<float>(lo) - m1;
      y[l + 32] = d2 * static_cast<float>(hi) - m2;
    }
  }
}

// Q6_K block (210 bytes): 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8
// scales (one per 16 values), f16 d. Per half of 128 values: value 32*k + l (k = 0..3) has
// low bits ql[l + 32*(k&1)] >> 4*(k>>1) and high bits qh[l] >> 2k, minus 32.
inline void deq_q6_k(const uint8_t* p, float* y) {
  const uint8_t* ql = p;
  const uint8_t* qh = p + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(p + 192);
  const float d = load_half(p + 208);
  for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

template <void (*Block)(const uint8_t*, float*)>
void deq_blocks(const uint8_t* src, int64_t nblocks, int64_t block_bytes, int64_t block_elems,
                float* dst) {
  // Parallel only when there is enough work to pay for waking the thread pool.
#pragma omp parallel for schedule(static) if (nblocks * block_elems >= (int64_t{1} << 16))
  for (int64_t b = 0; b < nblocks; ++b) Block(src + b * block_bytes, dst + b * block_elems);
}

}  // namespace

bool ggml_type_known(uint32_t t) { return traits_of(t) != nullptr; }
const char* ggml_type_name(GgmlType t) {
  const TypeTraits* tr = traits_of(static_cast<uint32_t>(t));
  return tr ? tr->name : "unknown";
}
int64_t ggml_block_size(GgmlType t) { return traits(t).block_size; }
int64_t ggml_type_size(GgmlType t) { return traits(t).type_size; }
bool ggml_can_dequantize(GgmlType t) {
  const TypeTraits* tr = traits_of(static_cast<uint32_t>(t));
  return tr && tr->dequant;
}
// ---------------------------------------------------------------------------------------
// Dequantization

void dequantize(GgmlType t, const std::byte* src_bytes, int64_t n, float* dst) {
  const TypeTraits* tr = traits_of(static_cast<uint32_t>(t));
  LOOM_CHECK(tr, "dequantize: unknown ggml type " + std::to_string(static_cast<uint32_t>(t)));
  LOOM_CHECK(tr->dequant, std::string("dequantize: ggml type ") + tr->name +
                              " is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, "
                              "Q5_K, Q6_K)");
  LOOM_CHECK(n >= 0 && n % tr->block_size == 0,
             "dequantize: " + std::to_string(n) + " elements is not a whole number of " + tr->name +
                 " blocks of " + std::to_string(tr->block_size));
  if (n == 0) return;
  const auto* src = reinterpret_cast<const uint8_t*>(src_bytes);
  const int64_t nb = n / tr->block_size;
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_half(src + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = kernels::from_bf16(load_u16(src + 2 * i));
      return;
    case GgmlType::Q8_0:
      return deq_blocks<deq_q8_0>(src, nb, tr->type_size, tr->block_size, dst);
    case GgmlType::Q4_0:
      return deq_blocks<deq_q4_0>(src, nb, tr->type_size, tr->block_size, dst);
    case GgmlType::Q4_1:
      return deq_blocks<deq_q4_1>(src, nb, tr->type_size, tr->block_size, dst);
    case GgmlType::Q4_K:
      return deq_blocks<deq_q4_k>(src, nb, tr->type_size, tr->block_size, dst);
    case GgmlType::Q5_K:
      return deq_blocks<deq_q5_k>(src, nb, tr->type_size, tr->block_size, dst);
    case GgmlType::Q6_K:
      return deq_blocks<deq_q6_k>(src, nb, tr->type_size, tr->block_size, dst);
    default:
      throw Error(std::string("dequantize: internal: no kernel for ") + tr->name);
  }
}

QuantMatrix QuantMatrix::empty(GgmlType type, int64_t rows, int64_t cols) {
  LOOM_CHECK(ggml_can_dequantize(type), std::string("QuantMatrix: ggml type ") +
                                            ggml_type_name(type) + " cannot be dequantized");
  LOOM_CHECK(rows > 0 && cols > 0 && cols % ggml_block_size(type) == 0,
             "QuantMatrix: [" + std::to_string(rows) + ", " + std::to_string(cols) +
                 "] is not whole " + ggml_type_name(type) + " blocks per row");
  QuantMatrix q;
  q.type = type;
  q.rows = rows;
  q.cols = cols;
  q.bytes.resize(static_cast<size_t>(rows) * q.row_bytes());
  return q;
}

uint64_t QuantMatrix::row_bytes() const {
  return static_cast<uint64_t>(cols / ggml_block_size(type) * ggml_type_size(type));
}

void QuantMatrix::dequantize_rows(int64_t r0, int64_t r1, float* dst) const {
  LOOM_CHECK(0 <= r0 && r0 <= r1 && r1 <= rows, "QuantMatrix: rows [" + std::to_string(r0) + ", " +
                                                    std::to_string(r1) + ") out of range for " +
                                                    std::to_string(rows));
  dequantize(type, bytes.data() + static_cast<uint64_t>(r0) * row_bytes(), (r1 - r0) * cols, dst);
}

}  // namespace loom
