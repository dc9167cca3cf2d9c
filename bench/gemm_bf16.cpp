// Benchmark (not a test): bf16 GEMM with fp32 accumulation (kernels/cpu/matmul_bf16.h),
// oneDNN and the widening fallback, against OpenBLAS sgemm (kernels/cpu/matmul.h), on the
// products of GPT-2 124M's Linear layers for N tokens: forward out = x W^T, backward
// dx += dy W and dW += dy^T x. Prints GFLOP/s per product and the total per layer set.
//   gemm_bf16 [--tokens N] [--reps R]          (threads: OMP_NUM_THREADS; make bench-gemm)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "loom/kernels/cpu/bf16.h"
#include "loom/kernels/cpu/matmul.h"
#include "loom/kernels/cpu/matmul_bf16.h"

namespace k = loom::kernels;

namespace {

template <class F>
double seconds(F f, int reps) {
  f();  // warm-up (and oneDNN's kernel generation)
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 1024;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokens")
      N = std::atoll(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: gemm_bf16 [--tokens N] [--reps R]\n");
      return 2;
    }
  }
  const bool native = k::bf16_native();
  std::printf("bf16 backend: %s; %lld tokens, %s threads\n", k::bf16_gemm_description().c_str(),
              static_cast<long long>(N),
              std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "all");
  std::printf(
      "| layer (C -> OC) | product | sgemm GF/s | bf16 oneDNN GF/s | bf16 fallback GF/s |"
      " oneDNN / sgemm |\n| --- | --- | --- | --- | --- | --- |\n");
  struct Layer {
    const char* name;
    int64_t C, OC;
  };
  const Layer layers[] = {{"c_attn", 768, 2304},
                          {"attn.c_proj", 768, 768},
                          {"c_fc", 768, 3072},
                          {"mlp.c_proj", 3072, 768},
                          {"lm_head", 768, 50257}};
  double tot_s = 0, tot_d = 0, tot_f = 0;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const Layer& l : layers) {
    std::vector<float> x(N * l.C), w(l.OC * l.C), dy(N * l.OC), out(N * l.OC), dx(N * l.C),
        dw(l.OC * l.C);
    for (auto* v : {&x, &w, &dy})
      for (float& e : *v) e = dist(rng);
    std::vector<k::bf16> xb(x.size()), wb(w.size()), dyb(dy.size());
    k::to_bf16(x.data(), xb.data(), N * l.C);
    k::to_bf16(w.data(), wb.data(), l.OC * l.C);
    k::to_bf16(dy.data(), dyb.data(), N * l.OC);
    const double gf = 2.0 * N * l.C * l.OC / 1e9;
    const char* names[] = {"forward x W^T", "backward dy W", "backward dy^T x"};
    for (int p = 0; p < 3; ++p) {
      auto run32 = [&] {
        if (p == 0) k::matmul_forward(out.data(), x.data(), w.data(), nullptr, N, l.C, l.OC);
        if (p == 1)
          k::matmul_backward(dx.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), N, l.C,
                             l.OC);
        if (p == 2)
          k::matmul_backward(nullptr, dw.data(), nullptr, dy.data(), x.data(), w.data(), N, l.C,
                             l.OC);
      };
      auto run16 = [&] {
        if (p == 0)
          k::matmul_forward_half(k::Half::bf16, out.data(), xb.data(), wb.data(), nullptr, N, l.C,
                                 l.OC);
        if (p == 1)
          k::matmul_backward_half(k::Half::bf16, dx.data(), nullptr, nullptr, dyb.data(), xb.data(),
                                  wb.data(), N, l.C, l.OC);
        if (p == 2)
          k::matmul_backward_half(k::Half::bf16, nullptr, dw.data(), nullptr, dyb.data(), xb.data(),
                                  wb.data(), N, l.C, l.OC);
      };
      const double ts = seconds(run32, reps);
      double td = 0;
      if (native) {
        k::set_bf16_gemm_backend(k::Bf16Gemm::onednn);
        td = seconds(run16, reps);
      }
      k::set_bf16_gemm_backend(k::Bf16Gemm::fallback);
      const double tf = seconds(run16, reps);
      tot_s += ts, tot_d += td, tot_f += tf;
      char d[32] = "-", r[32] = "-";
      if (native)
        std::snprintf(d, sizeof d, "%.0f", gf / td), std::snprintf(r, sizeof r, "%.2f", ts / td);
      std::printf("| %s (%lld -> %lld) | %s | %.0f | %s | %.0f | %s |\n", l.name,
                  static_cast<long long>(l.C), static_cast<long long>(l.OC), names[p], gf / ts, d,
                  gf / tf, r);
    }
  }
  char d[32] = "-", r[32] = "-";
  if (native)
    std::snprintf(d, sizeof d, "%.1f", tot_d * 1e3),
        std::snprintf(r, sizeof r, "%.2f", tot_s / tot_d);
  std::printf("total: sgemm %.1f ms, bf16 oneDNN %s ms, bf16 fallback %.1f ms; oneDNN / sgemm %s\n",
              tot_s * 1e3, d, tot_f * 1e3, r);
  return 0;
}
