// Pipeline stages (parallel/pipeline.h): how the layers are cut, checked against brute force
// for the "parameters" rule, and the config errors a bad layout gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "common/test_util.h"
#include "loom/parallel/pipeline.h"

namespace loom {
namespace {

using parallel::partition_layers;
using parallel::PipelineConfig;

PipelineConfig pp(int size, const std::string& rule = "uniform", int virtual_stages = 1) {
  PipelineConfig c;
  c.size = size;
  c.partition = rule;
  c.virtual_stages = virtual_stages;
  if (virtual_stages > 1) c.schedule = "interleaved";
  return c;
}

TEST(PipelinePartition, UniformSpreadsTheRemainder) {
  const std::vector<int64_t> w(10, 1);
  EXPECT_EQ(partition_layers(pp(2), w, 0, 0, "t"), (std::vector<int64_t>{5, 5}));
  EXPECT_EQ(partition_layers(pp(4), w, 0, 0, "t"), (std::vector<int64_t>{2, 3, 2, 3}));
  EXPECT_EQ(partition_layers(pp(3), w, 0, 0, "t"), (std::vector<int64_t>{3, 3, 4}));
  // Interleaved: size x virtual_stages chunks.
  EXPECT_EQ(partition_layers(pp(2, "uniform", 2), std::vector<int64_t>(8, 1), 0, 0, "t"),
            (std::vector<int64_t>{2, 2, 2, 2}));
}

// The largest chunk weight of a cut (embedding with the first chunk, head with the last).
int64_t worst(const std::vector<int64_t>& counts, const std::vector<int64_t>& w, int64_t first,
              int64_t last) {
  int64_t at = 0, m = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    int64_t s = std::accumulate(w.begin() + at, w.begin() + at + counts[c], int64_t{0});
    if (c == 0) s += first;
    if (c + 1 == counts.size()) s += last;
    m = std::max(m, s);
    at += counts[c];
  }
  return m;
}

// Every cut of L layers into k non-empty chunks, for brute force.
void all_cuts(int L, int k, std::vector<int64_t>& cur, std::vector<std::vector<int64_t>>& out) {
  if (k == 1) {
    cur.push_back(L);
    out.push_back(cur);
    cur.pop_back();
    return;
  }
  for (int n = 1; n <= L - (k - 1); ++n) {
    cur.push_back(n);
    all_cuts(L - n, k - 1, cur, out);
    cur.pop_back();
  }
}

TEST(PipelinePartition, ParametersRuleIsTheBestContiguousCut) {
  const std::vector<int64_t> w = {5, 1, 1, 9, 2, 2, 7, 1};
  for (int k : {2, 3, 4}) {
    for (auto [first, last] : {std::pair<int64_t, int64_t>{0, 0}, {12, 3}, {2, 20}}) {
      const std::vector<int64_t> got = partition_layers(pp(k, "parameters"), w, first, last, "t");
      ASSERT_EQ(got.size(), static_cast<size_t>(k));
      EXPECT_EQ(std::accumulate(got.begin(), got.end(), int64_t{0}), 8);
      std::vector<std::vector<int64_t>> cuts;
      std::vector<int64_t> cur;
      all_cuts(8, k, cur, cuts);
      int64_t best = INT64_MAX;
      for (const auto& c : cuts) best = std::min(best, worst(c, w, first, last));
      EXPECT_EQ(worst(got, w, first, last), best) << "k " << k << " first " << first;
    }
  }
}

TEST(PipelinePartition, ExplicitListsAndErrorsNameTheKey) {
  const std::vector<int64_t> w(6, 1);
  PipelineConfig c = pp(3);
  c.layers = {1, 3, 2};
  EXPECT_EQ(partition_layers(c, w, 0, 0, "cfg.json"), c.layers);
  c.layers = {1, 3, 1};
  EXPECT_EQ(test::error_of([&] { partition_layers(c, w, 0, 0, "cfg.json"); }),
            "cfg.json: 'pipeline_parallel.partition' sums to 5 layers, the model has 6");
  c.layers = {1, 5};
  EXPECT_EQ(test::error_of([&] { partition_layers(c, w, 0, 0, "cfg.json"); }),
            "cfg.json: 'pipeline_parallel.partition' lists 2 layer counts for 3 stages");
  c.layers = {0, 3, 3};
  EXPECT_NE(test::error_of([&] {
              partition_layers(c, w, 0, 0, "cfg.json");
            }).find("every stage needs at least one layer"),
            std::string::npos);
  EXPECT_EQ(test::error_of([&] { partition_layers(pp(4, "uniform", 2), w, 0, 0, "cfg.json"); }),
            "cfg.json: 'pipeline_parallel.size' asks for 8 stages (pipeline_parallel.size 4 x "
            "virtual_stages 2) but the model has 6 layers (every stage needs at least one)");
}

}  // namespace
}  // namespace loom
