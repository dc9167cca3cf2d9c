#include "loom/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "loom/util/error.h"

namespace loom::optim {

namespace {

double warmup_gamma(int64_t s, int64_t warmup, bool log_type) {
  if (log_type) return std::log(static_cast<double>(s + 1)) / std::log(static_cast<double>(warmup));
  return static_cast<double>(s) / static_cast<double>(warmup);
}

}  // namespace

Schedule Schedule::from_json(const nlohmann::json& j, double base_lr, int64_t train_steps) {
  Schedule s;
  s.base_lr = base_lr;
  s.warmup_max_lr = base_lr;
  s.total_num_steps = train_steps;
  if (j.is_null()) return s;
  LOOM_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
             "config key 'scheduler' must be an object with a string 'type'");
  for (auto& [k, v] : j.items())
    LOOM_CHECK(k == "type" || k == "params", "unknown config key 'scheduler." + k + "'");
  s.type = j["type"].get<std::string>();
  static const std::set<std::string> kTypes = {"none", "WarmupLR", "WarmupDecayLR",
                                               "WarmupCosineLR"};
  LOOM_CHECK(kTypes.count(s.type), "config key 'scheduler.type': unknown schedule '" + s.type +
                                       "' (known: none, WarmupLR, WarmupDecayLR, WarmupCosineLR)");
  nlohmann::json p = j.value("params", nlohmann::json::object());
  LOOM_CHECK(p.is_object(), "config key 'scheduler.params' must be an object");
  std::set<std::string> allowed = {"warmup_num_steps", "warmup_type"};
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR")
    allowed.insert({"warmup_min_lr", "warmup_max_lr"});
  if (s.type == "WarmupDecayLR" || s.type == "WarmupCosineLR") allowed.insert("total_num_steps");
  if (s.type == "WarmupCosineLR") allowed.insert({"warmup_min_ratio", "cos_min_ratio"});
  for (auto& [k, v] : p.items()) {
    LOOM_CHECK(allowed.count(k), "unknown config key 'scheduler.params." + k + "' for " + s.type);
    if (k == "warmup_type") {
      LOOM_CHECK(v.is_string() && (v == "log" || v == "linear"),
                 "config key 'scheduler.params.warmup_type' must be \"log\" or \"linear\"");
    } else {
      LOOM_CHECK(v.is_number(), "config key 'scheduler.params." + k + "' must be a number");
    }
  }
  // DeepSpeed's defaults.
  s.warmup_num_steps = p.value("warmup_num_steps", int64_t{1000});
  s.warmup_log = p.value("warmup_type", std::string("log")) == "log";
  s.warmup_min_lr = p.value("warmup_min_lr", 0.0);
  s.warmup_max_lr = p.value("warmup_max_lr", base_lr);
  s.total_num_steps = p.value("total_num_steps", train_steps);
  s.warmup_min_ratio = p.value("warmup_min_ratio", 0.0);
  s.cos_min_ratio = p.value("cos_min_ratio", 1e-4);
  LOOM_CHECK(s.warmup_num_steps >= 0, "config key 'scheduler.params.warmup_num_steps' < 0");
  if (s.warmup_log && s.warmup_num_steps == 1) s.warmup_log = false;  // log(1) = 0
  if (s.type != "WarmupLR")
    LOOM_CHECK(s.total_num_steps > s.warmup_num_steps || s.type == "none",
               "config key 'scheduler.params.total_num_steps' (" +
                   std::to_string(s.total_num_steps) + ") must exceed warmup_num_steps (" +
                   std::to_string(s.warmup_num_steps) + ")");
  return s;
}

double Schedule::lr_at(int64_t step) const {
  if (type == "none") return base_lr;
  const bool warming = step < warmup_num_steps;
  if (type == "WarmupCosineLR") {
    double ratio;
    if (warming) {
      ratio = warmup_min_ratio +
              (1.0 - warmup_min_ratio) * warmup_gamma(step, warmup_num_steps, warmup_log);
    } else {
      const double done = static_cast<double>(step - warmup_num_steps + 1) /
                          static_cast<double>(total_num_steps - warmup_num_steps);
      ratio = std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * 0.5 *
                                                (1.0 + std::cos(M_PI * std::min(done, 1.0))));
    }
    return base_lr * ratio;
  }
  double gamma = 1.0;
  if (warming) {
    gamma = warmup_gamma(step, warmup_num_steps, warmup_log);
  } else if (type == "WarmupDecayLR") {
    gamma =
        std::max(0.0, static_cast<double>(total_num_steps - step) /
                          std::max(1.0, static_cast<double>(total_num_steps - warmup_num_steps)));
  }
  return warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma;
}

}  // namespace loom::optim
