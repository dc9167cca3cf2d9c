// Pipeline schedules (parallel/pipeline_schedule.h): every stage's order of forwards and
// backwards against the rules of GPipe and 1F1B, the activations each holds, and that the
// stages together always finish when only receives wait (a simulation of the whole
// pipeline for every p <= 8, m <= 20, and v <= 4 chunks per rank interleaved).
#include <gtest/gtest.h>

#include <algorithm>

#include "common/test_util.h"
#include "loom/parallel/pipeline_schedule.h"

namespace loom {
namespace {

using parallel::Pass;
using parallel::stage_schedule;

TEST(PipelineSchedule, OneFOneBOnFourStagesReadsAsMegatrons) {
  EXPECT_EQ(parallel::schedule_str(stage_schedule("1f1b", 4, 0, 8)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(parallel::schedule_str(stage_schedule("1f1b", 4, 3, 8)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  EXPECT_EQ(parallel::schedule_str(stage_schedule("1f1b", 4, 1, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(parallel::schedule_str(stage_schedule("gpipe", 2, 1, 3)), "F0 F1 F2 B0 B1 B2");
}

// Megatron's interleaved order by hand for p = 2, v = 2, m = 4 (".1": chunk 1): groups of
// p micro-batches through chunk 0 then 1 forward, 1 then 0 backward; rank 0 warms up with
// (p - 1) * 2 + (v - 1) * p = 4 passes, rank 1 with 2.
TEST(PipelineSchedule, InterleavedReadsAsMegatrons) {
  EXPECT_EQ(parallel::schedule_str(stage_schedule("interleaved", 2, 0, 4, 2)),
            "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3");
  EXPECT_EQ(parallel::schedule_str(stage_schedule("interleaved", 2, 1, 4, 2)),
            "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3");
  // m = p: every forward first.
  EXPECT_EQ(parallel::schedule_str(stage_schedule("interleaved", 2, 1, 2, 2)),
            "F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1");
}

TEST(PipelineSchedule, EveryStageFollowsItsRules) {
  for (const std::string kind : {"gpipe", "1f1b"}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 20; ++m) {
        for (int r = 0; r < p; ++r) {
          const std::vector<Pass> s = stage_schedule(kind, p, r, m);
          const std::string at = kind + " p" + std::to_string(p) + " r" + std::to_string(r) + " m" +
                                 std::to_string(m) + ": " + parallel::schedule_str(s);
          ASSERT_EQ(s.size(), 2u * m) << at;
          int next_f = 0, next_b = 0;
          for (const Pass& x : s) {  // both kinds in micro-batch order; B_i after F_i
            if (x.kind == Pass::Forward) {
              ASSERT_EQ(x.micro, next_f++) << at;
            } else {
              ASSERT_EQ(x.micro, next_b++) << at;
              ASSERT_LT(x.micro, next_f) << at;
            }
          }
          if (kind == "1f1b") {
            const int warmup = std::min(p - r - 1, m);
            for (int i = 0; i < warmup; ++i) EXPECT_EQ(s[i].kind, Pass::Forward) << at;
            // Then one forward, one backward (B0 right after the first steady forward).
            const size_t b0 = warmup < m ? warmup + 1 : m;
            EXPECT_EQ(s[b0], (Pass{Pass::Backward, 0})) << at;
            EXPECT_EQ(parallel::max_in_flight(s), std::min(p - r, m)) << at;
          } else {
            EXPECT_EQ(parallel::max_in_flight(s), m) << at;
          }
        }
      }
    }
  }
}

// All stages at once: a forward on r > 0 waits for r - 1's forward of the same micro-batch,
// a backward on r < p - 1 for r + 1's backward of it; sends never wait (they are posted
// non-blocking, and every receive of the step is posted up front). Every stage must finish.
// Interleaved: chunk c of rank r is the model's chunk c * p + r; its input comes from the
// model chunk before (rank r - 1's chunk c, or rank p - 1's chunk c - 1).
TEST(PipelineSchedule, StagesNeverDeadlock) {
  for (const std::string kind : {"gpipe", "1f1b", "interleaved"}) {
    for (int v : kind == "interleaved" ? std::vector<int>{2, 3, 4} : std::vector<int>{1}) {
      for (int p = kind == "interleaved" ? 2 : 1; p <= 8; ++p) {
        for (int m = 1; m <= 20; ++m) {
          if (kind == "interleaved" && m % p != 0) continue;
          std::vector<std::vector<Pass>> s(p);
          for (int r = 0; r < p; ++r) s[r] = stage_schedule(kind, p, r, m, v);
          // done[model chunk][micro-batch]: forward / backward finished.
          const int chunks = p * v;
          std::vector<std::vector<bool>> fwd(chunks, std::vector<bool>(m)), bwd = fwd;
          std::vector<size_t> at(p, 0);
          for (bool moved = true; moved;) {
            moved = false;
            for (int r = 0; r < p; ++r) {
              while (at[r] < s[r].size()) {
                const Pass x = s[r][at[r]];
                const int g = x.chunk * p + r;  // the model chunk
                const bool ready =
                    x.kind == Pass::Forward
                        ? (g == 0 || fwd[g - 1][x.micro])
                        : (g == chunks - 1 ? bool(fwd[g][x.micro]) : bool(bwd[g + 1][x.micro]));
                if (!ready) break;
                (x.kind == Pass::Forward ? fwd : bwd)[g][x.micro] = true;
                ++at[r];
                moved = true;
              }
            }
          }
          for (int r = 0; r < p; ++r)
            ASSERT_EQ(at[r], s[r].size()) << kind << " p" << p << " v" << v << " m" << m
                                          << ": stage " << r << " stuck at pass " << at[r];
        }
      }
    }
  }
}

// Every (chunk, micro-batch) once forward and once backward, each chunk's backwards in
// micro-batch order and after their forwards; Megatron's warm-up.
TEST(PipelineSchedule, InterleavedCoversEveryChunkOnce) {
  for (int p = 2; p <= 6; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 4 * p; m += p) {
        for (int r = 0; r < p; ++r) {
          const std::vector<Pass> s = stage_schedule("interleaved", p, r, m, v);
          // (appended piecewise: GCC 12 warns falsely (-Wrestrict) on "p" + std::to_string(p))
          std::string at = "p";
          for (const auto& [tag, n] : {std::pair{"", p}, {" v", v}, {" m", m}, {" r", r}})
            at += tag + std::to_string(n);
          ASSERT_EQ(s.size(), 2u * m * v) << at;
          std::vector<int> next_b(v, 0);
          std::vector<std::vector<bool>> fwd(v, std::vector<bool>(m));
          for (const Pass& x : s) {
            if (x.kind == Pass::Forward) {
              ASSERT_FALSE(fwd[x.chunk][x.micro]) << at;
              fwd[x.chunk][x.micro] = true;
            } else {
              ASSERT_EQ(x.micro, next_b[x.chunk]++) << at;
              ASSERT_TRUE(fwd[x.chunk][x.micro]) << at;
            }
          }
          const int warmup = m == p ? m * v : std::min((p - r - 1) * 2 + (v - 1) * p, m * v);
          for (int i = 0; i < warmup; ++i) EXPECT_EQ(s[i].kind, Pass::Forward) << at;
          if (warmup < m * v) {
            EXPECT_EQ(s[warmup + 1].kind, Pass::Backward) << at;
          }
        }
      }
    }
  }
  EXPECT_NE(test::error_of([] {
              stage_schedule("interleaved", 2, 0, 3, 2);
            }).find("gradient_accumulation_steps 3 must be a multiple"),
            std::string::npos);
}

TEST(PipelineSchedule, BadInputIsNamed) {
  EXPECT_NE(test::error_of([] { stage_schedule("zigzag", 2, 0, 4); }).find("'zigzag'"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { stage_schedule("1f1b", 2, 2, 4); }).find("out of range"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
