// Several datasets in one run (data.path as a list): the sampler blends them by weight
// (shares hold at every prefix), each part walks through its own shuffled epochs, the order
// is the same on any number of ranks, and the config names a bad entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "loom/data/mixture.h"
#include "loom/data/sampler.h"
#include "loom/train/config.h"
#include "loom/train/data_setup.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kT = 4;

// n rows whose first id is tag * 1000 + row (which part, which row).
std::unique_ptr<data::Dataset> tagged(int tag, int64_t n) {
  std::vector<int32_t> ids(n * kT), tg(n * kT, 0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t t = 0; t < kT; ++t) ids[r * kT + t] = static_cast<int32_t>(tag * 1000 + r);
  return std::make_unique<data::TensorDataset>(ids, tg, kT);
}

data::MixtureDataset mix(int64_t n0, int64_t n1, double w0, double w1) {
  std::vector<std::unique_ptr<data::Dataset>> parts;
  parts.push_back(tagged(1, n0));
  parts.push_back(tagged(2, n1));
  return data::MixtureDataset(std::move(parts), {w0, w1});
}

// The run's global samples [0, steps * G) as first ids, assembled from every rank's
// micro-batches by their place in the global batch.
std::vector<int32_t> global_order(const data::Dataset& ds, int64_t mbs, int64_t accum, int64_t dp,
                                  int64_t steps) {
  const int64_t G = mbs * accum * dp;
  std::vector<int32_t> out(steps * G, -1);
  for (int64_t r = 0; r < dp; ++r) {
    const data::Sampler s(ds, 5, true, mbs, accum, dp, r);
    for (int64_t step = 0; step < steps; ++step)
      for (int64_t m = 0; m < accum; ++m) {
        const data::MicroBatch mb = s.micro_batch(step, m);
        for (int64_t i = 0; i < mbs; ++i) out[step * G + mb.batch_row + i] = mb.ids.i32()[i * kT];
      }
  }
  return out;
}

TEST(Mixture, WeightsThreeToOneHoldAtEveryPrefix) {
  const data::MixtureDataset ds = mix(50, 200, 3.0, 1.0);
  EXPECT_EQ(ds.size(), 250);
  const std::vector<int32_t> order = global_order(ds, 4, 1, 1, 1000);  // 4000 samples
  int64_t first = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    first += order[k] / 1000 == 1;
    // Megatron's blend: within one sample of the share after every sample.
    ASSERT_NEAR(first, 0.75 * (k + 1), 1.0) << "after sample " << k;
  }
  EXPECT_NEAR(first / 4000.0, 0.75, 0.02);
  // Each part goes through its own epochs: part 1 (50 rows, 3000 draws) sees every row once
  // in each run of 50 of its draws, in a different order each time; part 2 (200 rows, 1000
  // draws) likewise in runs of 200.
  std::map<int, std::vector<int32_t>> by_part;
  for (int32_t id : order) by_part[id / 1000].push_back(id % 1000);
  for (auto [part, n] : {std::pair{1, 50}, std::pair{2, 200}}) {
    const std::vector<int32_t>& rows = by_part[part];
    ASSERT_EQ(rows.size() % n, 0u);
    for (size_t e = 0; e < rows.size() / n; ++e) {
      std::vector<int32_t> epoch(rows.begin() + e * n, rows.begin() + (e + 1) * n);
      if (e == 1) {
        EXPECT_NE(epoch, std::vector<int32_t>(rows.begin(), rows.begin() + n)) << "reshuffled";
      }
      std::sort(epoch.begin(), epoch.end());
      for (int i = 0; i < n; ++i) ASSERT_EQ(epoch[i], i) << "part " << part << " epoch " << e;
    }
  }
}

TEST(Mixture, SameOrderOnOneAndThreeRanks) {
  const data::MixtureDataset ds = mix(37, 91, 3.0, 1.0);
  const std::vector<int32_t> one = global_order(ds, 4, 3, 1, 60);
  EXPECT_EQ(global_order(ds, 4, 1, 3, 60), one);
  EXPECT_EQ(global_order(ds, 2, 2, 3, 60), one);
  EXPECT_EQ(std::count(one.begin(), one.end(), -1), 0);
}

TEST(Mixture, ALongRunNeedsNoWholeHistory) {
  // The sampler keeps a window of the blend; asking far ahead, then behind the window, gives
  // what a fresh sampler gives.
  const data::MixtureDataset ds = mix(7, 13, 1.0, 2.0);
  const data::Sampler walked(ds, 9, true, 1, 1, 1, 0);
  for (int64_t k = 0; k < 400000; k += 997) walked.sample_at(k);
  for (int64_t k : {int64_t{399999}, int64_t{5}, int64_t{123456}}) {
    const data::Sampler fresh(ds, 9, true, 1, 1, 1, 0);
    EXPECT_EQ(walked.sample_at(k), fresh.sample_at(k)) << k;
  }
}

TEST(Mixture, PackedAndUnpackedPartsTogether) {
  // A packed part gives its positions; an unpacked one 0..T-1.
  test::TempDir dir;
  std::ofstream(dir.path / "a.jsonl")
      << "{\"text\": \"ab\"}\n{\"text\": \"cde\"}\n{\"text\": \"f\"}\n{\"text\": \"gh\"}\n";
  std::ofstream(dir.path / "b.jsonl") << "{\"prompt\": \"q\", \"response\": \"ans\"}\n";
  train::DataConfig c;
  c.sources = {{(dir.path / "a.jsonl").string(), "auto", 1.0},
               {(dir.path / "b.jsonl").string(), "auto", 1.0}};
  c.seq_len = kT;
  c.pack = true;
  c.cache_dir = (dir.path / "cache").string();
  const train::TrainData d = train::build_train_data(c, train::bytes_codec(), 1);
  ASSERT_TRUE(d.train->packed());
  const auto parts = d.train->parts();
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_DOUBLE_EQ(parts[0].weight, 0.5);
  std::vector<int32_t> ids(kT), tg(kT), pos(kT);
  // The stream "ab\n\ncde\n\nf\n\ngh\n\n": window 2 is "\nf\n\n", restarting at "f".
  parts[0].dataset->get_positions(2, pos.data());
  parts[0].dataset->get(2, ids.data(), tg.data());
  EXPECT_EQ(std::string(ids.begin(), ids.end()), "\nf\n\n");
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 0, 1, 2}));
  parts[1].dataset->get_positions(0, pos.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(d.sources.size(), 2u);
  EXPECT_EQ(d.sources[0].format, "text");
  EXPECT_EQ(d.sources[1].format, "prompt_response");
  EXPECT_NE(d.summary.find("mixture of 2 datasets"), std::string::npos) << d.summary;
  EXPECT_NE(d.summary.find("share 50.0%"), std::string::npos) << d.summary;
}

train::TrainConfig parse(const json& data) {
  return train::parse_config({{"model", "m"}, {"data", data}}, "cfg.json", 1);
}

TEST(Mixture, ConfigListsAndNamesBadEntries) {
  const train::TrainConfig c =
      parse({{"path", json::array({{{"path", "a.jsonl"}, {"weight", 3}},
                                   {{"path", "b.txt"}, {"format", "text"}}})},
             {"format", "sharegpt"}});
  ASSERT_EQ(c.data.sources.size(), 2u);
  EXPECT_EQ(c.data.sources[0].format, "sharegpt");  // data.format is the default
  EXPECT_EQ(c.data.sources[0].weight, 3.0);
  EXPECT_EQ(c.data.sources[1].format, "text");
  EXPECT_EQ(c.data.sources[1].weight, 1.0);
  const auto err = [](const json& data) { return test::error_of([&] { parse(data); }); };
  for (const json& w : {json(0), json(-1), json("3")}) {
    const std::string e =
        err({{"path", json::array({{{"path", "a"}}, {{"path", "b"}, {"weight", w}}})}});
    EXPECT_NE(e.find("cfg.json: config key 'data.path[1].weight' must be"), std::string::npos) << e;
  }
  EXPECT_NE(err({{"path", json::array({{{"path", "a"}, {"wieght", 2}}})}})
                .find("unknown config key 'data.path[0].wieght'"),
            std::string::npos);
  EXPECT_NE(err({{"path", json::array({{{"path", "a"}, {"format", "csv"}}})}})
                .find("'data.path[0].format': 'csv' is not one of"),
            std::string::npos);
  EXPECT_NE(err({{"path", json::array()}}).find("an empty list of datasets"), std::string::npos);
  EXPECT_NE(
      err({{"path", json::array({{{"format", "text"}}})}}).find("'data.path[0].path' is required"),
      std::string::npos);
}

}  // namespace
}  // namespace loom
