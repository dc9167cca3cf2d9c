// fp16 loss scaling against DeepSpeed's DynamicLossScaler rules, on scripted overflow
// patterns whose scale sequences were worked out by hand from those rules (see the table
// in each test), the minimum-scale stop, a static scale, and resuming from saved state.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/optim/loss_scaler.h"

namespace loom {
namespace {

struct Row {
  bool overflow;
  double scale_used;  // the scale the step ran with
  bool applied;
};

void run(optim::LossScaler& s, const std::vector<Row>& rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(s.scale(), rows[i].scale_used) << "step " << i;
    EXPECT_EQ(s.update(rows[i].overflow), rows[i].applied) << "step " << i;
  }
}

// hysteresis 2, window 3, start 2^4. O = overflow, C = clean; "last" = last overflow's step.
TEST(LossScaler, DynamicScaleFollowsDeepSpeed) {
  optim::LossScaleConfig c;
  c.initial_scale_power = 4;
  c.loss_scale_window = 3;
  c.hysteresis = 2;
  c.min_loss_scale = 1;
  optim::LossScaler s(c);
  run(s, {
             {true, 16, false},  // 0 O: hysteresis 2 -> 1, scale kept; last 0
             {true, 16, false},  // 1 O: hysteresis used up: 16 -> 8; last 1
             {false, 8, true},   // 2 C: stable 0
             {false, 8, true},   // 3 C: stable 1
             {false, 8, true},   // 4 C: stable 2
             {false, 8, true},   // 5 C: stable 3 = window: 8 -> 16, hysteresis refilled to 2
             {false, 16, true},  // 6 C: stable 4
             {true, 16, false},  // 7 O: hysteresis 2 -> 1; last 7
             {false, 16, true},  // 8 C: stable 0 (hysteresis stays 1: not consecutive)
             {true, 16, false},  // 9 O: 16 -> 8; last 9
             {true, 8, false},   // 10 O: 8 -> 4; last 10
             {false, 4, true},   // 11 C: stable 0
             {false, 4, true},   // 12 C: stable 1
             {false, 4, true},   // 13 C: stable 2
             {false, 4, true},   // 14 C: stable 3: 4 -> 8
             {false, 8, true},   // 15 C: stable 4
             {false, 8, true},   // 16 C: stable 5
             {false, 8, true},   // 17 C: stable 6: 8 -> 16
         });
  EXPECT_EQ(s.scale(), 16);
  EXPECT_EQ(s.skipped_steps(), 5);
}

// consecutive_hysteresis: every clean step refills the hysteresis, so isolated overflows
// never lower the scale; two in a row do.
TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  optim::LossScaleConfig c;
  c.initial_scale_power = 4;
  c.loss_scale_window = 100;
  c.hysteresis = 2;
  c.consecutive_hysteresis = true;
  optim::LossScaler s(c);
  run(s, {
             {true, 16, false},  // hysteresis 2 -> 1
             {false, 16, true},  // refilled to 2
             {true, 16, false},  // 2 -> 1
             {false, 16, true},  // refilled
             {true, 16, false},  // 2 -> 1
             {true, 16, false},  // used up: 16 -> 8
             {false, 8, true},
         });
}

TEST(LossScaler, HysteresisOneHalvesOnEveryOverflow) {
  optim::LossScaleConfig c;
  c.initial_scale_power = 3;
  c.hysteresis = 1;
  optim::LossScaler s(c);
  run(s, {{true, 8, false}, {true, 4, false}, {false, 2, true}});
}

TEST(LossScaler, OverflowAtMinimumScaleEndsTheRun) {
  optim::LossScaleConfig c;
  c.initial_scale_power = 2;
  c.hysteresis = 1;
  c.min_loss_scale = 2;
  optim::LossScaler s(c);
  EXPECT_FALSE(s.update(true));  // 4 -> 2
  EXPECT_EQ(s.scale(), 2);
  try {
    s.update(true);
    FAIL() << "no error at the minimum scale";
  } catch (const optim::LossScaleError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("minimum loss scale 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fp16.min_loss_scale"), std::string::npos) << msg;
  }
}

// Halving stops at min_loss_scale (it does not go below it) before the run ends there.
TEST(LossScaler, HalvingClampsAtTheMinimum) {
  optim::LossScaleConfig c;
  c.initial_scale_power = 2;  // 4
  c.hysteresis = 1;
  c.min_loss_scale = 3;
  optim::LossScaler s(c);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 3);
  EXPECT_THROW(s.update(true), optim::LossScaleError);
}

TEST(LossScaler, StaticScaleSkipsButNeverMoves) {
  optim::LossScaleConfig c;
  c.loss_scale = 128;
  c.loss_scale_window = 1;
  optim::LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  run(s, {{true, 128, false}, {true, 128, false}, {false, 128, true}, {false, 128, true}});
  EXPECT_EQ(s.skipped_steps(), 2);
}

// A scaler restored from another's state continues exactly as the original does.
TEST(LossScaler, RestoredStateContinuesTheSequence) {
  optim::LossScaleConfig c;
  c.initial_scale_power = 5;
  c.loss_scale_window = 2;
  c.hysteresis = 2;
  optim::LossScaler a(c), b(c);
  const std::vector<bool> pattern = {true,  false, true,  true,  false, false, false, true,
                                     false, false, false, false, true,  true,  false};
  for (size_t i = 0; i < 6; ++i) a.update(pattern[i]);
  b.restore(a.state());
  for (size_t i = 6; i < pattern.size(); ++i) {
    ASSERT_EQ(a.scale(), b.scale()) << i;
    ASSERT_EQ(a.update(pattern[i]), b.update(pattern[i])) << i;
  }
  EXPECT_EQ(a.skipped_steps(), b.skipped_steps());
}

TEST(LossScaler, BadSettingsNameTheKey) {
  auto msg = [](optim::LossScaleConfig c) {
    try {
      optim::LossScaler s(c);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  optim::LossScaleConfig c;
  c.hysteresis = 0;
  EXPECT_NE(msg(c).find("fp16.hysteresis"), std::string::npos);
  c = {};
  c.loss_scale_window = 0;
  EXPECT_NE(msg(c).find("fp16.loss_scale_window"), std::string::npos);
  c = {};
  c.min_loss_scale = 0;
  EXPECT_NE(msg(c).find("fp16.min_loss_scale"), std::string::npos);
  c = {};
  c.loss_scale = -1;
  EXPECT_NE(msg(c).find("fp16.loss_scale"), std::string::npos);
}

}  // namespace
}  // namespace loom
