// The schedule trace of a real pipeline job (ctest label `dist`, 4 ranks): GPT-2 with one
// layer per stage, p = 4, m = 8, two steps under 1F1B and under GPipe, traced
// (dist/job_trace.h) and read back from the file. For every stage r and step:
//   - its forwards and backwards ran in the order the schedule's rules give, derived here
//     from the rules (1F1B: warm-up min(p - r - 1, m) forwards, then one forward and one
//     backward while forwards remain, then the cool-down backwards; GPipe: every forward,
//     then every backward; backwards in micro-batch order);
//   - it held at most min(p - r, m) micro-batches at once under 1F1B (m under GPipe), and
//     that many at its peak;
//   - F_i began after F_i ended on stage r - 1, and B_i after B_i ended on stage r + 1
//     (the ranks share one machine's steady clock);
//   - each micro-batch's activations went to r + 1 and its gradient to r - 1 (isend spans
//     with their peer and micro-batch), and stage r waited for each input from r - 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>

#include "common/equivalence.h"
#include "loom/dist/job_trace.h"
#include "loom/util/trace.h"

namespace loom {
namespace {

using namespace test;  // the equivalence harness: g_world, job_dir, base_config
using nlohmann::json;

constexpr int kP = 4, kM = 8, kSteps = 2;

struct Span {
  std::string name, cat;
  double begin, end;  // microseconds
  int micro = -1, peer = -1;
};

// The spans of one stage in one step, in time order.
using StageStep = std::vector<Span>;

// trace file -> [stage][step] spans (the step's own span not included).
std::vector<std::vector<StageStep>> read_trace(const fs::path& path) {
  std::ifstream in(path);
  const json file = json::parse(in);
  std::map<int, int> stage_of;  // tid -> pp coordinate, from the track names
  for (const json& e : file["traceEvents"]) {
    if (e["ph"] != "M" || e["name"] != "thread_name") continue;
    int rank = -1, dp = -1, pp = -1, tp = -1;
    const std::string track = e["args"]["name"];
    EXPECT_EQ(std::sscanf(track.c_str(), "rank %d (dp %d, pp %d, tp %d)", &rank, &dp, &pp, &tp), 4)
        << track;
    EXPECT_EQ(rank, e["tid"].get<int>()) << track;
    stage_of[e["tid"]] = pp;
  }
  EXPECT_EQ(stage_of.size(), static_cast<size_t>(kP));
  // Step spans first (they begin first), so every other span finds its step.
  std::vector<std::vector<std::pair<double, double>>> steps(kP);
  std::vector<Span> rest;
  std::vector<int> rest_stage;
  for (const json& e : file["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int s = stage_of.at(e["tid"]);
    const double b = e["ts"], d = e["dur"];
    if (e["cat"] == "step") {
      steps[s].push_back({b, b + d});
      continue;
    }
    const json& a = e["args"];
    rest.push_back({e["name"].get<std::string>(), e["cat"].get<std::string>(), b, b + d,
                    a.value("micro", -1), a.value("peer", -1)});
    rest_stage.push_back(s);
  }
  std::vector<std::vector<StageStep>> out(kP, std::vector<StageStep>(kSteps));
  for (int s = 0; s < kP; ++s) EXPECT_EQ(steps[s].size(), static_cast<size_t>(kSteps));
  for (size_t k = 0; k < rest.size(); ++k) {
    const int s = rest_stage[k];
    for (size_t t = 0; t < std::min(steps[s].size(), out[s].size()); ++t)
      if (rest[k].begin >= steps[s][t].first && rest[k].end <= steps[s][t].second)
        out[s][t].push_back(rest[k]);
  }
  for (auto& stage : out)
    for (StageStep& st : stage)
      std::stable_sort(st.begin(), st.end(),
                       [](const Span& a, const Span& b) { return a.begin < b.begin; });
  return out;
}

// The passes of stage r by the schedule's rules (DESIGN.md, Megatron's schedules.py).
std::vector<std::string> expected_order(const std::string& schedule, int p, int r, int m) {
  std::vector<std::string> v;
  auto pass = [&](char kind, int i) {
    std::string s(1, kind);  // (+ on a literal trips GCC 12's -Wrestrict false positive)
    v.push_back(s += std::to_string(i));
  };
  auto F = [&](int i) { pass('F', i); };
  auto B = [&](int i) { pass('B', i); };
  if (schedule == "gpipe") {
    for (int i = 0; i < m; ++i) F(i);
    for (int i = 0; i < m; ++i) B(i);
    return v;
  }
  const int warmup = std::min(p - r - 1, m);
  for (int i = 0; i < warmup; ++i) F(i);
  for (int k = 0; k < m - warmup; ++k) {
    F(warmup + k);
    B(k);
  }
  for (int i = m - warmup; i < m; ++i) B(i);
  return v;
}

const Span* find(const StageStep& st, const std::string& name) {
  for (const Span& s : st)
    if (s.name == name) return &s;
  return nullptr;
}

class PipelineTrace : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineTrace, FollowsTheScheduleOnEveryStage) {
  if (g_world->size() != kP) GTEST_SKIP() << "runs on " << kP << " ranks";
  const std::string schedule = GetParam();
  json j = base_config("gpt2");
  j["model"]["n_layer"] = kP;  // one layer per stage
  j["train_batch_size"] = kM;
  j["gradient_accumulation_steps"] = kM;
  j["train_micro_batch_size_per_gpu"] = 1;
  j["pipeline_parallel"] = {{"size", kP}, {"schedule", schedule}};
  const fs::path path = job_dir() / ("trace-" + schedule + ".json");
  {
    train::TrainConfig cfg = train::parse_config(j, "test", g_world->size());
    dist::ProcessMesh mesh(*g_world, 1, kP);
    train::Trainer t(cfg, nullptr, &mesh);
    trace::enable(true);
    for (int s = 0; s < kSteps; ++s) t.step();
    trace::enable(false);
    dist::write_job_trace(mesh, path);
  }
  if (g_world->rank() != 0) return;
  const auto trace = read_trace(path);
  const double eps = 1e-3;  // microseconds: the file's times are ns / 1000 as doubles
  for (int t = 0; t < kSteps; ++t) {
    for (int r = 0; r < kP; ++r) {
      const std::string where = "step " + std::to_string(t) + ", stage " + std::to_string(r);
      const StageStep& st = trace[r][t];
      std::vector<std::string> order;
      int held = 0, peak = 0;
      for (const Span& s : st) {
        if (s.cat != "forward" && s.cat != "backward") continue;
        order.push_back(s.name);
        held += s.cat == "forward" ? 1 : -1;
        peak = std::max(peak, held);
        EXPECT_EQ(s.name.substr(1), std::to_string(s.micro)) << where;
      }
      EXPECT_EQ(order, expected_order(schedule, kP, r, kM)) << where;
      EXPECT_EQ(peak, schedule == "1f1b" ? std::min(kP - r, kM) : kM) << where;
      EXPECT_EQ(held, 0) << where;
      for (int i = 0; i < kM; ++i) {
        const std::string mi = std::to_string(i);
        const Span* f = find(st, "F" + mi);
        const Span* b = find(st, "B" + mi);
        ASSERT_TRUE(f && b) << where << ": micro-batch " << i;
        if (r > 0) {
          const Span* before = find(trace[r - 1][t], "F" + mi);
          ASSERT_TRUE(before);
          EXPECT_GE(f->begin + eps, before->end) << where << ": F" << i << " before stage r - 1's";
        }
        if (r + 1 < kP) {
          const Span* after = find(trace[r + 1][t], "B" + mi);
          ASSERT_TRUE(after);
          EXPECT_GE(b->begin + eps, after->end) << where << ": B" << i << " before stage r + 1's";
        }
        // The point-to-point traffic of micro-batch i (peers are pipeline ranks).
        auto has = [&](const std::string& name, int peer) {
          return std::any_of(st.begin(), st.end(), [&](const Span& s) {
            return s.name == name && s.peer == peer && s.micro == i;
          });
        };
        if (r + 1 < kP) {
          EXPECT_TRUE(has("isend", r + 1)) << where << ": activations of " << i;
        }
        if (r > 0) {
          EXPECT_TRUE(has("isend", r - 1)) << where << ": gradient of " << i;
          EXPECT_TRUE(has("wait irecv", r - 1)) << where << ": input of " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineTrace, ::testing::Values("1f1b", "gpipe"));

}  // namespace
}  // namespace loom

int main(int argc, char** argv) { return loom::test::run_equivalence_tests(argc, argv); }
