// SFT rows: loss only on assistant tokens, truncation and drop counts, packing positions,
// and the on-disk token cache (reused when the key matches, rebuilt when it does not or the
// file is damaged). Bytes stand in for a tokenizer here.
#include <gtest/gtest.h>

#include <fstream>

#include "common/test_util.h"
#include "loom/data/sft_dataset.h"
#include "loom/kernels/cpu/cross_entropy.h"

namespace loom {
namespace {

using data::Conversation;

std::vector<int32_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::vector<Conversation> convs() {
  return {Conversation{{{"user", "ab"}, {"assistant", "XY"}}},
          Conversation{{{"user", "c"}, {"assistant", "Z"}}},
          Conversation{{{"user", std::string(50, 'q')}, {"assistant", "W"}}}};
}

data::SftOptions opts(int64_t T, bool pack) {
  data::SftOptions o;
  o.seq_len = T;
  o.pack = pack;
  o.chat_template = data::ChatTemplate::Plain;
  o.template_options.eos_text = "$";
  o.pad_id = 0;
  return o;
}

TEST(SftDataset, TargetsOnlyOnAssistantText) {
  data::SftStats st;
  auto ds = data::SftDataset::build(convs(), bytes, opts(8, false), {}, "", &st);
  // Conversation 3: the prompt fills all 9 tokens, nothing trainable survives truncation.
  EXPECT_EQ(st.dropped, 1);
  EXPECT_EQ(st.truncated, 1);
  ASSERT_EQ(ds->size(), 2);
  std::vector<int32_t> ids(8), tg(8);
  ds->get(0, ids.data(), tg.data());
  // "ab\nXY$": ids a b \n X Y, targets: predict X, Y, $ only.
  const std::vector<int32_t> want_ids = {'a', 'b', '\n', 'X', 'Y', 0, 0, 0};
  const int32_t I = kernels::kIgnoreIndex;
  const std::vector<int32_t> want_tg = {I, I, 'X', 'Y', '$', I, I, I};
  EXPECT_EQ(ids, want_ids);
  EXPECT_EQ(tg, want_tg);
  EXPECT_EQ(st.target_tokens, 3 + 2);
}

TEST(SftDataset, PackingRestartsPositions) {
  auto ds = data::SftDataset::build(convs(), bytes, opts(16, true), {}, "", nullptr);
  ASSERT_TRUE(ds->packed());
  ASSERT_EQ(ds->size(), 1);  // 5 + 3 tokens fit one row of 16
  std::vector<int32_t> pos(16), ids(16), tg(16);
  ds->get(0, ids.data(), tg.data());
  ds->get_positions(0, pos.data());
  const std::vector<int32_t> want = {0, 1, 2, 3, 4, 0, 1, 2, 8, 9, 10, 11, 12, 13, 14, 15};
  EXPECT_EQ(pos, want);
  EXPECT_EQ(ids[5], 'c');
  EXPECT_EQ(tg[4], '$');  // the last target of sample 1 is its own eos, not sample 2's start
}

TEST(SftDataset, CacheIsReusedOnlyForTheSameKey) {
  test::TempDir d;
  const auto f = d.path / "cache" / "rows.bin";
  int calls = 0;
  data::EncodeFn counting = [&](const std::string& s) {
    ++calls;
    return bytes(s);
  };
  data::SftStats a, b, c;
  auto d1 = data::SftDataset::build(convs(), counting, opts(8, false), f, "k1", &a);
  const int first_calls = calls;
  auto d2 = data::SftDataset::build(convs(), counting, opts(8, false), f, "k1", &b);
  EXPECT_FALSE(a.from_cache);
  EXPECT_TRUE(b.from_cache);
  EXPECT_EQ(calls, first_calls);  // not tokenized again
  EXPECT_EQ(b.target_tokens, a.target_tokens);
  EXPECT_EQ(b.truncated, a.truncated);
  std::vector<int32_t> i1(8), t1(8), i2(8), t2(8);
  d1->get(1, i1.data(), t1.data());
  d2->get(1, i2.data(), t2.data());
  EXPECT_EQ(i1, i2);
  EXPECT_EQ(t1, t2);
  data::SftDataset::build(convs(), counting, opts(8, false), f, "k2", &c);
  EXPECT_FALSE(c.from_cache);
  // A damaged cache file is ignored and rewritten.
  std::filesystem::resize_file(f, 20);
  data::SftStats e;
  data::SftDataset::build(convs(), counting, opts(8, false), f, "k2", &e);
  EXPECT_FALSE(e.from_cache);
}

TEST(SftDataset, ValidationSplitIsDeterministicAndDisjoint) {
  std::vector<Conversation> all;
  for (int i = 0; i < 200; ++i)
    all.push_back(Conversation{{{"user", std::to_string(i)}, {"assistant", "a"}}});
  auto t1 = all, t2 = all;
  std::vector<Conversation> v1, v2;
  data::split_validation(t1, v1, 0.1, 7);
  data::split_validation(t2, v2, 0.1, 7);
  EXPECT_EQ(t1.size() + v1.size(), 200u);
  EXPECT_EQ(v1.size(), v2.size());
  EXPECT_GT(v1.size(), 5u);
  EXPECT_LT(v1.size(), 40u);
  EXPECT_EQ(v1[0].messages[0].content, v2[0].messages[0].content);
}

}  // namespace
}  // namespace loom
