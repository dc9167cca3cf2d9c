#include "loom/train/monitor.h"

#include <charconv>
#include <cmath>

#include "loom/util/atomic_write.h"
#include "loom/util/error.h"

namespace loom::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The step a metrics row belongs to (its "step", or a "stopped" row's), -1 when none.
int64_t row_step(const json& r) {
  if (r.contains("step") && r["step"].is_number_integer()) return r["step"].get<int64_t>();
  if (r.contains("stopped") && r["stopped"].is_object() && r["stopped"].contains("step"))
    return r["stopped"]["step"].get<int64_t>();
  return -1;
}

// Python's repr of a float (what DeepSpeed's csv writer prints): the shortest string that
// reads back as the same double.
std::string shortest(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // 2 -> "2.0", as Python
  return s;
}

// Rewrites `file` keeping the lines `keep` accepts (a resumed run drops the earlier run's
// rows past its checkpoint).
template <class Keep>
void filter_lines(const fs::path& file, Keep keep) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return;
  std::string kept;
  for (std::string line; std::getline(in, line);)
    if (keep(line)) kept += line + "\n";
  in.close();
  write_file_atomically(file, kept);
}

}  // namespace

Monitor::Monitor(const TrainConfig& cfg, int64_t resume_step)
    : metrics_path_(fs::path(cfg.output_dir) / "metrics.jsonl"),
      train_batch_(cfg.train_batch),
      resume_samples_(resume_step * cfg.train_batch) {
  fs::create_directories(cfg.output_dir);
  if (resume_step > 0) {
    filter_lines(metrics_path_, [&](const std::string& line) {
      const json r = json::parse(line, nullptr, false);
      if (r.is_discarded()) return false;  // a line cut short by a crash
      const int64_t s = row_step(r);
      if (s == resume_step && r.contains("eval_loss")) eval_at_resume_ = true;
      return s <= resume_step;
    });
  }
  metrics_.open(metrics_path_, resume_step > 0 ? std::ios::app : std::ios::trunc);
  LOOM_CHECK(metrics_.good(), metrics_path_.string() + ": cannot write");
  if (cfg.tensorboard.enabled) {
    tb_ = std::make_unique<io::TbEventWriter>(cfg.tensorboard.dir(cfg.output_dir));
    // Steps an earlier process logged past the checkpoint are replaced by this run's.
    if (resume_step > 0) tb_->session_start(resume_samples_ + 1);
  }
  if (cfg.csv_monitor.enabled) {
    csv_dir_ = cfg.csv_monitor.dir(cfg.output_dir);
    std::error_code ec;
    fs::create_directories(csv_dir_, ec);
    LOOM_CHECK(!ec, csv_dir_.string() + ": cannot create the csv_monitor folder: " + ec.message());
  }
}

std::vector<std::pair<std::string, double>> Monitor::scalars_of(const json& row) {
  std::vector<std::pair<std::string, double>> out;
  auto add = [&](const char* key, const std::string& tag) {
    if (row.contains(key) && row[key].is_number()) out.emplace_back(tag, row[key].get<double>());
  };
  if (row.contains("loss")) {  // a training step
    add("loss", "Train/Samples/train_loss");
    add("lr", "Train/Samples/lr");
    add("loss_scale", "Train/Samples/loss_scale");
    add("grad_norm", "Train/Samples/grad_norm");
    add("tokens_per_s", "Train/Samples/tokens_per_s");
    if (row.contains("rss_bytes") && row["rss_bytes"].is_array())
      for (size_t r = 0; r < row["rss_bytes"].size(); ++r)
        out.emplace_back("Train/Samples/rss_mib_rank" + std::to_string(r),
                         row["rss_bytes"][r].get<double>() / 1048576.0);
  }
  add("eval_loss", "Train/Samples/eval_loss");
  return out;
}

void Monitor::write_csv(int64_t x, const std::string& tag, double value) {
  std::string name = tag;
  for (char& c : name)
    if (c == '/' || c == ' ') c = '_';
  const fs::path file = csv_dir_ / (name + ".csv");
  if (csv_started_.insert(name).second) {
    // First write of this process: a fresh run starts the file; a resumed one keeps the
    // header and the rows up to its checkpoint.
    if (resume_samples_ > 0 && fs::exists(file)) {
      bool header = true;
      filter_lines(file, [&](const std::string& line) {
        if (std::exchange(header, false)) return true;
        int64_t s = -1;
        std::from_chars(line.data(), line.data() + line.size(), s);
        return s >= 0 && s <= resume_samples_;
      });
    } else {
      std::ofstream f(file, std::ios::binary | std::ios::trunc);
      // Python's csv module ends rows with \r\n; DeepSpeed writes its files through it.
      f << "step," << tag.substr(tag.rfind('/') + 1) << "\r\n";
      f.close();
      LOOM_CHECK(!f.fail(), file.string() + ": write failed");
    }
  }
  std::ofstream f(file, std::ios::binary | std::ios::app);
  f << x << "," << shortest(value) << "\r\n";
  f.close();
  LOOM_CHECK(!f.fail(), file.string() + ": write failed");
}

void Monitor::record(const json& row) {
  // A resumed run evaluates again at its first step; the earlier run's row for that step
  // stays, so each step has one.
  if (eval_at_resume_ && row.contains("eval_loss") &&
      row_step(row) * train_batch_ == resume_samples_) {
    eval_at_resume_ = false;
    return;
  }
  metrics_ << row.dump() << "\n";
  metrics_.flush();
  LOOM_CHECK(metrics_.good(), metrics_path_.string() + ": write failed");
  const int64_t step = row_step(row);
  if (step < 0 || (!tb_ && csv_dir_.empty())) return;
  const std::vector<std::pair<std::string, double>> values = scalars_of(row);
  if (values.empty()) return;
  const int64_t x = step * train_batch_;
  if (tb_) tb_->scalars(x, values);
  if (!csv_dir_.empty())
    for (const auto& [tag, v] : values) write_csv(x, tag, v);
}

}  // namespace loom::train
