// `loom data`'s report: rows rendered with exactly the trained text marked, and per-file
// counts that agree with the datasets the run trains on.
#include <gtest/gtest.h>

#include <fstream>

#include "common/test_util.h"
#include "loom/data/sft_dataset.h"
#include "loom/train/data_report.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string marked(const std::string& s) {
  return std::string(train::kTrainOpen) + s + train::kTrainClose;
}

TEST(DataReport, RowsShowTheTrainedTextOnly) {
  const train::TextCodec codec = train::bytes_codec();
  data::SftOptions o;
  o.seq_len = 24;
  o.chat_template = data::ChatTemplate::Plain;
  o.template_options.eos_text = "$";
  const std::vector<data::Conversation> convs = {
      {{{"user", "hi"}, {"assistant", "hello"}, {"user", "more"}, {"assistant", "ok"}}}};
  const auto ds = data::SftDataset::build(convs, codec.encode, o, "", "", nullptr);
  // Plain template: "hi\nhello$more\nok$", 17 bytes then 7 of padding (pad id 0, a byte).
  EXPECT_EQ(train::render_row(*ds, 0, codec),
            "hi\n" + marked("hello$") + "more\n" + marked("ok$") + " (+7 padding)");
  // Packed text windows: everything but the token after a document's EOS is trained.
  test::TempDir dir;
  std::ofstream(dir.path / "t.jsonl") << "{\"text\": \"abc\"}\n{\"text\": \"de\"}\n";
  train::DataConfig c;
  c.sources = {{(dir.path / "t.jsonl").string(), "auto", 1.0}};
  c.seq_len = 8;
  c.pack = true;
  const train::TrainData d = train::build_train_data(c, codec, 1);
  // "abc\n\nde\n\n": "a" starts the row (no position predicts it), "d" follows an EOS.
  EXPECT_EQ(train::render_row(*d.train, 0, codec), "a" + marked("bc\n\n") + "d" + marked("e\n\n"));
  // A mark never splits a UTF-8 character: "文" is 3 bytes, the first untrained.
  std::ofstream(dir.path / "u.jsonl") << "{\"text\": \"文a\"}\n";
  c.sources = {{(dir.path / "u.jsonl").string(), "auto", 1.0}};
  c.seq_len = 4;
  EXPECT_EQ(train::render_row(*train::build_train_data(c, codec, 1).train, 0, codec),
            "文" + marked("a\n"));
}

TEST(DataReport, CountsPerFileOfAMixture) {
  test::TempDir dir;
  std::ofstream(dir.path / "a.jsonl") << "{\"text\": \"first document\"}\n"
                                         "{\"text\": \"second\", \"meta\": 1}\n{\"text\": 7}\n";
  std::ofstream(dir.path / "b.json") << R"([{"prompt": "q1", "response": "answer one"},
                                             {"prompt": "q2", "response": "answer two"}])";
  train::TrainConfig cfg;
  cfg.data.sources = {{(dir.path / "a.jsonl").string(), "auto", 3.0},
                      {(dir.path / "b.json").string(), "auto", 1.0}};
  cfg.data.seq_len = 8;
  cfg.data.on_error = "skip";
  cfg.data.chat_template = "plain";
  cfg.data.cache_dir = (dir.path / "cache").string();
  const std::string r = train::describe_data(cfg, train::bytes_codec(), 1);
  for (const char* want : {"data: 2 files, seq_len 8", "a.jsonl: text, 75.0% of the samples",
                           "records 2 (1 malformed, skipped), documents 2 (+0 held out)",
                           "b.json: prompt_response, 25.0%", "tokens 24; training rows 2",
                           "loss on 16 of 16 row positions (100.0%)"})
    EXPECT_NE(r.find(want), std::string::npos) << "missing '" << want << "' in\n" << r;
  // b.json: rows "q1\nanswer one" + EOS "\n\n" (15 bytes, 14 positions, truncated to 8+1)
  // and the same for q2: loss on "answer o" less the 2 prompt positions, per row.
  EXPECT_NE(r.find("truncated 2, dropped 0"), std::string::npos) << r;
  EXPECT_NE(r.find("loss on 12 of 16 row positions (75.0%)"), std::string::npos) << r;
}

}  // namespace
}  // namespace loom
