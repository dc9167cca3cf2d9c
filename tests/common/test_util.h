// Shared test helpers: paths, random fills, finite-difference gradient checks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/tensor/rng.h"
#include "loom/tensor/tensor.h"
#include "loom/util/error.h"

namespace loom::test {

inline std::filesystem::path source_dir() { return LOOM_SOURCE_DIR; }
inline std::filesystem::path fixture_dir() { return source_dir() / "tests" / "fixtures"; }
inline std::string loom_binary() { return LOOM_BINARY; }

// A fresh, empty temporary directory removed when the object dies.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("loom-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// The tiny GPT-2 the run-level tests train: 2 layers, width 32, 4 heads, a byte vocabulary.
inline nlohmann::json tiny_gpt2_json() {
  return {{"arch", "gpt2"}, {"n_layer", 2},      {"n_embd", 32},
          {"n_head", 4},    {"vocab_size", 256}, {"n_positions", 32}};
}

// `n` prompt/response records (small sums), one JSON object per line.
inline void write_sft_jsonl(const std::filesystem::path& file, int n) {
  std::ofstream f(file);
  for (int i = 0; i < n; ++i)
    f << nlohmann::json{{"prompt", "what is " + std::to_string(i % 17) + " plus " +
                                       std::to_string(i % 5) + "?"},
                        {"response", "it is " + std::to_string(i % 17 + i % 5) + "."}}
             .dump()
      << "\n";
}

// ||a - b|| / ||b||
inline double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// The message of the loom::Error fn throws, or "<no error>".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

inline void fill_normal(const Tensor& t, uint64_t seed, float scale = 1.0f) {
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng_normal(seed, 7, i)) * scale;
}

inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a.f32()[i]) * b.f32()[i];
  return s;
}

// A tensor whose gradient is checked: its value is perturbed, its grad holds the
// analytic gradient after `backward` runs.
struct GradTarget {
  std::string name;
  Tensor value;
  Tensor grad;
};

// Checks backward against central differences of L = <forward(), R> along a random
// direction per target. `forward` recomputes from the current values; `backward(dout)`
// accumulates gradients into every target's grad (zeroed here first). Returns the worst
// relative error; each target's error is also checked against `tol`.
inline double gradcheck(const std::function<Tensor()>& forward,
                        const std::function<void(const Tensor&)>& backward,
                        const std::vector<GradTarget>& targets, double tol = 2e-2,
                        float eps = 1e-2f, uint64_t seed = 11) {
  Tensor out = forward();
  Tensor R = Tensor::zeros(out.shape());
  fill_normal(R, seed);
  for (auto& t : targets) t.grad.zero_();
  backward(R);
  double worst = 0;
  for (size_t k = 0; k < targets.size(); ++k) {
    const GradTarget& t = targets[k];
    Tensor v = Tensor::zeros(t.value.shape());
    fill_normal(v, seed + 100 + k);
    const double analytic = dot(t.grad, v);
    Tensor saved = Tensor::zeros(t.value.shape());
    saved.copy_from(t.value);
    float* x = t.value.f32();
    for (int64_t i = 0; i < v.numel(); ++i) x[i] = saved.f32()[i] + eps * v.f32()[i];
    const double lp = dot(forward(), R);
    for (int64_t i = 0; i < v.numel(); ++i) x[i] = saved.f32()[i] - eps * v.f32()[i];
    const double lm = dot(forward(), R);
    t.value.copy_from(saved);
    const double fd = (lp - lm) / (2.0 * eps);
    const double rel =
        std::fabs(fd - analytic) / std::max({std::fabs(fd), std::fabs(analytic), 1e-3});
    EXPECT_LT(rel, tol) << t.name << ": finite difference " << fd << " vs backward " << analytic;
    worst = std::max(worst, rel);
  }
  return worst;
}

}  // namespace loom::test
