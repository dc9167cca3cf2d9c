// `loom report RUN_DIR [RUN_DIR ...]`: one self-contained HTML page (inline SVG and CSS, no
// scripts, nothing fetched) from the runs' metrics.jsonl (train/monitor.h) and
// loom_config.json: loss with eval loss, learning rate, gradient norm, tokens/s and resident
// memory per rank against the step, a table per run (model, PEFT method and trainable
// parameters, data summary, layout, precision, batch, results) and each run's config. With
// several runs the charts overlay them, one colour per run.
//
// Each chart is <svg class="chart" data-chart=NAME> carrying its axis mapping (data-x0/x1:
// the step range, data-px0/px1: its pixels) and one <path class="series" data-run data-series
// data-points> per curve, so tests and scripts can check what is drawn.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace loom::train {

// The page's HTML. Errors name the run folder or the metrics line that cannot be read.
std::string render_report(const std::vector<std::filesystem::path>& runs);

// Writes render_report(runs) to `out` (util/atomic_write.h).
void write_report(const std::vector<std::filesystem::path>& runs,
                  const std::filesystem::path& out);

}  // namespace loom::train
