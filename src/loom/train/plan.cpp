#include "loom/train/plan.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "loom/io/gguf.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/model_loader.h"
#include "loom/io/peft_adapter.h"
#include "loom/models/decoder.h"
#include "loom/models/registry.h"
#include "loom/parallel/pipeline.h"
#include "loom/train/trainer.h"
#include "loom/util/error.h"
#include "loom/util/path.h"

namespace loom::train {

namespace fs = std::filesystem;

std::string plan_report(const TrainConfig& cfg_in, int world) {
  TrainConfig cfg = cfg_in;
  if (!cfg.peft_from.empty()) cfg.peft = io::read_adapter_config(expand_user(cfg.peft_from)).config;
  // The model from its config alone, and the bytes a quantized GGUF base keeps per weight.
  // Tensor parallel: the shapes of tp rank 0's shards (every rank's are the same, up to a
  // padded vocabulary's last rows).
  const nn::TensorParallel tp{nullptr, cfg.sequence_parallel, cfg.tensor_parallel, 0};
  std::unique_ptr<models::CausalLM> model;
  std::map<std::string, int64_t> quant_bytes;  // HF name -> bytes kept in ggml blocks
  const std::string path = model_path(cfg.model);
  if (path.empty()) {
    io::LoadOptions opt;
    opt.tp = tp;
    model = build_model(cfg.model, cfg.seed, "config", opt);
  } else {
    const fs::path p = expand_user(path);
    LOOM_CHECK(!io::is_adapter_folder(p),
               p.string() +
                   ": plan needs the base model (an adapter folder goes in "
                   "peft.from_pretrained)");
    if (io::is_gguf(p)) {
      io::GgufFile f = io::GgufFile::open(p);
      model = models::make_model(io::gguf_hf_config(f), p.string(), tp);
      bool keep = cfg.peft.enabled();
      if (cfg.model.is_object() && cfg.model.contains("keep_quantized"))
        keep = cfg.model["keep_quantized"].get<bool>();
      for (const auto& t : f.tensors())
        if (keep && t.ne.size() == 2 && t.type != io::GgmlType::F32)
          quant_bytes[io::gguf_to_hf_name(t.name)] = static_cast<int64_t>(t.nbytes);
    } else {
      model = models::make_model(io::read_json_file(p / "config.json"),
                                 (p / "config.json").string(), tp);
    }
  }
  models::declare_peft(*model, cfg.peft);
  nn::ParamStore& ps = model->params();
  int64_t frozen = 0;
  std::vector<int64_t> unit_frozen(model->num_units(), 0);  // frozen bytes per unit
  for (auto& p : ps.all()) {
    if (p->trainable) continue;
    auto q = quant_bytes.find(p->name);
    const bool kept =
        q != quant_bytes.end() &&
        !std::any_of(cfg.peft.modules_to_save.begin(), cfg.peft.modules_to_save.end(),
                     [&](const std::string& m) {
                       return models::peft_name_matches(p->name.substr(0, p->name.rfind('.')), m);
                     });
    // A kept-quantized shard holds its share of the whole weight's blocks.
    const int64_t bytes = kept ? q->second * shape_numel(p->shape) / shape_numel(p->full_shape)
                               : 4 * shape_numel(p->shape);
    frozen += bytes;
    unit_frozen[model->unit_of(p->name)] += bytes;
  }
  std::vector<int64_t> lens;
  for (const auto& unit : model->units()) {
    int64_t n = 0;
    for (const nn::Parameter* p : unit)
      if (p->trainable) n += shape_numel(p->shape);
    lens.push_back(n);
  }
  const int64_t act = model->activation_bytes(cfg.micro_batch, cfg.data.seq_len);
  auto mib = [](int64_t b) { return b / 1048576.0; };
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "loom plan: %s%s, %.2fM parameters (%.3fM trainable) per rank, %d ranks = %d "
                "data-parallel x %d tensor-parallel%s, micro-batch %lld x %lld tokens\n",
                model->arch().c_str(), cfg.peft.enabled() ? (" + " + cfg.peft.method).c_str() : "",
                ps.numel() / 1e6, ps.trainable_numel() / 1e6, world, cfg.data_parallel,
                cfg.tensor_parallel, cfg.sequence_parallel ? " (sequence parallel)" : "",
                static_cast<long long>(cfg.micro_batch), static_cast<long long>(cfg.data.seq_len));
  out += line;
  out += "MiB per rank   params    grads  optimizer  model state  buffers  activations*    total\n";
  for (int stage = 0; stage <= 3; ++stage) {
    // Every rank's share is the same up to one element of padding per unit: rank 0's.
    parallel::ZeroMemory m =
        parallel::ZeroPartition::make(lens, cfg.data_parallel, 0).memory(stage, frozen);
    std::snprintf(line, sizeof line, "stage %d%s %9.1f %8.1f %10.1f %12.1f %8.1f %12.1f %8.1f\n",
                  stage, stage == cfg.zero.stage ? " (cfg)" : "      ", mib(m.params), mib(m.grads),
                  mib(m.optimizer), mib(m.model_state()), mib(m.buffers), mib(act),
                  mib(m.model_state() + m.buffers + act));
    out += line;
  }
  out += "* activations: the model's estimate for one micro-batch's forward and backward\n";
  if (cfg.pipeline.size > 1) {
    // Each pipeline stage holds its layers' units (the first also the embedding and a
    // prefix, the last the final norm and head), ZeRO over dp; the table above is the
    // whole model per tp rank. Activations per stage come with the schedules.
    const std::vector<int64_t> counts = parallel::partition_model(cfg.pipeline, *model, "config");
    std::snprintf(line, sizeof line,
                  "pipeline: %d stages (%s schedule), ZeRO stage %d over %d data-parallel "
                  "ranks; MiB per rank of each stage:\n",
                  cfg.pipeline.size, cfg.pipeline.schedule.c_str(), cfg.zero.stage,
                  cfg.data_parallel);
    out += line;
    const int L = model->num_layers(), k = cfg.pipeline.chunks();
    std::vector<int64_t> first(k + 1, 0);
    for (int c = 0; c < k; ++c) first[c + 1] = first[c] + counts[c];
    for (int r = 0; r < cfg.pipeline.size; ++r) {
      std::vector<int64_t> stage_lens;
      int64_t stage_frozen = 0, layers = 0;
      std::string ranges;
      auto take = [&](int unit) {
        stage_lens.push_back(lens[unit]);
        stage_frozen += unit_frozen[unit];
      };
      if (r == 0) take(0);
      for (int c = r; c < k; c += cfg.pipeline.size) {  // this rank's chunks
        for (int64_t l = first[c]; l < first[c + 1]; ++l) take(static_cast<int>(l) + 1);
        layers += counts[c];
        ranges += (ranges.empty() ? "" : ", ") + std::to_string(first[c]) + "-" +
                  std::to_string(first[c + 1] - 1);
      }
      if (r == cfg.pipeline.size - 1) {
        take(L + 1);
        // A tied head: the last stage holds its own copy of the embedding's table.
        auto* dec = dynamic_cast<models::Decoder*>(model.get());
        if (dec && dec->tied_head() && r > 0) take(0);
      }
      if (r == 0 && model->num_units() > L + 2) take(L + 2);
      const parallel::ZeroMemory m = parallel::ZeroPartition::make(stage_lens, cfg.data_parallel, 0)
                                         .memory(cfg.zero.stage, stage_frozen);
      std::snprintf(line, sizeof line,
                    "  stage %d: layers %s (%lld)  params %.1f  grads %.1f  optimizer %.1f  "
                    "model state %.1f\n",
                    r, ranges.c_str(), static_cast<long long>(layers), mib(m.params), mib(m.grads),
                    mib(m.optimizer), mib(m.model_state()));
      out += line;
    }
  }
  return out;
}

}  // namespace loom::train
