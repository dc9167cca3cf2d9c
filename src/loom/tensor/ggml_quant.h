// ggml's tensor types and their block decoders, and QuantMatrix: a frozen weight kept in
// those blocks. GGUF files store weights this way; PEFT runs keep a quantized base as it
// was loaded (QLoRA-style) and the kernels dequantize it a tile of rows at a time.
// Block layouts and the order of operations follow ggml's reference decoders, so values
// equal gguf-py's dequantize bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom {

// ggml tensor types, with ggml's numbering (gaps are types ggml has retired).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};
// The type table: whether a raw type number is one ggml defines, its name ("Q4_K"), elements
// per block and bytes per block (the size functions throw for an unknown value). Only the
// types ggml_can_dequantize() accepts (the list at dequantize()) become floats.
bool ggml_type_known(uint32_t t);
const char* ggml_type_name(GgmlType t);
int64_t ggml_block_size(GgmlType t);
int64_t ggml_type_size(GgmlType t);
bool ggml_can_dequantize(GgmlType t);

// Dequantizes n elements (a multiple of t's block size) of type t from src into dst.
// Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, with ggml's block layouts.
// Other types throw loom::Error naming the type. src need not be aligned.
void dequantize(GgmlType t, const std::byte* src, int64_t n, float* dst);

// A frozen [rows, cols] matrix in ggml blocks (row-major like nn.Linear's [out, in]): row r
// is row_bytes() bytes at bytes.data() + r * row_bytes(), a whole number of blocks. Only
// types ggml_can_dequantize() accepts.
struct QuantMatrix {
  GgmlType type = GgmlType::F32;
  int64_t rows = 0, cols = 0;
  std::vector<std::byte> bytes;

  // Checks the type and that cols is whole blocks; allocates rows * row_bytes() bytes.
  static QuantMatrix empty(GgmlType type, int64_t rows, int64_t cols);
  uint64_t row_bytes() const;
  int64_t numel() const { return rows * cols; }
  // Rows [r0, r1) into dst ((r1 - r0) * cols floats).
  void dequantize_rows(int64_t r0, int64_t r1, float* dst) const;
};

}  // namespace loom
