// Counter-based random numbers: value = f(seed, stream, index), no hidden state.
// Why: init and (later) dropout must not depend on how tensors are split across ranks,
// so each element's random number is keyed by its logical position (parameter name
// hashed to a stream, element index within the full logical tensor).
#pragma once

#include <cstdint>
#include <string_view>

namespace loom {

// SplitMix64 finaliser: a bijective 64-bit mixer with good avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a of a name, used as a stream id.
inline uint64_t stream_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

inline uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(seed ^ mix64(stream)) + index);
}

// Uniform in (0, 1), never 0 (safe for log).
inline double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(rng_u64(seed, stream, index) >> 11) + 0.5) * 0x1.0p-53;
}

// Standard normal via Box-Muller on two independent counters (2*index, 2*index+1).
double rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace loom
