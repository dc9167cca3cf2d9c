#include "loom/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "loom/util/error.h"

namespace loom::optim {

LossScaler::LossScaler(const LossScaleConfig& cfg) : cfg_(cfg) {
  LOOM_CHECK(cfg.loss_scale >= 0 && std::isfinite(cfg.loss_scale), "fp16.loss_scale must be >= 0");
  LOOM_CHECK(cfg.hysteresis >= 1, "fp16.hysteresis must be >= 1");
  LOOM_CHECK(cfg.loss_scale_window >= 1, "fp16.loss_scale_window must be >= 1");
  LOOM_CHECK(cfg.min_loss_scale > 0, "fp16.min_loss_scale must be > 0");
  LOOM_CHECK(cfg.initial_scale_power >= 0 && cfg.initial_scale_power <= 64,
             "fp16.initial_scale_power must be in [0, 64]");
  st_.scale = dynamic() ? std::ldexp(1.0, cfg.initial_scale_power) : cfg.loss_scale;
  st_.hysteresis_left = cfg.hysteresis;
}

bool LossScaler::update(bool overflow) {
  const int64_t iter = st_.iter++;
  if (overflow) ++st_.skipped_steps;
  if (!dynamic()) return !overflow;
  if (overflow) {
    if (st_.hysteresis_left <= 1) {
      if (st_.scale <= cfg_.min_loss_scale) {
        char msg[256];
        std::snprintf(
            msg, sizeof msg,
            "fp16: gradients overflowed at the minimum loss scale %g (fp16.min_loss_scale)"
            " at step %lld; the run cannot continue in fp16 (try bf16, a lower learning"
            " rate, or a smaller min_loss_scale)",
            st_.scale, static_cast<long long>(iter + 1));
        throw LossScaleError(msg);
      }
      st_.scale = std::max(st_.scale / 2, cfg_.min_loss_scale);
    } else {
      --st_.hysteresis_left;
    }
    st_.last_overflow_iter = iter;
    return false;
  }
  if (cfg_.consecutive_hysteresis) st_.hysteresis_left = cfg_.hysteresis;
  // Clean steps since the last overflow, this one excluded (DeepSpeed's stable interval).
  const int64_t stable = iter - st_.last_overflow_iter - 1;
  if (stable > 0 && stable % cfg_.loss_scale_window == 0) {
    st_.hysteresis_left = cfg_.hysteresis;
    st_.scale *= 2;
  }
  return true;
}

}  // namespace loom::optim
