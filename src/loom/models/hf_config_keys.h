// Typed reads of keys in a Hugging Face config.json object; a missing or null key gives
// the default, a key of the wrong type an error naming the key and `where` (the file).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "loom/kernels/cpu/rope.h"
#include "loom/util/error.h"

namespace loom::models {

inline int64_t hf_int(const nlohmann::json& j, const char* key, int64_t dflt,
                      const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  LOOM_CHECK(j[key].is_number_integer() && j[key].get<int64_t>() >= 0,
             where + ": key '" + key + "' must be a non-negative integer");
  return j[key].get<int64_t>();
}

inline double hf_num(const nlohmann::json& j, const char* key, double dflt,
                     const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  LOOM_CHECK(j[key].is_number(), where + ": key '" + key + "' must be a number");
  return j[key].get<double>();
}

// Rotary settings: transformers 4.x keys (rope_theta, rope_scaling) or 5.x's
// rope_parameters {rope_type, rope_theta, factor, ...}. `json` is the scaling object as read
// (null for the default type), written back on save.
struct HfRope {
  double theta = 10000.0;
  kernels::RopeScaling scaling;
  nlohmann::json json;
};

inline HfRope hf_rope(const nlohmann::json& j, const std::string& where) {
  HfRope r;
  nlohmann::json rs = j.contains("rope_parameters") && j["rope_parameters"].is_object()
                          ? j["rope_parameters"]
                          : j.value("rope_scaling", nlohmann::json());
  r.theta = hf_num(j, "rope_theta", 10000.0, where);
  if (!rs.is_object()) return r;
  if (rs.contains("rope_theta")) r.theta = hf_num(rs, "rope_theta", 1e4, where);
  const std::string type = rs.value("rope_type", rs.value("type", std::string("default")));
  LOOM_CHECK(type == "default" || type == "linear" || type == "llama3" || type == "yarn",
             where + ": rope_scaling type '" + type +
                 "' is not supported (default, linear, llama3, yarn)");
  r.scaling.type = type;
  r.scaling.factor = hf_num(rs, "factor", 1.0, where);
  r.scaling.low_freq_factor = hf_num(rs, "low_freq_factor", 1.0, where);
  r.scaling.high_freq_factor = hf_num(rs, "high_freq_factor", 4.0, where);
  r.scaling.original_max_position_embeddings =
      hf_int(rs, "original_max_position_embeddings", 8192, where);
  if (type == "yarn") {
    LOOM_CHECK(rs.contains("original_max_position_embeddings"),
               where + ": rope_scaling type 'yarn' needs original_max_position_embeddings");
    // No factor: the ratio of the context to the pretrained one (transformers' rule).
    if (!rs.contains("factor") || rs["factor"].is_null())
      r.scaling.factor = static_cast<double>(hf_int(j, "max_position_embeddings", 0, where)) /
                         static_cast<double>(r.scaling.original_max_position_embeddings);
    r.scaling.beta_fast = hf_num(rs, "beta_fast", 32.0, where);
    r.scaling.beta_slow = hf_num(rs, "beta_slow", 1.0, where);
    r.scaling.mscale = hf_num(rs, "mscale", 0.0, where);
    r.scaling.mscale_all_dim = hf_num(rs, "mscale_all_dim", 0.0, where);
    r.scaling.attention_factor = hf_num(rs, "attention_factor", 0.0, where);
    r.scaling.truncate = rs.value("truncate", true);
  }
  if (type != "default") r.json = rs;
  return r;
}

}  // namespace loom::models
