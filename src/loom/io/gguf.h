// GGUF (llama.cpp's model file), versions 2 and 3: read (mmap, read-only), dequantize, and map
// llama/qwen2 tensors onto Hugging Face names and layout.
//
// Format (all little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count; then
// the metadata, each a string key, u32 value type and value (strings are u64 length + bytes;
// arrays are u32 element type + u64 count + elements, and may nest); then per tensor a string
// name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset; then padding to
// `general.alignment` (default 32) and the data section, which offsets are relative to. ne[0]
// is the contiguous dimension, so the PyTorch/HF shape is ne reversed.
//
// Contract: open() validates every count, length and offset before anything is dereferenced
// (sizes bounded by the file, array nesting depth, n_dims 1..4, positive dims without
// overflow, known ggml types, rows made of whole blocks, data offsets aligned, inside the file
// with their padding, and not overlapping), so a corrupt or truncated file throws loom::Error
// naming the file (and the key or tensor) instead of crashing. Tensor data pointers point
// into the mapping and live as long as the GgufFile. Little-endian hosts and files only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "loom/tensor/ggml_quant.h"

namespace loom::io {

// The ggml types and block decoders live in tensor/ggml_quant.h (training keeps frozen
// weights in them); GGUF code and its tests name them through io::.
using loom::dequantize;
using loom::ggml_block_size;
using loom::ggml_can_dequantize;
using loom::ggml_type_known;
using loom::ggml_type_name;
using loom::ggml_type_size;
using loom::GgmlType;

// Metadata value types, with GGUF's numbering.
enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
const char* gguf_type_name(GgufType t);  // "u32", "string", "array", ...

// One metadata value. Scalars are widened into `data` by kind (unsigned -> uint64_t, signed
// -> int64_t, f32/f64 -> double, bool, string); arrays of scalars into the matching vector,
// arrays of arrays into a vector of GgufValue. `type` / `elem_type` keep the exact GGUF types.
struct GgufValue {
  using Data = std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<uint64_t>,
                            std::vector<int64_t>, std::vector<double>, std::vector<bool>,
                            std::vector<std::string>, std::vector<GgufValue>>;
  GgufType type = GgufType::U8;
  GgufType elem_type = GgufType::U8;  // arrays only: the element type (ARRAY when nested)
  Data data;

  bool is_array() const { return type == GgufType::ARRAY; }
  bool is_integer() const;                 // a scalar of any integer type
  size_t size() const;                     // array length; 1 for a scalar
  std::string type_str() const;            // "u32", "array[string]", "array[array[i32]]"
  std::optional<int64_t> to_i64() const;   // any integer scalar whose value fits
  std::optional<uint64_t> to_u64() const;  // any non-negative integer scalar
  std::optional<double> to_f64() const;    // f32 or f64 scalar
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // GGUF order: ne[0] is contiguous; 1..4 dims, all positive
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;              // from the start of the data section
  uint64_t nbytes = 0;              // without the alignment padding that follows
  const std::byte* data = nullptr;  // into the mapping; nbytes valid bytes
  std::string file;                 // the file it came from, for error messages

  int64_t numel() const;
  int64_t row_size() const { return ne[0]; }  // elements per row
  int64_t n_rows() const;                     // numel / ne[0]
  uint64_t row_bytes() const;                 // bytes per row
  std::vector<int64_t> hf_shape() const;      // ne reversed
};

// One .gguf file mapped read-only. Move-only; the destructor unmaps.
class GgufFile {
 public:
  static GgufFile open(const std::filesystem::path& path);

  GgufFile(GgufFile&& other) noexcept;
  GgufFile& operator=(GgufFile&& other) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }      // general.alignment, default 32
  uint64_t data_offset() const { return data_offset_; }  // where the data section starts
  std::string architecture() const { return get_string("general.architecture"); }

  // Metadata. Typed getters throw loom::Error naming the key and the file when the key is
  // missing or holds another type; integer getters take any integer type whose value fits.
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  bool has(std::string_view key) const { return metadata_.find(key) != metadata_.end(); }
  const GgufValue* find(std::string_view key) const;  // nullptr if absent
  const GgufValue& at(std::string_view key) const;    // throws if absent
  uint64_t get_u64(std::string_view key) const;
  int64_t get_i64(std::string_view key) const;
  uint32_t get_u32(std::string_view key) const;
  int32_t get_i32(std::string_view key) const;
  float get_f32(std::string_view key) const;   // f32, or f64 narrowed
  double get_f64(std::string_view key) const;  // f64 or f32
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const std::vector<std::string>& get_string_array(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;    // of f32 or f64
  std::vector<int32_t> get_i32_array(std::string_view key) const;  // of any integer type
  std::vector<int64_t> get_i64_array(std::string_view key) const;  // of any integer type
  // The same, with a default when the key is absent (a present key of the wrong type throws).
  uint64_t get_u64_or(std::string_view key, uint64_t dflt) const;
  float get_f32_or(std::string_view key, float dflt) const;
  std::string get_string_or(std::string_view key, const std::string& dflt) const;
  bool get_bool_or(std::string_view key, bool dflt) const;

  // Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent
  const GgufTensorInfo& tensor(std::string_view name) const;       // throws if absent

 private:
  GgufFile() = default;
  void unmap() noexcept;
  [[noreturn]] void type_error(std::string_view key, const GgufValue& v, const char* want) const;

  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
};

// Dequantizes rows [row_begin, row_end) of a tensor (a row is ne[0] elements, rows run over
// ne[1..] flattened) into dst ((row_end - row_begin) * ne[0] floats), so callers can go tile
// by tile. Throws naming the tensor and file for an unsupported type or a bad row range.
void dequantize_rows(const GgufTensorInfo& t, int64_t row_begin, int64_t row_end, float* dst);

// ---------------------------------------------------------------------------------------
// Hugging Face view (architectures llama, qwen2 and deepseek2).

// GGUF tensor name -> transformers name ("blk.3.attn_q.weight" ->
// "model.layers.3.self_attn.q_proj.weight"); "" for a name with no counterpart (and for
// the two kinds below, which hold several HF tensors or part of one).
std::string gguf_to_hf_name(const std::string& gguf_name);

// llama.cpp's deepseek2 stacks each MoE layer's routed experts into one tensor per
// projection, blk.N.ffn_{gate,up,down}_exps.weight (ne [cols, rows, E]): the HF names of its
// E slices along the outermost dimension (model.layers.N.mlp.experts.<e>.*_proj.weight), in
// order; empty for any other tensor.
std::vector<std::string> gguf_stacked_hf_names(const GgufTensorInfo& t);

// llama.cpp's converter splits deepseek2's kv_b_proj [H*(Dn + Dv), R] into attn_k_b
// (ne [Dn, R, H]: each head's key rows transposed) and attn_v_b (ne [R, Dv, H]) for weight
// absorption; older files keep attn_kv_b. For blk.N.attn_k_b.weight: kv_b_proj's HF name,
// and kv (H*(Dn + Dv) * R floats) rebuilt from it and the block's attn_v_b. Returns "" for
// any other tensor; throws naming the file when the pair is incomplete or the shapes
// disagree.
std::string read_split_kv_b(const GgufFile& f, const GgufTensorInfo& k_b, std::vector<float>* kv);

// llama.cpp's converter reorders the rows of q_proj and k_proj (weights and biases) for the
// `llama` architecture only, from HF's rotate-half RoPE layout to the interleaved-pairs
// layout ggml's RoPE uses: in numpy,
//   w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
// i.e. within each head of hd = rows / n_head rows, GGUF row 2*i + j holds HF row
// j*hd/2 + i (i < hd/2, j in {0, 1}). n_head is the attention head count for q_proj and the
// KV head count for k_proj. unpermute_qk undoes it in place on a row-major
// [rows, cols] matrix (cols = 1 for a bias); rows must be a multiple of 2 * n_head.
void unpermute_qk(float* w, int64_t rows, int64_t cols, int64_t n_head);

// Whether `gguf_name` of a file with architecture `arch` needs unpermute_qk, and with which
// head count (0: no). Reads {arch}.attention.head_count(_kv) from f.
int64_t qk_permute_heads(const GgufFile& f, const std::string& gguf_name);

// Dequantizes a whole tensor into dst (numel floats) in HF layout: row-major over
// hf_shape(), with q/k rows restored for llama. For one tensor at a time.
void read_hf_tensor(const GgufFile& f, const GgufTensorInfo& t, float* dst);

// A 2-D weight kept in its ggml blocks (for a frozen, quantized base), rows in HF order
// (the q/k permutation undone by moving whole rows). Throws naming the tensor for other
// ranks or for types that cannot be dequantized.
QuantMatrix read_hf_quant(const GgufFile& f, const GgufTensorInfo& t);
// Rows [r0, r1) of t seen as a matrix [numel / ne[0], ne[0]] (one expert of a stacked
// [E, out, in] tensor), kept in its ggml blocks as stored.
QuantMatrix read_quant_rows(const GgufFile& f, const GgufTensorInfo& t, int64_t r0, int64_t r1);

// A transformers-style config.json for a llama or qwen2 GGUF: model_type, architectures,
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, head_dim (when {arch}.attention.key_length is given), rms_norm_eps,
// rope_theta, max_position_embeddings, vocab_size (embedding tensor rows, else the
// tokenizer's token count, else {arch}.vocab_size), tie_word_embeddings (no output.weight),
// attention_bias (llama), hidden_act, rope_scaling (from {arch}.rope.scaling.*), and
// bos/eos/pad_token_id (tokenizer.ggml.bos_token_id, eos_token_id, padding_token_id). f32
// values are written as the shortest decimal that reads back as the same float (1e-05, not
// 9.99999974737875e-06). Throws for other architectures, missing required keys, and
// llama3-style RoPE scaling (stored by llama.cpp as a rope_freqs tensor, from which the HF
// parameters cannot be recovered).
// A deepseek2 file gives a DeepseekV3 config (sigmoid gating, expert_gating_func 2) or a
// DeepseekV2 one, from deepseek2.* keys: the MLA sizes (key_length_mla / value_length_mla,
// or key_length / value_length in files older than the absorption split), the MoE sizes and
// routing (expert_count, expert_used_count, expert_shared_count, leading_dense_block_count,
// expert_weights_scale / _norm, expert_group_count / _used_count), rope.dimension_count and
// yarn (rope.scaling.*; yarn_log_multiplier is 0.1 mscale_all_dim, and mscale is taken equal
// to it, as DeepSeek's configs have them).
nlohmann::json gguf_hf_config(const GgufFile& f);

}  // namespace loom::io
