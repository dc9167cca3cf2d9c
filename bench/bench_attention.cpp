// Benchmark (not a test): the training attention kernel alone (kernels/cpu/attention.h),
// forward and backward, against the sgemm rate measured in the same run.
//   bench_attention [--batch B] [--seq T]... [--heads NH] [--kv-heads NKV] [--head-dim HD]
//                   [--reps N]
// Defaults: SmolLM2-135M's heads (9 query, 3 KV, head_dim 64), B = 4, T = 256 and 1024.
// FLOPs are the causal products' model FLOPs, per (batch row, head): forward Q K^T and P V,
// 2 x 2 HD x T(T+1)/2; backward dV, dP, dQ and dK, twice the forward. The backward's
// recompute of the scores is work the kernel chooses to do and is not counted. The ceiling
// is sgemm on SmolLM2's MLP shape (1024 x 1536 x 576), as bench_step's, timed between the
// kernel's runs: each figure is the best of N runs after one warm-up (this machine is shared;
// interleaved bests compare like with like). One JSON line per T on stdout, a readable line
// on stderr.
// Threads: OMP_NUM_THREADS.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "loom/kernels/cpu/attention.h"

namespace {

using loom::bench::now_s;

std::vector<float> noise(size_t n, uint32_t seed) {
  std::vector<float> x(n);
  for (auto& e : x) {  // xorshift: values in [-1, 1), enough for timing
    seed ^= seed << 13;
    seed ^= seed >> 17;
    seed ^= seed << 5;
    e = static_cast<float>(seed % 20000) / 10000.0f - 1.0f;
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t B = 4, NH = 9, NKV = 3, HD = 64, reps = 20;
  std::vector<int64_t> seqs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_attention: %s needs a value\n", a.c_str());
      return 2;
    }
    const int64_t v = std::atoll(argv[++i]);
    if (v <= 0) {
      std::fprintf(stderr, "bench_attention: %s must be a positive integer\n", a.c_str());
      return 2;
    }
    if (a == "--batch")
      B = v;
    else if (a == "--seq")
      seqs.push_back(v);
    else if (a == "--heads")
      NH = v;
    else if (a == "--kv-heads")
      NKV = v;
    else if (a == "--head-dim")
      HD = v;
    else if (a == "--reps")
      reps = v;
    else {
      std::fprintf(stderr, "bench_attention: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (NH % NKV != 0) {
    std::fprintf(stderr, "bench_attention: --heads %lld is not a multiple of --kv-heads %lld\n",
                 static_cast<long long>(NH), static_cast<long long>(NKV));
    return 2;
  }
  if (seqs.empty()) seqs = {256, 1024};
  loom::bench::SgemmProbe probe(1024, 1536, 576);
  for (const int64_t T : seqs) {
    const int64_t N = B * T, QC = NH * HD, KVC = NKV * HD;
    const auto q = noise(N * QC, 1), k = noise(N * KVC, 2), v = noise(N * KVC, 3),
               dout = noise(N * QC, 4);
    std::vector<float> out(N * QC), lse(B * NH * T), dq(N * QC), dk(N * KVC), dv(N * KVC);
    const loom::kernels::AttnDims d{B, T, NH, NKV, HD, QC, KVC};
    std::vector<double> fwd, bwd, gemm;
    for (int64_t r = 0; r <= reps; ++r) {
      const double sg = probe.seconds();
      double t0 = now_s();
      loom::kernels::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
      const double t1 = now_s();
      loom::kernels::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                        k.data(), v.data(), out.data(), lse.data(), d);
      const double t2 = now_s();
      if (r == 0) continue;  // warm-up
      gemm.push_back(sg);
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
    }
    const double flops = 2.0 * 2.0 * HD * (T * (T + 1) / 2.0) * B * NH;
    const double f = *std::min_element(fwd.begin(), fwd.end()),
                 b = *std::min_element(bwd.begin(), bwd.end());
    const double gf = flops / f / 1e9, gb = 2 * flops / b / 1e9,
                 sgemm = probe.gflops(*std::min_element(gemm.begin(), gemm.end()));
    nlohmann::json j{{"bench", "attention"},
                     {"B", B},
                     {"T", T},
                     {"heads", NH},
                     {"kv_heads", NKV},
                     {"head_dim", HD},
                     {"threads", omp_get_max_threads()},
                     {"fwd_ms", 1e3 * f},
                     {"bwd_ms", 1e3 * b},
                     {"fwd_gflops", gf},
                     {"bwd_gflops", gb},
                     {"sgemm_gflops", sgemm},
                     {"fwd_fraction_of_sgemm", gf / sgemm},
                     {"bwd_fraction_of_sgemm", gb / sgemm}};
    std::printf("%s\n", j.dump().c_str());
    std::fprintf(stderr,
                 "attention B=%lld T=%lld heads %lld/%lld x %lld: forward %.1f ms %.1f GFLOP/s "
                 "(%.0f%% of sgemm %.1f), backward %.1f ms %.1f GFLOP/s (%.0f%%)\n",
                 static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(NH),
                 static_cast<long long>(NKV), static_cast<long long>(HD), 1e3 * f, gf,
                 100 * gf / sgemm, sgemm, 1e3 * b, gb, 100 * gb / sgemm);
  }
  return 0;
}
