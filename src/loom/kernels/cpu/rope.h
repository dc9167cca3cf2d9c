// Rotary position embedding with Hugging Face's convention (rotate_half: the two halves of
// each head, not interleaved pairs):
//   out[i]       = x[i] cos(p f_i) - x[i + D/2] sin(p f_i)
//   out[i + D/2] = x[i + D/2] cos(p f_i) + x[i] sin(p f_i),   i < D/2, f_i = inv_freq[i]
// applied in place to x[N rows, H heads of D] with a row stride (heads head_stride apart,
// D when 0: MLA rotates a slice of wider heads); row n uses table row n,
// so packed sequences (positions restarting inside a row of the batch) need no special case.
// Backward is the inverse rotation (the transpose), also in place on the gradient. rope_inv_freq
// implements rope_scaling types default, linear, llama3 and yarn as transformers does; yarn
// also scales the tables by its attention factor (rope_attention_factor: the cos/sin
// multiplier; 1 for the other types).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::kernels {

struct RopeScaling {
  std::string type = "default";  // default | linear | llama3 | yarn
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // yarn: the ramp's rotation bounds, the mscales (0: absent), an explicit attention factor
  // (0: derived from factor and the mscales), whether the ramp's ends are rounded outward.
  double beta_fast = 32.0, beta_slow = 1.0, mscale = 0.0, mscale_all_dim = 0.0;
  double attention_factor = 0.0;
  bool truncate = true;
};

std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& s);
double rope_attention_factor(const RopeScaling& s);
// YaRN's mscale, 0.1 * m * ln(scale) + 1 (1 for scale <= 1).
double yarn_mscale(double scale, double m);

// cos/sin tables [N, D/2] for positions pos[0..N), both times `scale`.
void rope_tables(float* cos_t, float* sin_t, const int32_t* pos, int64_t N,
                 const std::vector<float>& inv_freq, float scale = 1.0f);

void rope_forward(float* x, const float* cos_t, const float* sin_t, int64_t N, int64_t H, int64_t D,
                  int64_t stride, int64_t head_stride = 0);
void rope_backward(float* dx, const float* cos_t, const float* sin_t, int64_t N, int64_t H,
                   int64_t D, int64_t stride, int64_t head_stride = 0);

}  // namespace loom::kernels
