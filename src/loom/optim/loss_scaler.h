// fp16 loss scaling with DeepSpeed's rules (its "fp16" config section): the loss, and so
// every gradient, is multiplied by the scale S before backward so small gradients do not
// flush to zero in fp16; the optimizer sees gradients divided by S. A step whose gradients
// hold an inf or NaN anywhere (the found-inf flag, reduced over every rank by the caller)
// is skipped: parameters and optimizer state untouched.
//   static  (loss_scale > 0): S fixed; an overflowing step is skipped all the same.
//   dynamic (loss_scale = 0): S starts at 2^initial_scale_power. An overflow uses up one
//           unit of hysteresis; once none is left, S halves (not below min_loss_scale), and
//           an overflow with S already at min_loss_scale ends the run (LossScaleError).
//           A clean step i doubles S and refills the hysteresis when its stable interval
//           i - (last overflow's step) - 1 is a positive multiple of loss_scale_window
//           (DeepSpeed's DynamicLossScaler: the first doubling after an overflow comes on
//           the window + 1-th clean step); with consecutive_hysteresis every clean step
//           refills the hysteresis.
// Every call to update() is one step (skipped or not), as DeepSpeed counts its iterations.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace loom::optim {

struct LossScaleConfig {
  double loss_scale = 0;  // 0: dynamic
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
};

// An overflow at the minimum scale: the run cannot make progress.
class LossScaleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class LossScaler {
 public:
  // What a checkpoint keeps (trainer_state.json) so a resumed run scales as the first would.
  struct State {
    double scale = 1;
    int64_t iter = 0, last_overflow_iter = -1, skipped_steps = 0;
    int hysteresis_left = 1;
  };

  explicit LossScaler(const LossScaleConfig& cfg);
  double scale() const { return st_.scale; }
  bool dynamic() const { return cfg_.loss_scale == 0; }
  // After the step's backward and the global found-inf reduction: returns true when the
  // optimizer step is to be applied (no overflow), and moves the scale by the rules above.
  bool update(bool overflow);
  int64_t skipped_steps() const { return st_.skipped_steps; }
  const State& state() const { return st_; }
  void restore(const State& s) { st_ = s; }

 private:
  LossScaleConfig cfg_;
  State st_;
};

}  // namespace loom::optim
