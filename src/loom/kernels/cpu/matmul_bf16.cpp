#include "loom/kernels/cpu/matmul_bf16.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/kernels/cpu/matmul.h"
#include "loom/util/error.h"
#include "loom/util/profile.h"

#ifdef LOOM_HAVE_DNNL
#include "oneapi/dnnl/dnnl.hpp"
#endif

namespace loom::kernels {
namespace {

#ifdef LOOM_HAVE_DNNL
// One CPU engine and stream per process; primitives cached per problem (oneDNN's own cache
// saves the kernel generation, this one the descriptor work on every call).
struct Dnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float>;
  std::map<Key, dnnl::matmul> cache;
  std::mutex mu;
};

Dnnl& dnnl_ctx() {
  static Dnnl d;
  return d;
}

// A logical [rows, cols] operand stored row-major with leading dimension ld, or (trans) its
// transpose stored [cols, ld].
dnnl::memory::desc operand(int64_t rows, int64_t cols, bool trans, int64_t ld,
                           dnnl::memory::data_type dt) {
  const dnnl::memory::dims strides = trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1};
  return dnnl::memory::desc({rows, cols}, dt, strides);
}

void gemm_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda,
                 const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  using dt = dnnl::memory::data_type;
  Dnnl& d = dnnl_ctx();
  const auto a_md = operand(M, K, ta, lda, dt::bf16);
  const auto b_md = operand(K, N, tb, ldb, dt::bf16);
  const auto c_md = operand(M, N, false, ldc, dt::f32);
  dnnl::matmul prim;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    const Dnnl::Key key{ta, tb, M, N, K, lda, ldb, ldc, beta};
    auto it = d.cache.find(key);
    if (it == d.cache.end()) {
      dnnl::primitive_attr attr;
      if (beta != 0.0f) {
        dnnl::post_ops ops;
        ops.append_sum(beta);  // C = A B + beta C
        attr.set_post_ops(ops);
      }
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, d.eng);
      it = d.cache.emplace(key, dnnl::matmul(pd)).first;
    }
    prim = it->second;
  }
  dnnl::memory a(a_md, d.eng, const_cast<bf16*>(A));
  dnnl::memory b(b_md, d.eng, const_cast<bf16*>(B));
  dnnl::memory c(c_md, d.eng, C);
  prim.execute(d.strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  d.strm.wait();
}
#endif

// Rows [r0, r0 + nr) x columns [c0, c0 + nc) of a logical 16-bit operand stored row-major
// with leading dimension ld (or, trans, its transpose stored so), widened into dst as a
// dense block in the stored orientation: [nr, nc], or [nc, nr] when trans.
void widen_block(Half h, const uint16_t* src, int64_t ld, bool trans, int64_t r0, int64_t nr,
                 int64_t c0, int64_t nc, float* dst) {
  if (trans) {
    std::swap(r0, c0);
    std::swap(nr, nc);
  }
#pragma omp parallel for schedule(static) if (nr * nc > (1 << 16))
  for (int64_t r = 0; r < nr; ++r) from_half(h, src + (r0 + r) * ld + c0, dst + r * nc, nc);
}

// C = A B + beta C through OpenBLAS sgemm, widening the operands block by block: the
// scratch stays at 20 MB (kKb x kNb of B, kMb x kKb of A) however large the product (a
// 50k-vocabulary head's logit gradient would otherwise be widened whole, ~200 MB per
// micro-batch of 1024 tokens). Each B block is widened once, A's once per column block of C.
void gemm_fallback(Half h, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                   int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  constexpr int64_t kMb = 1024, kNb = 4096, kKb = 1024;
  thread_local std::vector<float> a, b;
  a.resize(static_cast<size_t>(std::min(M, kMb) * std::min(K, kKb)));
  b.resize(static_cast<size_t>(std::min(K, kKb) * std::min(N, kNb)));
  if (K == 0) {  // no products: C = beta C
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  for (int64_t k0 = 0; k0 < K; k0 += kKb) {
    const int64_t kb = std::min(kKb, K - k0);
    const float beta_k = k0 == 0 ? beta : 1.0f;
    for (int64_t j0 = 0; j0 < N; j0 += kNb) {
      const int64_t nb = std::min(kNb, N - j0);
      widen_block(h, B, ldb, tb, k0, kb, j0, nb, b.data());  // B's [kb, nb] block
      for (int64_t i0 = 0; i0 < M; i0 += kMb) {
        const int64_t mb = std::min(kMb, M - i0);
        widen_block(h, A, lda, ta, i0, mb, k0, kb, a.data());  // A's [mb, kb] block
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    mb, nb, kb, 1.0f, a.data(), ta ? mb : kb, b.data(), tb ? kb : nb, beta_k,
                    C + i0 * ldc + j0, ldc);
      }
    }
  }
}

bool cpu_has_bf16() {
#ifdef LOOM_HAVE_DNNL
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
#else
  return false;
#endif
}

Bf16Gemm& chosen() {
  static Bf16Gemm b = [] {
    const char* env = std::getenv("LOOM_BF16_GEMM");
    if (env && std::strcmp(env, "fallback") == 0) return Bf16Gemm::fallback;
    return cpu_has_bf16() ? Bf16Gemm::onednn : Bf16Gemm::fallback;
  }();
  return b;
}

}  // namespace

bool bf16_native() { return cpu_has_bf16(); }

Bf16Gemm bf16_gemm_backend() { return chosen(); }

void set_bf16_gemm_backend(Bf16Gemm b) {
  LOOM_CHECK(b == Bf16Gemm::fallback || bf16_native(),
             "bf16 GEMM: oneDNN's native kernels are not available here (" +
                 bf16_gemm_description() + ")");
  chosen() = b;
}

std::string bf16_gemm_description() {
#ifdef LOOM_HAVE_DNNL
  const dnnl_version_t* v = dnnl_version();
  const std::string lib = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) +
                          "." + std::to_string(v->patch);
  if (chosen() == Bf16Gemm::onednn) return lib + " matmul (native bf16 dot products)";
  return cpu_has_bf16() ? "fp32 OpenBLAS sgemm on widened operands (LOOM_BF16_GEMM=fallback)"
                        : "fp32 OpenBLAS sgemm on widened operands (this CPU has no avx512_bf16; " +
                              lib + " would emulate it)";
#else
  return "fp32 OpenBLAS sgemm on widened operands (built without oneDNN)";
#endif
}

void gemm_half(Half h, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  if (M == 0 || N == 0) return;
  prof::ScopedPhase ph(prof::Phase::Gemm);
#ifdef LOOM_HAVE_DNNL
  if (h == Half::bf16 && chosen() == Bf16Gemm::onednn) {
    gemm_onednn(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#endif
  gemm_fallback(h, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16* A,
               int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_half(Half::bf16, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

void matmul_forward_half(Half h, float* out, const uint16_t* inp, const uint16_t* W, const float* b,
                         int64_t N, int64_t C, int64_t OC, bool accumulate) {
  const float beta = start_output(out, b, N, OC, OC, accumulate);
  gemm_half(h, false, true, N, OC, C, inp, C, W, C, beta, out, OC);
}

void matmul_backward_half(Half h, float* dinp, float* dW, float* db, const uint16_t* dout,
                          const uint16_t* inp, const uint16_t* W, int64_t N, int64_t C,
                          int64_t OC) {
  if (dinp) gemm_half(h, false, false, N, C, OC, dout, OC, W, C, 1.0f, dinp, C);
  if (dW) gemm_half(h, true, false, OC, C, N, dout, OC, inp, C, 1.0f, dW, C);
  if (db) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < OC; ++o) {
      float s = 0.0f;
      for (int64_t n = 0; n < N; ++n)
        s += h == Half::bf16 ? from_bf16(dout[n * OC + o]) : from_f16(dout[n * OC + o]);
      db[o] += s;
    }
  }
}

}  // namespace loom::kernels
