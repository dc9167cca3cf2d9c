#include "loom/train/plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "loom/io/gguf.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/model_loader.h"
#include "loom/io/peft_adapter.h"
#include "loom/models/registry.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/pipeline_schedule.h"
#include "loom/train/trainer.h"
#include "loom/util/error.h"
#include "loom/util/path.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

// The model a config names, declared (never allocated) at any tensor-parallel size and
// pipeline stage, and the bytes a kept-quantized GGUF base holds per weight.
class ModelSource {
 public:
  explicit ModelSource(const TrainConfig& cfg)
      : peft_(cfg.peft),
        checkpointing_(cfg.activation_checkpointing),
        half_(cfg.precision != TrainConfig::Precision::fp32) {
    if (!cfg.peft_from.empty()) peft_ = io::read_adapter_config(expand_user(cfg.peft_from)).config;
    const std::string path = model_path(cfg.model);
    where_ = path.empty() ? "config (model)" : expand_user(path).string();
    LOOM_CHECK(path.empty() || !io::is_adapter_folder(expand_user(path)),
               where_ +
                   ": plan needs the base model (an adapter folder goes in "
                   "peft.from_pretrained)");
    hf_ = model_hf_config(cfg.model, "config");
    if (path.empty() || !io::is_gguf(expand_user(path))) return;
    // As the trainer loads it: with PEFT the frozen base stays in its blocks unless
    // model.keep_quantized says otherwise.
    bool keep = peft_.enabled();
    if (cfg.model.is_object() && cfg.model.contains("keep_quantized"))
      keep = cfg.model["keep_quantized"].get<bool>();
    if (!keep) return;
    io::GgufFile f = io::GgufFile::open(expand_user(path));
    for (const auto& t : f.tensors())
      if (t.ne.size() == 2 && t.type != io::GgmlType::F32)
        quant_bytes_[io::gguf_to_hf_name(t.name)] = static_cast<int64_t>(t.nbytes);
  }

  // tp rank 0's shards of the layers in `stage`; PEFT attached unless with_peft is false.
  std::unique_ptr<models::CausalLM> make(int tp, bool sp, const models::StageRange& stage,
                                         bool with_peft = true) const {
    const nn::TensorParallel layout{nullptr, sp, tp, 0};
    auto m = models::make_model(hf_, where_, layout, stage, models::ParamBuffers::DeclareOnly);
    if (with_peft) models::declare_peft(*m, peft_);
    m->set_activation_checkpointing(checkpointing_);
    return m;
  }

  // A frozen weight the trainer keeps in ggml blocks (not one trained in full).
  bool held_quantized(const nn::Parameter& p) const {
    if (p.trainable || !quant_bytes_.count(p.name)) return false;
    const std::string module = p.name.substr(0, p.name.rfind('.'));
    return !std::any_of(peft_.modules_to_save.begin(), peft_.modules_to_save.end(),
                        [&](const std::string& m) { return models::peft_name_matches(module, m); });
  }
  // Bytes this rank holds of a frozen parameter: its share of the blocks; under mixed
  // precision a matrix's 16 bits (nn::hold_frozen_in_half); else f32.
  int64_t frozen_bytes(const nn::Parameter& p) const {
    if (held_quantized(p))
      return quant_bytes_.at(p.name) * shape_numel(p.shape) / shape_numel(p.full_shape);
    const bool matrix = p.shape.size() == 2 && !p.adapter &&
                        (p.kind == nn::ParamKind::Weight || p.kind == nn::ParamKind::Embedding);
    return (half_ && matrix ? 2 : 4) * shape_numel(p.shape);
  }

  int64_t hidden() const { return hf_.value("n_embd", hf_.value("hidden_size", int64_t{0})); }
  const models::PeftConfig& peft() const { return peft_; }
  const models::ActivationCheckpointing& checkpointing() const { return checkpointing_; }

 private:
  models::PeftConfig peft_;
  models::ActivationCheckpointing checkpointing_;
  nlohmann::json hf_;
  std::string where_;
  std::map<std::string, int64_t> quant_bytes_;  // HF name -> bytes of the whole weight's blocks
  bool half_ = false;                           // bf16 / fp16
};

// What one pipeline rank (the whole model when pp = 1) holds at a tp size, whatever the ZeRO
// stage and micro-batch: its model chunks (one, or v interleaved) as one stage model.
struct StageShape {
  std::string layers;  // "0-5", interleaved "0-1, 8-9"
  int64_t n_layers = 0;
  // Trainable elements per unit (what ZeRO partitions): the model's units, then their
  // routed-expert parts (unit_expert), as parallel::ZeroEngine lays them out.
  std::vector<int64_t> unit_lens;
  std::vector<bool> unit_expert;
  int64_t frozen_bytes = 0, trainable = 0;
  bool first = false, last = false;  // holds the embedding / the head
  int boundaries = 0;                // chunk edges a micro-batch crosses to another rank
  // Per token, forward + backward: matmul FLOPs through f32 and through kept-quantized
  // weights; the query width of every layer (attention costs attention_flops x T x width
  // per token: forward 4, backward 10 with its recompute of the scores, and 4 more for a
  // full recompute of its forward).
  double f32_flops = 0, quant_flops = 0, attention_width = 0, attention_flops = 14;
  std::unique_ptr<models::CausalLM> model;
};

std::vector<StageShape> stage_shapes(const ModelSource& src, int tp, bool sp,
                                     const parallel::PipelineConfig& pc, int ep = 1) {
  // The cut the trainer makes (Trainer::pipeline_stage_range): from the whole base model;
  // rank r holds chunks r, r + p, r + 2p, ...
  std::vector<int64_t> counts;
  if (pc.size > 1) counts = parallel::partition_model(pc, *src.make(1, false, {}, false), "config");
  std::vector<StageShape> out(pc.size);
  for (int r = 0; r < pc.size; ++r) {
    StageShape& s = out[r];
    models::StageRange range;
    range.ep_size = ep;  // expert-parallel rank 0's slice: every rank holds as many
    int64_t at = 0;
    const int k = static_cast<int>(counts.size());
    for (int c = 0; c < k; ++c) {
      if (c % pc.size == r) {
        range.chunks.emplace_back(at, at + counts[c]);
        s.layers += (s.layers.empty() ? "" : ", ") + std::to_string(at) + "-" +
                    std::to_string(at + counts[c] - 1);
        s.boundaries += (c > 0) + (c + 1 < k);
      }
      at += counts[c];
    }
    s.model = src.make(tp, sp, range);
    const models::CausalLM& m = *s.model;
    if (range.chunks.empty()) s.layers = "0-" + std::to_string(m.num_layers() - 1);
    for (const auto& [a, b] : range.chunks) s.n_layers += b - a;
    if (range.chunks.empty()) s.n_layers = m.num_layers();
    s.first = m.first_stage();
    s.last = m.last_stage();
    std::vector<int64_t> expert_lens;
    for (const auto& unit : s.model->units()) {
      int64_t len[2] = {0, 0};
      for (const nn::Parameter* p : unit)
        if (p->trainable) len[p->expert] += shape_numel(p->shape);
      s.unit_lens.push_back(len[0]);
      if (len[1] > 0) expert_lens.push_back(len[1]);
      s.trainable += len[0] + len[1];
    }
    s.unit_expert.assign(s.unit_lens.size(), false);
    s.unit_lens.insert(s.unit_lens.end(), expert_lens.begin(), expert_lens.end());
    s.unit_expert.resize(s.unit_lens.size(), true);
    // A tied head reads the token table on the stage that holds the head.
    const nn::Parameter* head = m.last_stage() ? m.tied_embedding() : nullptr;
    const int prefix_unit = m.num_layers() + 2;
    // Full activation checkpointing runs the forward of the checkpointed blocks (every one,
    // or with method block the first num_layers of each chunk) twice: 2n more per token of
    // their weights, spread evenly over the stage's blocks here, and the attention forward
    // (4 x T x width more). Selective costs nothing more: attention's backward always
    // recomputes its scores.
    using G = models::ActivationCheckpointing::Granularity;
    const models::ActivationCheckpointing& ac = src.checkpointing();
    double recomputed = 0;  // fraction of the stage's blocks
    if (ac.granularity == G::full) {
      int64_t n = 0;
      if (range.chunks.empty()) n = std::min<int64_t>(ac.num_layers, m.num_layers());
      for (const auto& [a, b] : range.chunks) n += std::min<int64_t>(ac.num_layers, b - a);
      recomputed = ac.block_method ? static_cast<double>(n) / static_cast<double>(s.n_layers) : 1.0;
      s.attention_flops += 4 * recomputed;
    }
    for (const auto& p : s.model->params().all()) {
      if (!p->trainable) s.frozen_bytes += src.frozen_bytes(*p);
      // A KV prefix runs once per step, not per token.
      const bool matmul = ((p->kind == nn::ParamKind::Weight || p->kind == nn::ParamKind::Router) &&
                           p->shape.size() == 2 && m.unit_of(p->name) != prefix_unit) ||
                          p.get() == head;
      if (!matmul) continue;
      // Per token: forward 2n, the input's gradient 2n, the weight's gradient 2n if trained.
      const double e = static_cast<double>(shape_numel(p->shape));
      const int u = m.unit_of(p->name);
      const double again = u >= 1 && u <= m.num_layers() ? 2 * e * recomputed : 0.0;
      if (src.held_quantized(*p))
        s.quant_flops += 4 * e + again;
      else
        s.f32_flops += (p->trainable ? 6 : 4) * e + again;
    }
    s.attention_width = static_cast<double>(s.n_layers) * src.hidden() / tp;
  }
  return out;
}

// Micro-batches whose activations rank r holds at once (each in its own context, all the
// rank's chunks of it): the schedule's own count (parallel/pipeline_schedule.h).
int in_flight(const Layout& l, int r) {
  if (l.pp == 1) return 1;
  return parallel::max_in_flight(
      parallel::stage_schedule(l.schedule, l.pp, r, static_cast<int>(l.accum), l.virtual_stages));
}

LayoutPlan evaluate(const std::vector<StageShape>& shapes, const Layout& l, int world, int64_t seq,
                    int64_t hidden) {
  const Calibration& cal = calibration();
  LayoutPlan out;
  out.layout = l;
  StepWork w;
  w.world = world;
  w.pp = l.pp;
  w.virtual_stages = l.virtual_stages;
  w.micro_batches = l.accum;
  const double tokens = static_cast<double>(l.micro * seq);
  const double bsh = tokens * static_cast<double>(hidden);
  for (size_t r = 0; r < shapes.size(); ++r) {
    const StageShape& s = shapes[r];
    StagePlan st;
    st.layers = s.layers;
    st.n_layers = s.n_layers;
    const parallel::ZeroPartition part =
        parallel::ZeroPartition::make(s.unit_lens, l.dp, 0, s.unit_expert, l.dp / l.ep, 0);
    st.state = part.memory(l.zero, s.frozen_bytes, l.bytes, l.accum);
    st.paper_state = part.memory(l.zero, s.frozen_bytes, l.paper_bytes);
    st.activation_bytes = s.model->activation_bytes(l.micro, seq);
    st.in_flight = in_flight(l, static_cast<int>(r));
    // OpenMPI 4.1's non-blocking reductions hold temporaries the engine does not see
    // (measured as peak RSS beyond the engine's buffers, GPT-2 124M): the stage-0 all-reduce
    // one as large as its bucket (468 MiB at dp2 and at dp4 for a 475 MiB gradient); past 2
    // ranks a reduce-scatter about twice its unit (ZeRO-2 at dp4: 362 MiB, the largest unit
    // 151 MiB; none at dp2); and at ZeRO-1 a pipeline stage starts every unit's at once
    // (ZeroEngine::reduce_grads: 275 MiB for a stage's 255 MiB of units at pp4 x dp2).
    if (l.dp > 1) {
      int64_t padded = 0, largest = 0;
      const int64_t f = l.bytes.comm;
      for (size_t u = 0; u < part.piece.size(); ++u) {
        padded += f * part.piece[u] * part.world_of(u);
        largest = std::max(largest, f * part.piece[u] * part.world_of(u));
      }
      if (l.zero == 0) st.mpi_bytes = f * std::min(s.trainable, l.reduce_bucket);
      if (l.zero == 1 && l.pp > 1) st.mpi_bytes = padded;
      if (l.zero == 2 && l.dp > 2) st.mpi_bytes = 2 * largest;
    }
    st.peak_bytes = cal.process_bytes + st.state.model_state() + st.state.buffers + st.mpi_bytes +
                    st.in_flight * st.activation_bytes;
    out.peak_bytes = std::max(out.peak_bytes, st.peak_bytes);
    out.stages.push_back(st);

    StageWork sw;
    sw.f32_flops =
        tokens * (s.f32_flops + s.attention_flops * static_cast<double>(seq) * s.attention_width);
    sw.quant_flops = tokens * s.quant_flops;
    // Megatron's 4 all-reduces of b*s*h per layer (or as many bytes in all-gathers and
    // reduce-scatters under sequence parallel), and one each for the embedding and the head.
    const double tp_calls = 4.0 * static_cast<double>(s.n_layers) + s.first + s.last;
    if (l.tp > 1 && l.sequence_parallel) {
      sw.tp.all_gather = sw.tp.reduce_scatter = tp_calls * ring_bytes(bsh, l.tp);
      sw.tp.calls = 2 * tp_calls;
    } else if (l.tp > 1) {
      sw.tp.all_reduce = tp_calls * all_reduce_bytes(bsh, l.tp);
      sw.tp.calls = tp_calls;
    }
    // The activation forward and its gradient back, across each edge to another stage.
    sw.p2p.p2p = s.boundaries * 4.0 * bsh / (l.sequence_parallel ? l.tp : 1);
    sw.p2p.calls = s.boundaries;
    w.stages.push_back(sw);
    const int units = static_cast<int>(
        std::count_if(s.unit_lens.begin(), s.unit_lens.end(), [](int64_t n) { return n > 0; }));
    // Under mixed precision the all-gathers (stages 1-2 after the step, stage 3 per use)
    // carry the 16-bit weights (norms, biases and a PEFT run's f32 adapters, a small share,
    // are counted at 2 bytes too).
    const Traffic dp = zero_traffic(
        l.zero, static_cast<double>(s.trainable), units, static_cast<double>(l.reduce_bucket), l.dp,
        l.accum, static_cast<double>(l.bytes.comm), l.bytes.half > 0 ? 2.0 : 4.0);
    if (seconds(dp, cal, world) >= seconds(w.dp, cal, world)) w.dp = dp;
    w.adamw_elements =
        std::max(w.adamw_elements, static_cast<double>(l.zero >= 1 ? part.shard_len : s.trainable));
  }
  out.time = estimate_step(w, cal);
  return out;
}

// Model-state bytes per element at the config's precision, as the engine holds them
// (parallel::StateBytes), and as the ZeRO paper's mixed-precision layout would.
parallel::StateBytes state_bytes(const TrainConfig& cfg, int zero_stage) {
  parallel::StateBytes b;
  if (cfg.precision != TrainConfig::Precision::fp32) b = parallel::StateBytes::loom_mixed();
  if (cfg.zero.comm) b.comm = 2;  // communication_data_type bf16/fp16
  // grad_accum_dtype bf16/fp16: the shard's gradients (the engine takes it at stages 2-3).
  if (cfg.grad_accum_dtype != "fp32" && zero_stage >= 2) b.grad = 2;
  return b;
}
parallel::StateBytes paper_state_bytes(const TrainConfig& cfg) {
  if (cfg.precision == TrainConfig::Precision::fp32) return {};
  return parallel::StateBytes::paper_mixed(cfg.grad_accum_dtype == "fp32" ? 4 : 2);
}

Layout config_layout(const TrainConfig& cfg) {
  Layout l;
  l.bytes = state_bytes(cfg, cfg.zero.stage);
  l.paper_bytes = paper_state_bytes(cfg);
  l.dp = cfg.data_parallel;
  l.ep = cfg.expert_parallel;
  l.tp = cfg.tensor_parallel;
  l.pp = cfg.pipeline.size;
  l.zero = cfg.zero.stage;
  l.sequence_parallel = cfg.sequence_parallel && cfg.tensor_parallel > 1;
  l.micro = cfg.micro_batch;
  l.accum = cfg.grad_accum;
  l.schedule = cfg.pipeline.schedule;
  l.virtual_stages = cfg.pipeline.virtual_stages;
  l.partition = cfg.pipeline.layers.empty() ? cfg.pipeline.partition : "";
  l.reduce_bucket = cfg.zero.reduce_bucket_size;
  return l;
}

std::vector<int> divisors(int64_t n) {
  std::vector<int> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(static_cast<int>(i));
  return d;
}

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

double mib(int64_t b) { return static_cast<double>(b) / 1048576.0; }

// "llama + lora, 136.96M parameters (2.442M trainable)" of the whole model at tp (tp rank 0's).
std::string model_line(const ModelSource& src, int tp) {
  auto whole = src.make(tp, false, {});
  const nn::ParamStore& ps = whole->params();
  std::string ckpt = checkpointing_str(src.checkpointing());
  if (!ckpt.empty()) ckpt = ", " + ckpt;
  return fmt("%s%s, %.2fM parameters (%.3fM trainable)%s%s", whole->arch().c_str(),
             src.peft().enabled() ? (" + " + src.peft().method).c_str() : "", ps.numel() / 1e6,
             ps.trainable_numel() / 1e6, tp > 1 ? " per tensor-parallel rank" : "", ckpt.c_str());
}

std::string time_line(const StepTime& t) {
  return fmt(
      "%.3g s = pipeline %.3g (critical path %.3g = micro-batch %.3g x %.3g; micro-batch "
      "= compute %.3g + tp %.3g + p2p %.3g) + dp %.3g + AdamW %.3g",
      t.total, t.pipeline, t.critical, t.micro, t.critical / std::max(t.micro, 1e-300), t.compute,
      t.tp, t.p2p, t.dp, t.optimizer);
}

}  // namespace

std::string Layout::str() const {
  std::string s =
      fmt("dp%d tp%d%s pp%d ZeRO-%d micro %lld x %lld", dp, tp, sequence_parallel ? "(sp)" : "", pp,
          zero, static_cast<long long>(micro), static_cast<long long>(accum));
  if (pp > 1)
    s += " " + schedule + (virtual_stages > 1 ? "x" + std::to_string(virtual_stages) : "");
  return s;
}

std::string Layout::overrides() const {
  std::string s =
      fmt("--set tensor_parallel.size=%d --set pipeline_parallel.size=%d --set "
          "zero_optimization.stage=%d --set train_micro_batch_size_per_gpu=%lld --set "
          "gradient_accumulation_steps=%lld",
          tp, pp, zero, static_cast<long long>(micro), static_cast<long long>(accum));
  if (pp > 1) {
    s += " --set pipeline_parallel.schedule=" + schedule +
         " --set pipeline_parallel.virtual_stages=" + std::to_string(virtual_stages);
    if (!partition.empty()) s += " --set pipeline_parallel.partition=" + partition;
  }
  return s;
}

LayoutPlan plan_layout(const TrainConfig& cfg, int world) {
  const ModelSource src(cfg);
  const Layout l = config_layout(cfg);
  return evaluate(stage_shapes(src, l.tp, l.sequence_parallel, cfg.pipeline, l.ep), l, world,
                  cfg.data.seq_len, src.hidden());
}

std::string plan_report(const TrainConfig& cfg, int world) {
  const ModelSource src(cfg);
  const Layout l = config_layout(cfg);
  const std::vector<StageShape> shapes =
      stage_shapes(src, l.tp, l.sequence_parallel, cfg.pipeline, l.ep);
  const int64_t seq = cfg.data.seq_len;
  std::string out =
      fmt("loom plan: %s, %d ranks = %d data-parallel x %d tensor-parallel%s x %d pipeline stages, "
          "micro-batch %lld x %lld tokens, %lld per step, %s\n",
          model_line(src, l.tp).c_str(), world, l.dp, l.tp,
          l.sequence_parallel ? " (sequence parallel)" : "", l.pp, static_cast<long long>(l.micro),
          static_cast<long long>(seq), static_cast<long long>(l.accum), precision_name(cfg));
  if (l.ep > 1)
    out +=
        fmt("expert parallel %d: each rank holds 1/%d of the routed experts, sharded over "
            "the %d data-parallel ranks that hold the same ones\n",
            l.ep, l.ep, l.dp / l.ep);
  if (cfg.precision != TrainConfig::Precision::fp32)
    out +=
        fmt("model state per trained element as loom train holds it: 4 bytes of fp32 master "
            "weights and 8 of AdamW moments (sharded from stage 1), each matrix in %s for the "
            "products (2 bytes; at stage 0 a copy beside the master, at stages 1-2 the only "
            "whole copy, at stage 3 gathered in 16 bits per use), %s; frozen "
            "matrices in their 2 bytes alone; activations fp32 (each product rounds its "
            "operands)\n",
            precision_name(cfg),
            cfg.grad_accum_dtype == "fp32"
                ? "4-byte fp32 gradients"
                : ("4-byte fp32 gradients at stages 0-1 (where loom train refuses " +
                   cfg.grad_accum_dtype + " accumulation), 2-byte " + cfg.grad_accum_dtype +
                   " ones at stages 2-3")
                      .c_str());
  const LayoutPlan plan = evaluate(shapes, l, world, seq, src.hidden());
  if (l.pp == 1) {
    out +=
        "MiB per rank   params    grads  optimizer  model state  buffers  activations*    total"
        "   peak RSS**\n";
    for (int stage = 0; stage <= 3; ++stage) {
      Layout z = l;
      z.zero = stage;
      z.bytes = state_bytes(cfg, stage);
      const StagePlan s = evaluate(shapes, z, world, seq, src.hidden()).stages[0];
      const parallel::ZeroMemory& m = s.state;
      out += fmt("stage %d%s %9.1f %8.1f %10.1f %12.1f %8.1f %12.1f %8.1f %12.1f\n", stage,
                 stage == cfg.zero.stage ? " (cfg)" : "      ", mib(m.params), mib(m.grads),
                 mib(m.optimizer), mib(m.model_state()), mib(m.buffers), mib(s.activation_bytes),
                 mib(m.model_state() + m.buffers + s.activation_bytes), mib(s.peak_bytes));
    }
    out += "* activations: the model's estimate for one micro-batch's forward and backward\n";
    std::string gb;  // the ZeRO paper's unit (Rajbhandari et al. 2020, Figure 1)
    for (int stage = 0; stage <= 3; ++stage) {
      Layout z = l;
      z.zero = stage;
      z.bytes = state_bytes(cfg, stage);
      gb += fmt("%s stage %d %.1f", stage ? "," : "", stage,
                evaluate(shapes, z, world, seq, src.hidden()).stages[0].state.model_state() / 1e9);
    }
    out += "model state per rank in GB (10^9 bytes):" + gb + "\n";
    if (cfg.precision != TrainConfig::Precision::fp32) {
      // Rajbhandari et al. 2020, Figure 1: 16-bit weights, gradients in the accumulation
      // dtype, fp32 master and moments (K = 12) sharded from stage 1.
      std::string paper;
      for (int stage = 0; stage <= 3; ++stage) {
        Layout z = l;
        z.zero = stage;
        paper +=
            fmt("%s stage %d %.1f", stage ? "," : "", stage,
                evaluate(shapes, z, world, seq, src.hidden()).stages[0].paper_state.model_state() /
                    1e9);
      }
      out +=
          fmt("the ZeRO paper's mixed-precision layout (2-byte weights, %lld-byte gradients, fp32 "
              "master and moments sharded from stage 1), in GB:%s\n",
              static_cast<long long>(l.paper_bytes.grad), paper.c_str());
    }
  } else {
    out +=
        fmt("pipeline: %d stages (%s schedule), ZeRO stage %d over %d data-parallel ranks; "
            "MiB per rank of each stage:\n",
            l.pp, l.schedule.c_str(), l.zero, l.dp);
    out +=
        "stage  layers            params     grads  optimizer  buffers  activations* x in "
        "flight   peak RSS**\n";
    for (size_t r = 0; r < plan.stages.size(); ++r) {
      const StagePlan& s = plan.stages[r];
      out += fmt("%-6zu %-14s %9.1f %9.1f %10.1f %8.1f %12.1f x %-7d %12.1f\n", r,
                 (s.layers + " (" + std::to_string(s.n_layers) + ")").c_str(), mib(s.state.params),
                 mib(s.state.grads), mib(s.state.optimizer), mib(s.state.buffers),
                 mib(s.activation_bytes), s.in_flight, mib(s.peak_bytes));
    }
    out +=
        "* activations: the model's estimate for one micro-batch's forward and backward on "
        "the stage's layers, held for as many micro-batches as the schedule keeps in flight\n";
  }
  const Calibration& cal = calibration();
  out += fmt(
      "** peak RSS: the bytes above plus the process (%.0f MiB), calibrated on %s%s\n",
      mib(cal.process_bytes), cal.machine.c_str(),
      plan.stages[0].mpi_bytes > 0 ? "; and MPI's temporaries for the engine's reductions" : "");
  out += "estimated step: " + time_line(plan.time) + "\n";
  // What the calibration (bench/plan_calibrate.sh) divides by the measured time.
  const Traffic& t = plan.time.traffic;
  out +=
      fmt("the slowest stage: FLOPs per micro-batch %.6g through f32 weights, %.6g through "
          "quantized weights; bytes sent per step %.6g all-reduce, %.6g reduce-scatter, %.6g "
          "all-gather, %.6g p2p, in %.6g calls\n",
          plan.time.f32_flops, plan.time.quant_flops, t.all_reduce, t.reduce_scatter, t.all_gather,
          t.p2p, t.calls);
  return out;
}

TrainConfig search_config(const fs::path& path, const std::vector<std::string>& sets, int world) {
  nlohmann::json j = io::read_json_file(path);
  for (const auto& s : sets) apply_override(j, s);
  // Given, train_batch_size is the global batch (parse_config checks its type below).
  if (!j.contains("train_batch_size"))
    j["train_batch_size"] = parse_config(j, path.string(), world).train_batch;
  j.erase("train_micro_batch_size_per_gpu");
  j.erase("gradient_accumulation_steps");
  if (j.contains("tensor_parallel")) j["tensor_parallel"]["size"] = 1;
  if (j.contains("pipeline_parallel")) j["pipeline_parallel"]["size"] = 1;
  return parse_config(j, path.string(), 1);
}

std::vector<LayoutPlan> runnable_layouts(const TrainConfig& cfg, int world) {
  const ModelSource src(cfg);
  const int64_t global = cfg.train_batch, seq = cfg.data.seq_len;
  std::vector<LayoutPlan> out;
  for (int tp : divisors(world)) {
    // Layouts the trainer refuses are not offered.
    if (tp > 1 && src.peft().method == "prefix" && src.peft().prefix_projection) continue;
    const bool sp = cfg.sequence_parallel && tp > 1;
    for (int pp : divisors(world / tp)) {
      const int dp = world / (tp * pp);
      if (global % dp != 0) continue;
      // Interleaved with 2 chunks per rank besides the plain schedules (more chunks shrink
      // the bubble further but cut the layers finer).
      for (int v : pp > 1 ? std::vector<int>{1, 2} : std::vector<int>{1}) {
        parallel::PipelineConfig pc = cfg.pipeline;
        pc.size = pp;
        pc.virtual_stages = v;
        if (!pc.layers.empty() && static_cast<int>(pc.layers.size()) != pc.chunks()) {
          pc.layers.clear();  // the config's list is for its own number of chunks
          pc.partition = "uniform";
        }
        std::vector<StageShape> shapes;
        try {
          shapes = stage_shapes(src, tp, sp, pc);
        } catch (const Error&) {  // the model cannot split so (heads, layers, vocabulary,
                                  // a KV prefix under PP)
          continue;
        }
        std::vector<std::string> schedules = {"1f1b"};
        if (pp > 1)
          schedules = v > 1 ? std::vector<std::string>{"interleaved"}
                            : std::vector<std::string>{"1f1b", "gpipe"};
        for (int micro : divisors(global / dp)) {
          if (sp && (micro * seq) % tp != 0) continue;
          const int64_t accum = global / dp / micro;
          if (v > 1 && accum % pp != 0) continue;  // interleaved runs groups of pp micro-batches
          // 16-bit gradient accumulation runs at stages 2-3 only (one process too).
          const bool accum16 = cfg.grad_accum_dtype != "fp32";
          for (int zero = accum16 ? 2 : 0; zero <= (dp > 1 || accum16 ? 3 : 0); ++zero) {
            for (const std::string& schedule : schedules) {
              Layout l;
              l.dp = dp;
              l.tp = tp;
              l.pp = pp;
              l.zero = zero;
              l.sequence_parallel = sp;
              l.micro = micro;
              l.accum = accum;
              l.schedule = schedule;
              l.virtual_stages = v;
              l.partition = pc.layers.empty() ? pc.partition : "";
              l.reduce_bucket = cfg.zero.reduce_bucket_size;
              l.bytes = state_bytes(cfg, zero);
              l.paper_bytes = paper_state_bytes(cfg);
              out.push_back(evaluate(shapes, l, world, seq, src.hidden()));
            }
          }
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const LayoutPlan& a, const LayoutPlan& b) {
    if (a.time.total != b.time.total) return a.time.total < b.time.total;
    return a.peak_bytes < b.peak_bytes;
  });
  return out;
}

std::string layouts_report(const TrainConfig& cfg, int world, double budget_gib) {
  const std::vector<LayoutPlan> all = runnable_layouts(cfg, world);
  LOOM_CHECK(!all.empty(), "no layout of " + std::to_string(world) +
                               " ranks can run this model at the global batch of " +
                               std::to_string(cfg.train_batch));
  const auto budget = static_cast<int64_t>(budget_gib * 1073741824.0);
  std::vector<const LayoutPlan*> fit;
  const LayoutPlan* smallest = &all[0];
  for (const LayoutPlan& p : all) {
    if (p.peak_bytes <= budget) fit.push_back(&p);
    if (p.peak_bytes < smallest->peak_bytes) smallest = &p;
  }
  LOOM_CHECK(!fit.empty(), fmt("no layout of %d ranks fits in %.3g GiB per rank (%zu layouts "
                               "considered); the smallest estimate is %.2f GiB per rank: %s",
                               world, budget_gib, all.size(), mib(smallest->peak_bytes) / 1024,
                               smallest->layout.str().c_str()));
  const ModelSource src(cfg);
  std::string out = fmt(
      "loom plan: %s; %d ranks, global batch %lld x %lld tokens: %zu of %zu layouts fit in %.3g "
      "GiB per rank, fastest first%s\n",
      model_line(src, 1).c_str(), world, static_cast<long long>(cfg.train_batch),
      static_cast<long long>(cfg.data.seq_len), fit.size(), all.size(), budget_gib,
      cfg.sequence_parallel ? " (s after a tp size: sequence parallel)" : "");
  out +=
      "   #    dp    tp    pp  ZeRO  micro x accum  schedule        peak RSS MiB/rank  "
      "step s = pipeline + dp + AdamW\n";
  const size_t shown = std::min<size_t>(fit.size(), 20);
  for (size_t i = 0; i < shown; ++i) {
    const LayoutPlan& p = *fit[i];
    const Layout& l = p.layout;
    const std::string schedule =
        l.pp == 1
            ? "-"
            : l.schedule + (l.virtual_stages > 1 ? " x" + std::to_string(l.virtual_stages) : "");
    out += fmt("%4zu %5d %5d%s %4d %5d %6lld x %-6lld %-15s %17.1f  %.3g = %.3g + %.3g + %.3g\n",
               i + 1, l.dp, l.tp, l.sequence_parallel ? "s" : " ", l.pp, l.zero,
               static_cast<long long>(l.micro), static_cast<long long>(l.accum), schedule.c_str(),
               mib(p.peak_bytes), p.time.total, p.time.pipeline, p.time.dp, p.time.optimizer);
  }
  if (shown < fit.size()) out += fmt("  ... and %zu more\n", fit.size() - shown);
  out += "the fastest: " + fit[0]->layout.overrides() + "\n";
  const Calibration& cal = calibration();
  out +=
      fmt("peak RSS: planned bytes + the process (%.0f MiB); step time: the cost model "
          "(src/loom/train/cost_model.h), calibrated on %s, all ranks on one such machine\n",
          mib(cal.process_bytes), cal.machine.c_str());
  return out;
}

}  // namespace loom::train
