#include "loom/train/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/util/atomic_write.h"
#include "loom/util/error.h"
#include "loom/util/format.h"

namespace loom::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
constexpr const char* kRankDash[] = {"", "6 3", "2 2", "8 3 2 3"};

// One run's metrics, in the order metrics.jsonl holds them.
struct Run {
  fs::path dir;
  std::string name;
  json info, memory, config, stopped;  // the last "run", "memory", "stopped" rows; the config
  std::vector<double> step, loss, lr, grad_norm, tok_s, seconds;
  std::vector<double> eval_step, eval_loss;
  std::vector<std::vector<double>> rss_mib;  // [rank][row of `step`]; NaN where not recorded
};

double num(const json& j) {
  return j.is_number() ? j.get<double>() : std::nan("");  // null: not finite when written
}

Run read_run(const fs::path& dir) {
  Run r;
  r.dir = dir;
  const fs::path metrics = dir / "metrics.jsonl";
  std::ifstream in(metrics);
  LOOM_CHECK(in, metrics.string() + ": cannot read (is " + dir.string() + " a run's output_dir?)");
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    const json row = json::parse(line, nullptr, false);
    LOOM_CHECK(!row.is_discarded() && row.is_object(),
               metrics.string() + ":" + std::to_string(line_no) + ": not a JSON object");
    if (row.contains("run")) r.info = row["run"];
    if (row.contains("memory")) r.memory = row["memory"];
    if (row.contains("stopped")) r.stopped = row["stopped"];
    if (row.contains("eval_loss") && row.contains("step")) {
      r.eval_step.push_back(num(row["step"]));
      r.eval_loss.push_back(num(row["eval_loss"]));
    }
    if (!row.contains("loss") || !row.contains("step")) continue;
    r.step.push_back(num(row["step"]));
    r.loss.push_back(num(row["loss"]));
    r.lr.push_back(row.contains("lr") ? num(row["lr"]) : std::nan(""));
    r.grad_norm.push_back(row.contains("grad_norm") ? num(row["grad_norm"]) : std::nan(""));
    r.tok_s.push_back(row.contains("tokens_per_s") ? num(row["tokens_per_s"]) : std::nan(""));
    r.seconds.push_back(row.contains("step_seconds") ? num(row["step_seconds"]) : 0.0);
    const size_t i = r.step.size() - 1;
    if (row.contains("rss_bytes") && row["rss_bytes"].is_array()) {
      const json& rss = row["rss_bytes"];
      if (r.rss_mib.size() < rss.size())
        r.rss_mib.resize(rss.size(), std::vector<double>(i, std::nan("")));
      for (size_t k = 0; k < r.rss_mib.size(); ++k)
        r.rss_mib[k].push_back(k < rss.size() ? num(rss[k]) / 1048576.0 : std::nan(""));
    } else {
      for (auto& v : r.rss_mib) v.push_back(std::nan(""));
    }
  }
  LOOM_CHECK(!r.step.empty() || !r.eval_step.empty(),
             metrics.string() + ": no training or evaluation rows to draw");
  const fs::path cfg = dir / "loom_config.json";
  if (fs::exists(cfg)) {
    std::ifstream c(cfg);
    r.config = json::parse(c, nullptr, false);
    LOOM_CHECK(!r.config.is_discarded(), cfg.string() + ": not valid JSON");
  }
  return r;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Axis ticks at 1, 2 or 5 times a power of ten, about `want` of them over [lo, hi].
std::vector<double> ticks(double lo, double hi, int want) {
  const double raw = (hi - lo) / want;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = p;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) {
      step = m * p;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

// 1234567.4 -> "1,234,567"; "-" when not finite.
std::string grouped(double v) {
  return std::isfinite(v) ? with_thousands(std::llround(v)) : std::string("-");
}

// 250000 -> "250,000"; 0.00031 -> "0.00031".
std::string tick_label(double t) {
  return std::abs(t) >= 1e4 && t == std::floor(t) ? grouped(t) : fmt("%.4g", t);
}

struct Series {
  std::string run, name, color, dash;
  std::vector<double> x, y;
  bool markers = false;
};

// One chart: an SVG with axes, grid, tick labels and a path per series (a gap where a value
// is not finite).
std::string chart(const std::string& id, const std::string& title, const std::vector<Series>& ss) {
  constexpr double W = 620, H = 260, L = 66, R = 14, T = 30, B = 36;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : ss)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  std::ostringstream o;
  if (!std::isfinite(x0)) return "";  // nothing recorded for this chart
  if (x1 == x0) x1 = x0 + 1;
  const double pad = y1 > y0 ? 0.06 * (y1 - y0) : std::max(std::abs(y0) * 0.05, 1e-12);
  y0 -= pad;
  y1 += pad;
  const double px0 = L, px1 = W - R, py0 = H - B, py1 = T;
  auto X = [&](double x) { return px0 + (x - x0) / (x1 - x0) * (px1 - px0); };
  auto Y = [&](double y) { return py0 + (y - y0) / (y1 - y0) * (py1 - py0); };
  o << "<figure>\n<svg class=\"chart\" data-chart=\"" << id << "\" data-x0=\"" << fmt("%.17g", x0)
    << "\" data-x1=\"" << fmt("%.17g", x1) << "\" data-px0=\"" << px0 << "\" data-px1=\"" << px1
    << "\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H
    << "\" role=\"img\" aria-label=\"" << esc(title) << "\">\n";
  o << "<text class=\"title\" x=\"" << L << "\" y=\"18\">" << esc(title) << "</text>\n";
  for (double t : ticks(y0, y1, 5)) {
    o << "<line class=\"grid\" x1=\"" << px0 << "\" x2=\"" << px1 << "\" y1=\"" << fmt("%.2f", Y(t))
      << "\" y2=\"" << fmt("%.2f", Y(t)) << "\"/><text class=\"tick\" x=\"" << px0 - 6 << "\" y=\""
      << fmt("%.2f", Y(t) + 4) << "\" text-anchor=\"end\">" << tick_label(t) << "</text>\n";
  }
  for (double t : ticks(x0, x1, 8)) {
    if (t != std::floor(t)) continue;  // steps are whole numbers
    o << "<line class=\"grid\" x1=\"" << fmt("%.2f", X(t)) << "\" x2=\"" << fmt("%.2f", X(t))
      << "\" y1=\"" << py0 << "\" y2=\"" << py1 << "\"/><text class=\"tick\" x=\""
      << fmt("%.2f", X(t)) << "\" y=\"" << py0 + 16 << "\" text-anchor=\"middle\">"
      << fmt("%.0f", t) << "</text>\n";
  }
  o << "<rect class=\"frame\" x=\"" << px0 << "\" y=\"" << py1 << "\" width=\"" << px1 - px0
    << "\" height=\"" << py0 - py1 << "\"/>\n";
  o << "<text class=\"tick\" x=\"" << (px0 + px1) / 2 << "\" y=\"" << H - 4
    << "\" text-anchor=\"middle\">step</text>\n";
  for (const Series& s : ss) {
    std::string d;
    int points = 0;
    bool pen = false;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) {
        pen = false;
        continue;
      }
      d += pen ? 'L' : 'M';
      d += fmt("%.2f", X(s.x[i]));
      d += ',';
      d += fmt("%.2f", Y(s.y[i]));
      pen = true;
      ++points;
    }
    if (!points) continue;
    o << "<path class=\"series\" data-run=\"" << esc(s.run) << "\" data-series=\"" << s.name
      << "\" data-points=\"" << points << "\" fill=\"none\" stroke=\"" << s.color
      << "\" stroke-width=\"1.6\"" << (s.dash.empty() ? "" : " stroke-dasharray=\"" + s.dash + "\"")
      << " d=\"" << d << "\"/>\n";
    if (s.markers)
      for (size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(s.y[i]))
          o << "<circle cx=\"" << fmt("%.2f", X(s.x[i])) << "\" cy=\"" << fmt("%.2f", Y(s.y[i]))
            << "\" r=\"3\" fill=\"" << s.color << "\"/>\n";
  }
  o << "</svg>\n<figcaption>";
  for (const Series& s : ss)
    o << "<span class=\"key\"><svg width=\"22\" height=\"8\"><line x1=\"0\" x2=\"22\" y1=\"4\" "
         "y2=\"4\" stroke=\""
      << s.color << "\" stroke-width=\"2\""
      << (s.dash.empty() ? "" : " stroke-dasharray=\"" + s.dash + "\"") << "/></svg>" << esc(s.run)
      << " " << esc(s.name) << "</span>";
  o << "</figcaption>\n</figure>\n";
  return o.str();
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return std::nan("");
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

std::string summary_table(const std::vector<Run>& runs) {
  std::ostringstream o;
  auto info = [](const Run& r, const char* k) -> std::string {
    if (!r.info.contains(k)) return "-";
    const json& v = r.info[k];
    return v.is_string() ? v.get<std::string>() : v.dump();
  };
  o << "<table>\n<tr><th></th>";
  for (size_t i = 0; i < runs.size(); ++i)
    o << "<th><span class=\"swatch\" style=\"background:" << kPalette[i % 5] << "\"></span>"
      << esc(runs[i].name) << "</th>";
  o << "</tr>\n";
  auto row = [&](const char* label, auto cell) {
    o << "<tr><th>" << label << "</th>";
    for (const Run& r : runs) o << "<td>" << esc(cell(r)) << "</td>";
    o << "</tr>\n";
  };
  row("folder", [](const Run& r) { return r.dir.string(); });
  row("model", [&](const Run& r) { return info(r, "arch"); });
  row("method", [&](const Run& r) {
    const std::string p = info(r, "peft");
    return p.empty() || p == "-" ? std::string("full fine-tuning") : p;
  });
  row("parameters", [&](const Run& r) {
    return r.info.contains("params") ? grouped(num(r.info["params"])) : "-";
  });
  row("trainable", [&](const Run& r) {
    if (!r.info.contains("trainable_params")) return std::string("-");
    const double t = num(r.info["trainable_params"]), p = num(r.info["params"]);
    return grouped(t) + " (" + fmt("%.2f", 100.0 * t / p) + "%)";
  });
  row("data", [&](const Run& r) {
    return info(r, "data") + " [" + info(r, "samples") + " samples of " + info(r, "seq_len") +
           " tokens]";
  });
  row("layout", [&](const Run& r) {
    return info(r, "world_size") + (info(r, "world_size") == "1" ? " rank" : " ranks") + ": dp " +
           info(r, "data_parallel") + ", tp " + info(r, "tensor_parallel") + ", pp " +
           info(r, "pipeline_parallel") + ", ep " + info(r, "expert_parallel") + "; ZeRO stage " +
           info(r, "zero_stage") + "; " + info(r, "precision");
  });
  row("batch", [&](const Run& r) {
    return info(r, "train_batch") + " = " + info(r, "micro_batch") + " x " + info(r, "grad_accum") +
           " accumulation x dp";
  });
  row("steps", [&](const Run& r) {
    std::string s = r.step.empty() ? "0" : fmt("%.0f", r.step.back());
    s += " of " + info(r, "train_steps");
    if (r.stopped.is_object())
      s += " (stopped by " + r.stopped.value("signal", std::string("a signal")) + ")";
    return s;
  });
  row("train loss", [&](const Run& r) {
    return r.loss.empty() ? std::string("-")
                          : fmt("%.4f", r.loss.front()) + " -> " + fmt("%.4f", r.loss.back());
  });
  row("eval loss", [&](const Run& r) {
    return r.eval_loss.empty()
               ? std::string("-")
               : fmt("%.4f", r.eval_loss.front()) + " -> " + fmt("%.4f", r.eval_loss.back());
  });
  row("tokens/s (median)", [&](const Run& r) { return grouped(median(r.tok_s)); });
  row("training time", [&](const Run& r) {
    double t = 0;
    for (double s : r.seconds) t += s;
    return fmt("%.1f s", t);
  });
  row("peak RSS (largest rank)", [&](const Run& r) {
    return r.memory.contains("peak_rss_bytes")
               ? fmt("%.1f MiB", num(r.memory["peak_rss_bytes"]) / 1048576.0)
               : std::string("-");
  });
  o << "</table>\n";
  return o.str();
}

}  // namespace

std::string render_report(const std::vector<fs::path>& dirs) {
  LOOM_CHECK(!dirs.empty(), "report: no run folder given");
  std::vector<Run> runs;
  for (const fs::path& d : dirs) runs.push_back(read_run(d));
  // Runs are named by their folder; the same folder name twice gets the full path.
  for (Run& r : runs) {
    r.name = r.dir.filename().empty() ? r.dir.parent_path().filename().string()
                                      : r.dir.filename().string();
    int same = 0;
    for (const Run& s : runs) same += s.dir.filename() == r.dir.filename();
    if (same > 1) r.name = r.dir.string();
  }
  std::vector<Series> loss, lr, gn, tok, mem;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    const std::string c = kPalette[i % 5];
    loss.push_back({r.name, "train_loss", c, "", r.step, r.loss});
    if (!r.eval_step.empty())
      loss.push_back({r.name, "eval_loss", c, "5 4", r.eval_step, r.eval_loss, true});
    lr.push_back({r.name, "lr", c, "", r.step, r.lr});
    gn.push_back({r.name, "grad_norm", c, "", r.step, r.grad_norm});
    tok.push_back({r.name, "tokens_per_s", c, "", r.step, r.tok_s});
    for (size_t k = 0; k < r.rss_mib.size(); ++k)
      mem.push_back(
          {r.name, "rss_mib_rank" + std::to_string(k), c, kRankDash[k % 4], r.step, r.rss_mib[k]});
  }
  std::ostringstream o;
  std::string title = "Loom run report: ";
  for (size_t i = 0; i < runs.size(); ++i) title += (i ? " vs " : "") + runs[i].name;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>"
    << esc(title) << "</title>\n<style>\n"
    << "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1300px}\n"
    << "h1{font-size:20px}h2{font-size:16px;margin-top:28px}\n"
    << ".charts{display:flex;flex-wrap:wrap;gap:8px 18px}figure{margin:0}\n"
    << "figcaption{font-size:12px;color:#444}.key{margin-right:12px;white-space:nowrap}\n"
    << ".key svg{margin-right:4px;vertical-align:middle}\n"
    << "svg.chart .grid{stroke:#e4e4e4}svg.chart .frame{fill:none;stroke:#999}\n"
    << "svg.chart text{font:11px system-ui,sans-serif;fill:#555}"
    << "svg.chart .title{font-size:13px;fill:#222;font-weight:600}\n"
    << "table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:4px "
       "8px;text-align:left;vertical-align:top}\n"
    << ".swatch{display:inline-block;width:10px;height:10px;margin-right:6px}\n"
    << "pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto}\n"
    << "</style>\n</head>\n<body>\n<h1>" << esc(title) << "</h1>\n";
  o << "<div class=\"charts\">\n";
  o << chart("loss", "loss (solid: train, dashed: eval)", loss);
  o << chart("lr", "learning rate", lr);
  o << chart("grad_norm", "gradient norm (before clipping)", gn);
  o << chart("tokens_per_s", "tokens/s (all ranks)", tok);
  o << chart("memory", "resident memory per rank, MiB", mem);
  o << "</div>\n<h2>Runs</h2>\n" << summary_table(runs);
  for (const Run& r : runs) {
    if (r.config.is_null()) continue;
    o << "<h2>Config: " << esc(r.name) << "</h2>\n<pre>" << esc(r.config.dump(2)) << "</pre>\n";
  }
  o << "</body>\n</html>\n";
  return o.str();
}

void write_report(const std::vector<fs::path>& runs, const fs::path& out) {
  write_file_atomically(out, render_report(runs));
}

}  // namespace loom::train
