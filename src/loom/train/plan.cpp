#include "loom/train/plan.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "loom/io/gguf.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/model_loader.h"
#include "loom/io/peft_adapter.h"
#include "loom/models/registry.h"
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
    frozen += kept ? q->second * shape_numel(p->shape) / shape_numel(p->full_shape)
                   : 4 * shape_numel(p->shape);
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
  return out;
}

}  // namespace loom::train
