// What a run leaves to watch it by: TensorBoard event files and DeepSpeed's CSV files with
// every scalar at every step (train/monitor.h), a resumed run reading as one, `loom report`'s
// page (train/report.h) and the progress bars (util/progress.h), shown only on a terminal.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "common/ref_python.h"
#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/tb_event.pb.h"
#include "loom/io/tb_events.h"
#include "loom/train/report.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Result {
  int code;
  std::string output;
};

Result run(const std::string& cmd) {
  auto [code, out] = test::run_command(cmd);
  return {code, out};
}

std::string slurp(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A tiny GPT-2 SFT job on prompt/response pairs, bytes as tokens; eval every 2 steps.
fs::path write_job(const fs::path& dir, const std::string& name, json extra = json::object()) {
  const fs::path data = dir / "sft.jsonl";
  if (!fs::exists(data)) test::write_sft_jsonl(data, 120);
  json j = {
      {"model", test::tiny_gpt2_json()},
      {"data",
       {{"path", data.string()}, {"tokenizer", "bytes"}, {"seq_len", 32}, {"valid_fraction", 0.1}}},
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", 2},
      {"train_steps", 6},
      {"eval_interval", 2},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}}}}},
      {"output_dir", (dir / name).string()}};
  j.merge_patch(extra);
  const fs::path cfg = dir / (name + ".json");
  io::write_json_file(cfg, j);
  return cfg;
}

std::vector<json> metrics_rows(const fs::path& out) {
  std::vector<json> rows;
  std::ifstream f(out / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) rows.push_back(json::parse(line));
  return rows;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("events.out.tfevents.")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TbEvents, Crc32cIsCastagnolisWithTfRecordsMask) {
  // The standard check value of CRC-32C over "123456789".
  EXPECT_EQ(io::crc32c("123456789", 9), 0xE3069283u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(io::masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TbEvents, RecordsRoundTripAndDamageIsNamed) {
  test::TempDir tmp;
  fs::path file;
  {
    io::TbEventWriter w(tmp.path / "tb");
    w.scalars(8, {{"a/x", 1.5}, {"a/y", -2.0}});
    w.scalars(16, {{"a/x", 0.25}});
    file = w.path();
  }
  const std::vector<io::TbScalar> s = io::read_tb_scalars(file);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].step, 8);
  EXPECT_EQ(s[0].tag, "a/x");
  EXPECT_EQ(s[0].value, 1.5f);
  EXPECT_EQ(s[1].value, -2.0f);
  EXPECT_EQ(s[2].step, 16);
  const std::string bytes = slurp(file);
  {  // a flipped bit in the last payload
    std::string bad = bytes;
    bad[bad.size() - 6] ^= 1;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bad;
    const std::string err = test::error_of([&] { io::read_tfrecords(file); });
    EXPECT_NE(err.find(file.string() + ": record at byte"), std::string::npos) << err;
    EXPECT_NE(err.find("payload's CRC does not match"), std::string::npos) << err;
  }
  {  // cut short
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 3);
    const std::string err = test::error_of([&] { io::read_tfrecords(file); });
    EXPECT_NE(err.find("is truncated"), std::string::npos) << err;
  }
}

// Every scalar of every step reaches the event file and the CSV files, with DeepSpeed's names
// and x axis (samples = step x train_batch_size); the values are metrics.jsonl's.
TEST(Monitor, EveryScalarAtEveryStepInTensorBoardAndCsv) {
  test::TempDir tmp;
  const fs::path cfg = write_job(
      tmp.path, "run",
      {{"tensorboard", {{"enabled", true}}},
       {"csv_monitor",
        {{"enabled", true}, {"output_path", (tmp.path / "csv").string()}, {"job_name", "sft"}}}});
  const Result r = run(test::loom_binary() + " train " + cfg.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const int64_t B = 4;
  std::map<std::pair<std::string, int64_t>, double> want;  // (tag, samples) -> value
  for (const json& row : metrics_rows(tmp.path / "run")) {
    if (!row.contains("step")) continue;
    const int64_t x = row["step"].get<int64_t>() * B;
    if (row.contains("loss")) {
      want[{"Train/Samples/train_loss", x}] = row["loss"];
      want[{"Train/Samples/lr", x}] = row["lr"];
      want[{"Train/Samples/grad_norm", x}] = row["grad_norm"];
      want[{"Train/Samples/tokens_per_s", x}] = row["tokens_per_s"];
      want[{"Train/Samples/rss_mib_rank0", x}] = row["rss_bytes"][0].get<double>() / 1048576.0;
    }
    if (row.contains("eval_loss")) want[{"Train/Samples/eval_loss", x}] = row["eval_loss"];
  }
  ASSERT_EQ(want.size(), 6u * 5 + 4);  // 6 steps x 5 scalars, eval at steps 0, 2, 4, 6

  const std::vector<fs::path> files = event_files(tmp.path / "run" / "DeepSpeedJobName");
  ASSERT_EQ(files.size(), 1u);
  std::map<std::pair<std::string, int64_t>, float> got;
  for (const io::TbScalar& s : io::read_tb_scalars(files[0])) got[{s.tag, s.step}] = s.value;
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, v] : want) {
    ASSERT_TRUE(got.count(key)) << key.first << " at " << key.second;
    EXPECT_EQ(got[key], static_cast<float>(v)) << key.first << " at " << key.second;
  }

  // csv_monitor: one file per scalar, named as DeepSpeed names them, "step,<name>" rows.
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.path / "csv" / "sft"))
    names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{
                       "Train_Samples_train_loss.csv", "Train_Samples_lr.csv",
                       "Train_Samples_grad_norm.csv", "Train_Samples_tokens_per_s.csv",
                       "Train_Samples_rss_mib_rank0.csv", "Train_Samples_eval_loss.csv"}));
  size_t rows = 0;
  for (const std::string& n : names) {
    std::ifstream f(tmp.path / "csv" / "sft" / n);
    std::string line;
    std::getline(f, line);
    const std::string tag = "Train/Samples/" + n.substr(14, n.size() - 18);
    EXPECT_EQ(line, "step," + tag.substr(14) + "\r");
    while (std::getline(f, line)) {
      const size_t comma = line.find(',');
      const int64_t x = std::stoll(line.substr(0, comma));
      const auto key = std::make_pair(tag, x);
      ASSERT_TRUE(want.count(key)) << n << ": " << line;
      EXPECT_EQ(std::stod(line.substr(comma + 1)), want[key]) << n << ": " << line;
      ++rows;
    }
  }
  EXPECT_EQ(rows, want.size());
}

// A run stopped after step 4 and resumed from its step-2 checkpoint: metrics.jsonl and the
// CSV files hold each step once (the resumed run's), and the new event file opens with
// TensorBoard's SessionLog START past the checkpoint, so its loader drops the stale steps.
TEST(Monitor, AResumedRunReadsAsOneRun) {
  test::TempDir tmp;
  const json mon = {{"tensorboard", {{"enabled", true}}},
                    {"csv_monitor", {{"enabled", true}}},
                    {"checkpoint_interval", 2}};
  json first = mon;
  first["train_steps"] = 4;
  ASSERT_EQ(run(test::loom_binary() + " train " + write_job(tmp.path, "run", first).string()).code,
            0);
  json second = mon;
  second["resume_from"] = (tmp.path / "run" / "checkpoint-2").string();
  const Result r =
      run(test::loom_binary() + " train " + write_job(tmp.path, "run", second).string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<int64_t> steps, evals;
  for (const json& row : metrics_rows(tmp.path / "run")) {
    if (row.contains("loss")) steps.push_back(row["step"]);
    if (row.contains("eval_loss")) evals.push_back(row["step"]);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(evals, (std::vector<int64_t>{0, 2, 4, 6}));
  std::vector<int64_t> xs;
  std::ifstream csv(tmp.path / "run" / "DeepSpeedJobName" / "Train_Samples_train_loss.csv");
  std::string line;
  std::getline(csv, line);
  while (std::getline(csv, line)) xs.push_back(std::stoll(line));
  EXPECT_EQ(xs, (std::vector<int64_t>{4, 8, 12, 16, 20, 24}));
  const std::vector<fs::path> files = event_files(tmp.path / "run" / "DeepSpeedJobName");
  ASSERT_EQ(files.size(), 2u);
  const std::vector<std::string> recs = io::read_tfrecords(files[1]);
  ASSERT_GE(recs.size(), 2u);
  loom::tb::Event e;
  ASSERT_TRUE(e.ParseFromString(recs[1]));
  EXPECT_EQ(e.session_log().status(), loom::tb::SessionLog::START);
  EXPECT_EQ(e.step(), 2 * 4 + 1);
}

// The points of one <path d="M..L.."> as (x, y).
std::vector<std::pair<double, double>> points_of(const std::string& d) {
  std::vector<std::pair<double, double>> out;
  static const std::regex pt(R"([ML](-?[0-9.]+),(-?[0-9.]+))");
  for (auto it = std::sregex_iterator(d.begin(), d.end(), pt); it != std::sregex_iterator(); ++it)
    out.emplace_back(std::stod((*it)[1]), std::stod((*it)[2]));
  return out;
}

std::string attr(const std::string& tag, const std::string& name) {
  const std::regex re(" " + name + "=\"([^\"]*)\"");
  std::smatch m;
  return std::regex_search(tag, m, re) ? m[1].str() : std::string();
}

// `loom report A B`: every chart is there, each run's train-loss curve has a point per step
// at that step's x, eval loss and memory per rank are drawn, and both configs are shown.
TEST(Report, PageHoldsEveryCurveSpanningTheSteps) {
  test::TempDir tmp;
  ASSERT_EQ(run(test::loom_binary() + " train " + write_job(tmp.path, "full").string()).code, 0);
  ASSERT_EQ(run(test::loom_binary() + " train " +
                write_job(tmp.path, "slow",
                          {{"train_steps", 4}, {"optimizer", {{"params", {{"lr", 1e-4}}}}}})
                    .string())
                .code,
            0);
  const fs::path page = tmp.path / "report.html";
  const Result r = run(test::loom_binary() + " report " + (tmp.path / "full").string() + " " +
                       (tmp.path / "slow").string() + " --out " + page.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string html = slurp(page);
  EXPECT_EQ(html.find("<script"), std::string::npos) << "the page must not run scripts";
  EXPECT_EQ(html.find("http://", html.find("<body")), std::string::npos) << "nothing fetched";

  static const std::regex svg_re(R"(<svg class="chart"[^>]*>)");
  static const std::regex path_re(R"(<path class="series"[^>]*>)");
  std::map<std::string, std::vector<std::string>> paths;  // chart -> its path tags
  std::map<std::string, std::string> svgs;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), svg_re);
       it != std::sregex_iterator(); ++it) {
    const std::string svg = it->str();
    const std::string name = attr(svg, "data-chart");
    svgs[name] = svg;
    const size_t from = it->position(), to = html.find("</svg>", from);
    const std::string body = html.substr(from, to - from);
    for (auto p = std::sregex_iterator(body.begin(), body.end(), path_re);
         p != std::sregex_iterator(); ++p)
      paths[name].push_back(p->str());
  }
  for (const char* c : {"loss", "lr", "grad_norm", "tokens_per_s", "memory"})
    EXPECT_TRUE(svgs.count(c)) << "no chart " << c;
  const std::string& loss = svgs["loss"];
  const double x0 = std::stod(attr(loss, "data-x0")), x1 = std::stod(attr(loss, "data-x1"));
  const double px0 = std::stod(attr(loss, "data-px0")), px1 = std::stod(attr(loss, "data-px1"));
  EXPECT_EQ(x0, 0.0);  // the evaluation before the first step
  EXPECT_EQ(x1, 6.0);
  std::map<std::string, int> train_points, eval_points;
  for (const std::string& p : paths["loss"]) {
    const std::vector<std::pair<double, double>> pts = points_of(attr(p, "d"));
    EXPECT_EQ(std::to_string(pts.size()), attr(p, "data-points"));
    if (attr(p, "data-series") == "eval_loss") {
      eval_points[attr(p, "data-run")] = static_cast<int>(pts.size());
      continue;
    }
    train_points[attr(p, "data-run")] = static_cast<int>(pts.size());
    for (size_t i = 0; i < pts.size(); ++i)  // step i + 1 at its place on the axis
      EXPECT_NEAR(pts[i].first, px0 + (i + 1 - x0) / (x1 - x0) * (px1 - px0), 0.006)
          << attr(p, "data-run") << " point " << i;
  }
  EXPECT_EQ(train_points, (std::map<std::string, int>{{"full", 6}, {"slow", 4}}));
  EXPECT_EQ(eval_points, (std::map<std::string, int>{{"full", 4}, {"slow", 3}}));
  std::set<std::string> mem;
  for (const std::string& p : paths["memory"])
    mem.insert(attr(p, "data-run") + "/" + attr(p, "data-series"));
  EXPECT_EQ(mem, (std::set<std::string>{"full/rss_mib_rank0", "slow/rss_mib_rank0"}));
  // The table and the configs.
  EXPECT_NE(html.find("<th>trainable</th>"), std::string::npos);
  EXPECT_NE(html.find("<h2>Config: full</h2>"), std::string::npos);
  EXPECT_NE(html.find("<h2>Config: slow</h2>"), std::string::npos);
  EXPECT_NE(html.find("0.0001"), std::string::npos) << "the second run's lr in its config";

  // A folder that is not a run: exit 1 naming the file, no page written.
  const Result bad = run(test::loom_binary() + " report " + tmp.path.string() + " --out " +
                         (tmp.path / "bad.html").string());
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find((tmp.path / "metrics.jsonl").string() + ": cannot read"),
            std::string::npos)
      << bad.output;
  EXPECT_FALSE(fs::exists(tmp.path / "bad.html"));
}

// Progress bars (tokenizing, evaluating) redraw a line on a terminal and stay out of logs.
TEST(Progress, ShowsOnATerminalOnly) {
  if (run("command -v script").code != 0) GTEST_SKIP() << "no script(1) to make a terminal";
  test::TempDir tmp;
  const fs::path cfg =
      write_job(tmp.path, "run",
                {{"train_steps", 2}, {"data", {{"cache_dir", (tmp.path / "cache").string()}}}});
  const Result log = run(test::loom_binary() + " train " + cfg.string());
  ASSERT_EQ(log.code, 0) << log.output;
  EXPECT_EQ(log.output.find("tokenizing"), std::string::npos) << log.output;
  EXPECT_EQ(log.output.find('\r'), std::string::npos) << "a log has whole lines only";
  fs::remove_all(tmp.path / "cache");
  const Result tty =
      run("script -qec '" + test::loom_binary() + " train " + cfg.string() + "' /dev/null");
  ASSERT_EQ(tty.code, 0) << tty.output;
  EXPECT_NE(tty.output.find("\033[2Ktokenizing sft.jsonl  ["), std::string::npos) << tty.output;
  EXPECT_NE(tty.output.find("\033[2Kevaluating  ["), std::string::npos) << tty.output;
}

}  // namespace
}  // namespace loom
