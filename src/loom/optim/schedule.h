// Learning-rate schedules with DeepSpeed's names and meanings. lr_at(s) is the rate for
// optimizer step s (0-based), i.e. DeepSpeed's last_batch_iteration == s.
//   none           : base lr
//   WarmupLR       : warmup_min_lr -> warmup_max_lr over warmup_num_steps, then flat
//   WarmupDecayLR  : as WarmupLR, then linear decay to 0 at total_num_steps
//   WarmupCosineLR : ratio of the optimizer lr; warmup from warmup_min_ratio to 1, then
//                    cosine to cos_min_ratio at total_num_steps
// warmup_type "log" (DeepSpeed's default) or "linear".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::optim {

struct Schedule {
  std::string type = "none";
  double base_lr = 1e-3;  // the optimizer's lr
  double warmup_min_lr = 0.0, warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 0, total_num_steps = 0;
  double warmup_min_ratio = 0.0, cos_min_ratio = 1e-4;
  bool warmup_log = true;

  // From DeepSpeed's {"type": ..., "params": {...}}; unknown keys are errors naming them.
  static Schedule from_json(const nlohmann::json& j, double base_lr, int64_t train_steps);
  double lr_at(int64_t step) const;
};

}  // namespace loom::optim
