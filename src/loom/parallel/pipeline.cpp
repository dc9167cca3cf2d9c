#include "loom/parallel/pipeline.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "loom/util/error.h"

namespace loom::parallel {

namespace {

// The contiguous cut of L layers into k chunks (each at least one layer) whose largest
// chunk weight is smallest; chunk weight = its layers' parameters, plus `first` for chunk 0
// and `last` for chunk k - 1. Dynamic programming over (chunks, layers): O(k L^2).
std::vector<int64_t> balance(const std::vector<int64_t>& w, int k, int64_t first, int64_t last) {
  const int L = static_cast<int>(w.size());
  std::vector<int64_t> prefix(L + 1, 0);
  for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + w[l];
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  // best[c][l]: the smallest largest weight of chunks 0..c-1 covering layers [0, l).
  std::vector<std::vector<int64_t>> best(k + 1, std::vector<int64_t>(L + 1, kInf));
  std::vector<std::vector<int>> cut(k + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0;
  for (int c = 1; c <= k; ++c) {
    for (int l = c; l <= L - (k - c); ++l) {
      for (int s = c - 1; s < l; ++s) {  // chunk c - 1 holds layers [s, l)
        if (best[c - 1][s] == kInf) continue;
        const int64_t chunk = prefix[l] - prefix[s] + (c == 1 ? first : 0) + (c == k ? last : 0);
        const int64_t worst = std::max(best[c - 1][s], chunk);
        if (worst < best[c][l]) {
          best[c][l] = worst;
          cut[c][l] = s;
        }
      }
    }
  }
  std::vector<int64_t> counts(k);
  for (int c = k, l = L; c >= 1; --c) {
    counts[c - 1] = l - cut[c][l];
    l = cut[c][l];
  }
  return counts;
}

}  // namespace

std::vector<int64_t> partition_layers(const PipelineConfig& cfg,
                                      const std::vector<int64_t>& layer_params,
                                      int64_t embed_params, int64_t head_params,
                                      const std::string& where) {
  const int64_t L = static_cast<int64_t>(layer_params.size());
  const int k = cfg.chunks();
  const std::string stages =
      std::to_string(k) + " stages" +
      (cfg.virtual_stages > 1 ? " (pipeline_parallel.size " + std::to_string(cfg.size) +
                                    " x virtual_stages " + std::to_string(cfg.virtual_stages) + ")"
                              : "");
  LOOM_CHECK(k <= L, where + ": 'pipeline_parallel.size' asks for " + stages +
                         " but the model has " + std::to_string(L) +
                         " layers (every stage needs at least one)");
  if (!cfg.layers.empty()) {
    LOOM_CHECK(static_cast<int>(cfg.layers.size()) == k,
               where + ": 'pipeline_parallel.partition' lists " +
                   std::to_string(cfg.layers.size()) + " layer counts for " + stages);
    LOOM_CHECK(std::all_of(cfg.layers.begin(), cfg.layers.end(), [](int64_t n) { return n >= 1; }),
               where +
                   ": 'pipeline_parallel.partition': every stage needs at least "
                   "one layer");
    const int64_t sum = std::accumulate(cfg.layers.begin(), cfg.layers.end(), int64_t{0});
    LOOM_CHECK(sum == L, where + ": 'pipeline_parallel.partition' sums to " +
                             std::to_string(sum) + " layers, the model has " + std::to_string(L));
    return cfg.layers;
  }
  if (cfg.partition == "parameters") return balance(layer_params, k, embed_params, head_params);
  LOOM_CHECK(cfg.partition == "uniform",
             where +
                 ": 'pipeline_parallel.partition' must be \"uniform\", "
                 "\"parameters\" or a list of layer counts, got \"" +
                 cfg.partition + "\"");
  std::vector<int64_t> counts(k);
  for (int c = 0; c < k; ++c) counts[c] = (c + 1) * L / k - c * L / k;
  return counts;
}

std::vector<int64_t> partition_model(const PipelineConfig& cfg, models::CausalLM& model,
                                     const std::string& where) {
  const int L = model.num_layers();
  std::vector<int64_t> per_unit(model.num_units(), 0);
  for (auto& p : model.params().all())
    per_unit[model.unit_of(p->name)] += shape_numel(p->full_shape);
  const std::vector<int64_t> layers(per_unit.begin() + 1, per_unit.begin() + 1 + L);
  return partition_layers(cfg, layers, per_unit[0], per_unit[L + 1], where);
}

}  // namespace loom::parallel
