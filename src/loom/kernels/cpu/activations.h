// Pointwise activations. GELU uses the tanh approximation (GPT-2's "gelu_new").
//   gelu_forward : y[n] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   gelu_backward: dx[n] = dy[n] * gelu'(x[n])
// The backward kernels write their input gradient (=, not +=): each is the only producer of
// it, so the caller's buffer needs no zeroing pass first (Scratch::take).
#pragma once

#include <cstdint>

namespace loom::kernels {

void gelu_forward(float* y, const float* x, int64_t n);
void gelu_backward(float* dx, const float* x, const float* dy, int64_t n);

// ReLU (bottleneck adapters): y = max(x, 0); dx[n] = dy[n] where x[n] > 0, else 0.
void relu_forward(float* y, const float* x, int64_t n);
void relu_backward(float* dx, const float* x, const float* dy, int64_t n);

// SwiGLU (Llama's MLP): h[n] = silu(g[n]) * u[n], silu(g) = g * sigmoid(g).
//   backward: dg[n] = dh * u * silu'(g), du[n] = dh * silu(g)
void swiglu_forward(float* h, const float* g, const float* u, int64_t n);
void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     int64_t n);

}  // namespace loom::kernels
