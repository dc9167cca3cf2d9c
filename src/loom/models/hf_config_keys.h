// Typed reads of keys in a Hugging Face config.json object; a missing or null key gives
// the default, a key of the wrong type an error naming the key and `where` (the file).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace loom::models
