#include "loom/train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "loom/dist/job_trace.h"
#include "loom/dist/watchdog.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/model_loader.h"
#include "loom/io/peft_adapter.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/matmul_bf16.h"
#include "loom/models/peft.h"
#include "loom/models/registry.h"
#include "loom/nn/moe.h"
#include "loom/nn/weight_ops.h"
#include "loom/optim/clip.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/pipeline_schedule.h"
#include "loom/train/checkpoint.h"
#include "loom/train/monitor.h"
#include "loom/util/error.h"
#include "loom/util/path.h"
#include "loom/util/profile.h"
#include "loom/util/progress.h"
#include "loom/util/stop_signals.h"
#include "loom/util/trace.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {
std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

// "[0, 2) [4, 6)": the layers of a pipeline rank's chunks.
std::string layers_str(const models::StageRange& s) {
  std::string out;
  for (const auto& [a, b] : s.chunks)
    out += (out.empty() ? "[" : " [") + std::to_string(a) + ", " + std::to_string(b) + ")";
  return out;
}

// fp16: "  scale 65536" (and " skipped: overflow" when the step was), else "".
std::string scale_str(const StepStats& st) {
  if (st.loss_scale == 1.0 && !st.skipped) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "  scale %g%s", st.loss_scale,
                st.skipped ? " (overflow: skipped)" : "");
  return buf;
}

// Resident memory now (/proc/self/statm's second field, in pages); 0 where unreadable.
int64_t current_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * ::sysconf(_SC_PAGESIZE) : 0;
}

int64_t peak_rss_bytes() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}
}  // namespace

std::string model_path(const nlohmann::json& m) {
  if (m.is_string()) return m.get<std::string>();
  if (m.is_object() && m.contains("path") && m["path"].is_string()) return m["path"];
  return "";
}

std::unique_ptr<models::CausalLM> build_model(const nlohmann::json& m, uint64_t seed,
                                              const std::string& where, io::LoadOptions opt) {
  if (m.is_string()) return io::load_model(m.get<std::string>(), opt);
  LOOM_CHECK(m.is_object(), where + ": config key 'model' must be a path or an object");
  if (m.contains("path")) {
    for (auto& [k, v] : m.items())
      LOOM_CHECK(k == "path" || k == "keep_quantized", where + ": unknown config key 'model." + k +
                                                           "' (known here: keep_quantized, path)");
    LOOM_CHECK(m["path"].is_string(), where + ": config key 'model.path' must be a string");
    if (m.contains("keep_quantized")) {
      LOOM_CHECK(m["keep_quantized"].is_boolean(),
                 where + ": config key 'model.keep_quantized' must be true or false");
      opt.keep_quantized = m["keep_quantized"].get<bool>();
    }
    return io::load_model(m["path"].get<std::string>(), opt);
  }
  auto model = models::make_model(model_hf_config(m, where), where + " (model)", opt.tp, opt.stage);
  model->params().init(seed);
  return model;
}

nlohmann::json model_hf_config(const nlohmann::json& m, const std::string& where) {
  if (const std::string path = model_path(m); !path.empty()) return io::read_model_config(path);
  LOOM_CHECK(m.is_object(), where + ": config key 'model' must be a path or an object");
  // Sizes as the architecture's config.json spells them; the model starts from `seed`.
  static const std::map<std::string, std::vector<std::string>> kKeys = {
      {"gpt2",
       {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "layer_norm_epsilon",
        "initializer_range"}},
      {"llama",
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_bias",
        "initializer_range", "bos_token_id", "eos_token_id"}}};
  const std::string arch = m.value("arch", std::string());
  const auto known = kKeys.find(arch == "qwen2" ? "llama" : arch);
  LOOM_CHECK(known != kKeys.end(), where +
                                       ": config key 'model.arch' must be \"gpt2\", "
                                       "\"llama\" or \"qwen2\" (or give 'model.path')");
  nlohmann::json hf = nlohmann::json::object();
  for (auto& [k, v] : m.items()) {
    if (k == "arch") continue;
    LOOM_CHECK(std::find(known->second.begin(), known->second.end(), k) != known->second.end(),
               where + ": unknown config key 'model." + k + "' for arch '" + arch + "'");
    hf[k] = v;
  }
  hf["model_type"] = arch;
  return hf;
}

Trainer::Trainer(const TrainConfig& cfg, std::unique_ptr<data::Dataset> dataset,
                 dist::ProcessMesh* mesh)
    : cfg_(cfg), data_(std::move(dataset)) {
  cfg_.zero.micro_batches = cfg.grad_accum;
  if (cfg.grad_accum_dtype != "fp32") {
    // 16-bit accumulators are the ZeRO shard's (stages 2-3, where each micro-batch's unit
    // gradient is an fp32 buffer of its own, reduced and added into the shard); at stages
    // 0-1 the backward's products accumulate into the fp32 gradients themselves.
    const std::string key =
        "config key 'data_types.grad_accum_dtype' \"" + cfg.grad_accum_dtype + "\"";
    const char* need = cfg.grad_accum_dtype == "bf16" ? "bf16" : "fp16";
    LOOM_CHECK(
        precision_name(cfg) == std::string(need),
        key + " needs '" + need + ".enabled': true (the run is " + precision_name(cfg) + ")");
    LOOM_CHECK(cfg.zero.stage >= 2,
               key +
                   " needs zero_optimization.stage 2 or 3 (the 16-bit accumulator is the "
                   "sharded gradient's; stage " +
                   std::to_string(cfg.zero.stage) + " accumulates in the fp32 gradients)");
    cfg_.zero.accum = cfg.grad_accum_dtype == "bf16" ? kernels::Half::bf16 : kernels::Half::f16;
  }
  if (cfg.precision != TrainConfig::Precision::fp32)
    cfg_.zero.half =
        cfg.precision == TrainConfig::Precision::bf16 ? kernels::Half::bf16 : kernels::Half::f16;
  if (cfg.precision == TrainConfig::Precision::fp16)
    scaler_ = std::make_unique<optim::LossScaler>(cfg.loss_scale);
  if (!mesh) {
    own_world_ = std::make_unique<dist::LocalComm>();
    own_mesh_ =
        std::make_unique<dist::ProcessMesh>(*own_world_, cfg.tensor_parallel, cfg.pipeline.size);
    mesh = own_mesh_.get();
  }
  mesh_ = mesh;
  // Progress bars (tokenizing, evaluation) on rank 0's terminal; logs keep plain lines.
  Progress::enable(mesh->world().rank() == 0 && ::isatty(fileno(stderr)));
  LOOM_CHECK(mesh->shape().tp == cfg.tensor_parallel && mesh->shape().pp == cfg.pipeline.size &&
                 mesh->shape().dp == cfg.data_parallel,
             "internal: the process mesh (dp " + std::to_string(mesh->shape().dp) + ", tp " +
                 std::to_string(mesh->shape().tp) + ") is not the config's layout");
  dp_ = &mesh->dp();
  tp_ = nn::TensorParallel{&mesh->tp(), cfg.sequence_parallel};
  // PEFT: the base stays frozen, so a GGUF base stays quantized unless the config says no.
  io::LoadOptions load;
  if (!cfg.peft_from.empty()) {
    io::AdapterFolder a = io::read_adapter_config(expand_user(cfg.peft_from));
    cfg_.peft = a.config;
  }
  load.keep_quantized = cfg_.peft.enabled();
  load.keep_f32_modules = cfg_.peft.modules_to_save;
  // Mixed precision with a frozen base: its matrices go into 16 bits as they are read (the
  // base never exists in f32 as a whole; hold_frozen_in_half below catches the rest).
  if (cfg_.peft.enabled()) load.half = cfg_.zero.half;
  load.tp = tp_;
  if (cfg.pipeline.size > 1) load.stage = stage_range_ = pipeline_stage_range();
  // Expert parallelism: this rank declares and loads only its slice of the routed experts.
  load.stage.ep_size = cfg.expert_parallel;
  load.stage.ep_rank = mesh->dp_rank() % cfg.expert_parallel;
  model_ = build_model(cfg.model, cfg.seed, "config", load);
  LOOM_CHECK(!cfg_.peft.enabled() || model_path(cfg.model) != "",
             "config: PEFT needs a pretrained base model (config key 'model' as a path)");
  LOOM_CHECK(!io::is_adapter_folder(expand_user(model_path(cfg.model))) || !cfg_.peft.enabled(),
             "config: 'model' is an adapter folder; to train it further give its base as "
             "'model' and the folder as peft.from_pretrained");
  LOOM_CHECK(cfg_.peft.method != "prefix" || !cfg_.peft.prefix_projection || !tp_.active(),
             "config: peft.prefix_projection under tensor_parallel.size > 1 is not supported "
             "(its table would be saved split); set it false");
  models::apply_peft(*model_, cfg_.peft, cfg.seed);
  const models::ActivationCheckpointing& ac = cfg.activation_checkpointing;
  model_->set_activation_checkpointing(ac);
  if (!cfg.peft_from.empty()) io::load_adapter_weights(*model_, expand_user(cfg.peft_from));
  // Resuming: the weights the checkpoint holds (the optimizer state follows below).
  TrainerState resume;
  const fs::path resume_dir = expand_user(cfg.resume_from);
  if (!cfg.resume_from.empty()) {
    resume = read_trainer_state(resume_dir);
    LOOM_CHECK(resume.train_batch == cfg.train_batch,
               resume_dir.string() + ": saved with a global batch of " +
                   std::to_string(resume.train_batch) + ", this run has " +
                   std::to_string(cfg.train_batch) +
                   " (the sample order depends on it; resume with the same train_batch_size)");
    if (cfg_.peft.enabled())
      io::load_adapter_weights(*model_, resume_dir);
    else
      io::load_hf_weights(*model_, resume_dir);
  }
  for (auto& p : model_->params().all())
    LOOM_CHECK(!p->quantized() || !p->trainable, "internal: quantized " + p->name + " trains");
  LOOM_CHECK(model_->params().trainable_numel() > 0,
             "config: nothing to train (every parameter is frozen)");
  // Mixed precision with a frozen base (PEFT): its matrices are kept in 16 bits only.
  if (cfg_.zero.half)
    nn::hold_frozen_in_half(model_->params(), *cfg_.zero.half,
                            [&](const nn::Parameter& p) { return model_->unit_of(p.name); });
  if (!data_) {
    LOOM_CHECK(cfg.data.tokenizer != "bytes" || model_->vocab_size() >= 256,
               "data.tokenizer 'bytes' needs a vocabulary of at least 256, the model has " +
                   std::to_string(model_->vocab_size()));
    TrainData td = build_train_data(cfg.data, data_codec(cfg.data, cfg.model), cfg.seed);
    data_ = std::move(td.train);
    valid_ = std::move(td.valid);
    data_summary_ = td.summary;
  }
  LOOM_CHECK(data_->seq_len() <= model_->max_positions(),
             "data.seq_len " + std::to_string(data_->seq_len()) + " exceeds the model's " +
                 std::to_string(model_->max_positions()) + " positions");
  sampler_ = std::make_unique<data::Sampler>(*data_, cfg.seed, cfg.data.shuffle, cfg.micro_batch,
                                             cfg.grad_accum, dp_->size(), dp_->rank());
  if (cfg.pipeline.size > 1) {
    // The stage's activation contexts: as many copies of its modules as micro-batches its
    // schedule holds at once; the engine points them at the model's parameters.
    const int K = parallel::max_in_flight(
        parallel::stage_schedule(cfg.pipeline.schedule, cfg.pipeline.size, mesh_->pp_rank(),
                                 static_cast<int>(cfg.grad_accum), cfg.pipeline.virtual_stages));
    std::vector<models::CausalLM*> contexts = {model_.get()};
    for (int k = 1; k < K; ++k) {
      // Declared only: add_context points every parameter at the stage model's storage, so
      // buffers of its own would be dropped at once (and with PEFT, written first: a
      // transient as large as the stage's f32 weights, measured by bench/plan_check.sh).
      auto c = models::make_model(model_->hf_config(), "config (pipeline stage)", tp_, load.stage,
                                  models::ParamBuffers::DeclareOnly);
      models::declare_peft(*c, cfg_.peft);
      c->set_activation_checkpointing(ac);
      contexts.push_back(c.get());
      contexts_.push_back(std::move(c));
    }
    stage_ = std::make_unique<parallel::PipelineStage>(contexts, mesh_->pp(), cfg.pipeline.schedule,
                                                       cfg.pipeline.virtual_stages);
  }
  if (cfg.expert_parallel > 1) {
    // Over every pipeline stage: a stage may hold only dense layers.
    double moe_layers = static_cast<double>(model_->moe_layers().size());
    if (stage_) mesh_->pp().all_reduce_sum(&moe_layers, 1);
    LOOM_CHECK(moe_layers > 0, "config key 'expert_parallel.size': the " + model_->arch() +
                                   " model has no mixture-of-experts layers");
    ep_ = &mesh_->ep(cfg.expert_parallel);
    const nn::ExpertParallel ep{ep_};
    for_each_moe([&](nn::MoE& m) { m.set_expert_parallel(ep); });
  }
  engine_ = std::make_unique<parallel::ZeroEngine>(*model_, *dp_, cfg_.zero, cfg.adamw, tp_,
                                                   &mesh_->edp(cfg.expert_parallel));
  for (auto& c : contexts_) engine_->add_context(*c);  // now over the engine's layout
  if (cfg.moe_bias_update_rate > 0.0) {
    bool bias = false;
    for (const models::MoeLayer& l : model_->moe_layers())
      bias |= l.moe->router().bias() != nullptr;
    LOOM_CHECK(bias || (model_->moe_layers().empty() && stage_),
               "config key 'moe.bias_update_rate': the " + model_->arch() +
                   " model has no expert routing with a correction bias (deepseek_v3 has)");
    LOOM_CHECK(!cfg.peft.enabled() && cfg.peft_from.empty(),
               "config key 'moe.bias_update_rate' with peft: the correction bias belongs to "
               "the base model, which an adapter folder does not save");
  }
  sched_ = optim::Schedule::from_json(cfg.scheduler, cfg.adamw.lr, cfg.train_steps);
  if (!cfg.resume_from.empty()) {
    load_optimizer_state(resume_dir, resume, *engine_);
    step_ = resume.step;
    skipped_ = resume.skipped_steps;
    // fp16 continues with the saved scale; from another precision it starts afresh, the
    // steps skipped before still counted (the learning rate moves only on applied steps).
    if (scaler_) {
      optim::LossScaler::State s = resume.loss_scaler.value_or(scaler_->state());
      s.skipped_steps = resume.skipped_steps;
      scaler_->restore(s);
    }
  }
}

Trainer::~Trainer() = default;

models::StageRange Trainer::pipeline_stage_range() const {
  const parallel::PipelineConfig& pc = cfg_.pipeline;
  // The cut comes from the model's structure alone: its parameters are declared, nothing
  // is allocated and no weight is read.
  auto whole = models::make_model(model_hf_config(cfg_.model, "config"), "config (model)", {}, {},
                                  models::ParamBuffers::DeclareOnly);
  const std::vector<int64_t> layers = parallel::partition_model(pc, *whole, "config");
  // Rank r holds chunks r, r + p, r + 2p, ... of the size * virtual_stages.
  models::StageRange s;
  int64_t at = 0;
  for (int c = 0; c < pc.chunks(); ++c) {
    if (c % pc.size == mesh_->pp_rank()) s.chunks.emplace_back(at, at + layers[c]);
    at += layers[c];
  }
  return s;
}

StepStats Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  trace::Span span(trace::Kind::Step, -1, step_);
  StepStats st;
  st.step = step_;

  // 1. Data: this rank's micro-batches of the step, and the global batch's target tokens.
  std::vector<data::MicroBatch> micro;
  for (int64_t m = 0; m < cfg_.grad_accum; ++m) micro.push_back(sampler_->micro_batch(step_, m));
  double counts[2] = {0, 0};  // target tokens, input tokens
  for (auto& mb : micro) {
    counts[0] += static_cast<double>(kernels::count_targets(mb.targets.i32(), mb.targets.numel()));
    counts[1] += static_cast<double>(mb.ids.numel());
  }
  dp_->all_reduce_sum(counts, 2);
  st.target_tokens = static_cast<int64_t>(counts[0]);
  st.tokens = static_cast<int64_t>(counts[1]);
  // fp16: the loss (so every gradient) times the loss scale S; the optimizer divides it out.
  st.loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const float grad_scale = static_cast<float>(
      st.loss_scale / static_cast<double>(std::max<int64_t>(st.target_tokens, 1)));

  // 2. Forward and backward; gradients accumulate across micro-batches. 3. Gradient sync
  //    runs inside the backward: the engine reduces each unit's gradients (all ranks' sum)
  //    as soon as they are complete, and end_backward() waits for the last of them.
  //    A pipeline stage runs its schedule instead, then reduces (parallel/pipeline_stage.h).
  engine_->zero_grads();
  // V2's balance loss is a mean over the global batch's sequences (nn/moe_router.h).
  for_each_moe([&](nn::MoE& m) {
    m.router().set_aux_loss(1.0 / static_cast<double>(cfg_.train_batch), st.loss_scale);
  });
  double loss_sum = stage_ ? pipeline_passes(micro, grad_scale) : passes(micro, grad_scale);
  dp_->all_reduce_sum(&loss_sum, 1);
  if (stage_) mesh_->pp().all_reduce_sum(&loss_sum, 1);  // the last stage holds it
  st.loss = loss_sum / std::max<int64_t>(st.target_tokens, 1);

  if (grad_hook_) grad_hook_();

  // 4. Clip by the global norm, over every rank's shard and every stage (the optimizer
  //    applies the coefficient as it reads the gradients, and divides out the loss scale).
  double sq = engine_->grad_sq_norm();
  if (stage_) mesh_->pp().all_reduce_sum(&sq, 1);
  st.grad_norm = std::sqrt(sq) / st.loss_scale;
  // fp32: a non-finite gradient ends the run here, before the optimizer changes anything.
  if (!scaler_ && !std::isfinite(sq)) stop_on_non_finite(st);
  if (scaler_) {
    // fp16: an inf or NaN in any rank's gradients (found-inf, reduced over the whole job:
    // under ZeRO 0 a rank's norm covers only its own copy) skips the step everywhere, and
    // the scaler moves (or ends the run at min_loss_scale: LossScaleError).
    double found_inf = std::isfinite(sq) ? 0.0 : 1.0;
    mesh_->world().all_reduce_max(&found_inf);
    st.skipped = !scaler_->update(found_inf > 0.0);
  }
  const float clip = optim::clip_coefficient(st.grad_norm, cfg_.gradient_clipping);
  // 5. Optimizer on this rank's shard at this step's learning rate, then 6. parameter sync.
  //    The schedule counts applied steps only (a skipped step does not move it: DeepSpeed's).
  st.lr = sched_.lr_at(step_ - skipped_steps() + (st.skipped ? 1 : 0));
  if (!st.skipped) {
    trace::Span opt(trace::Kind::Optimizer);
    engine_->optimizer_step(static_cast<float>(st.lr), clip / static_cast<float>(st.loss_scale));
  }
  // 7. Mixture of experts: the step's loads over the global batch, and the correction
  //    bias's move toward balance (optim/expert_balance.h).
  st.expert_load = expert_loads(st.skipped ? 0.0f : static_cast<float>(cfg_.moe_bias_update_rate));

  ++step_;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

void Trainer::stop_on_non_finite(const StepStats& st) {
  // The norm is reduced over the whole job, so every rank is here at the same step. Each
  // rank looks for the first non-finite element it owns; the job agrees on the first in
  // (pipeline stage, parameter order), and the rank holding it says which element.
  const std::optional<parallel::ZeroEngine::NonFinite> nf = engine_->first_non_finite();
  const auto& all = model_->params().all();
  int64_t index = -1;
  if (nf)
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i].get() == nf->run->param) index = static_cast<int64_t>(i);
  const double kNone = 1e18;
  double key = index >= 0 ? mesh_->pp_rank() * 1e9 + static_cast<double>(index) : kNone;
  key = -key;  // the smallest key, through a max
  mesh_->world().all_reduce_max(&key);
  key = -key;
  std::string where;
  if (key >= kNone) {
    where = "no single gradient element is; their sum of squares overflowed";
  } else if (static_cast<int>(key / 1e9) != mesh_->pp_rank()) {
    where = "the first is in pipeline stage " + std::to_string(static_cast<int>(key / 1e9));
  } else {
    const nn::Parameter& p = *all[static_cast<size_t>(key - mesh_->pp_rank() * 1e9)];
    where = "the first is " + p.name;
    if (nf && nf->run->param == &p)
      where +=
          "[" + std::to_string(nn::full_index(p, nf->element)) + "] = " + std::to_string(nf->value);
  }
  throw Error("step " + std::to_string(st.step + 1) + ": the gradient is not finite (norm " +
              std::to_string(st.grad_norm) + ", loss " + std::to_string(st.loss) + "): " + where +
              ". The parameters and optimizer state were not updated; the last checkpoint is "
              "the place to resume from (a lower learning rate, or bf16 / fp16 with loss "
              "scaling, are the usual remedies)");
}

void Trainer::for_each_moe(const std::function<void(nn::MoE&)>& fn) {
  for (const models::MoeLayer& l : model_->moe_layers()) fn(*l.moe);
  for (auto& c : contexts_)
    for (const models::MoeLayer& l : c->moe_layers()) fn(*l.moe);
}

std::vector<optim::ExpertLoad> Trainer::expert_loads(float rate) {
  std::vector<models::MoeLayer> layers = model_->moe_layers();
  // A pipeline stage's activation contexts ran some of the micro-batches: their counts join
  // the stage model's (their bias is the model's own storage).
  for (auto& c : contexts_) {
    std::vector<models::MoeLayer> mine = c->moe_layers();
    for (size_t i = 0; i < mine.size(); ++i) {
      nn::Router &to = layers[i].moe->router(), &from = mine[i].moe->router();
      for (size_t e = 0; e < to.load().size(); ++e)
        to.load()[e] += std::exchange(from.load()[e], 0);
      to.aux_loss() += std::exchange(from.aux_loss(), 0.0);
    }
  }
  std::vector<optim::ExpertLoad> loads = optim::balance_experts(layers, *dp_, rate);
  if (!stage_) return loads;
  // Rank 0 reports every layer: each stage's layers summed over the pipeline group.
  const int64_t L = model_->num_layers();
  std::vector<double> all(static_cast<size_t>(6 * L), 0.0);
  for (const optim::ExpertLoad& l : loads) {
    double* a = all.data() + 6 * l.layer;
    a[0] = 1;
    a[1] = static_cast<double>(l.min);
    a[2] = static_cast<double>(l.max);
    a[3] = l.mean;
    a[4] = l.bias_min;
    a[5] = l.bias_max;
  }
  mesh_->pp().all_reduce_sum(all.data(), 6 * L);
  loads.clear();
  for (int64_t l = 0; l < L; ++l) {
    const double* a = all.data() + 6 * l;
    if (a[0] > 0)
      loads.push_back({l, static_cast<int64_t>(a[1]), static_cast<int64_t>(a[2]), a[3],
                       static_cast<float>(a[4]), static_cast<float>(a[5])});
  }
  return loads;
}

double Trainer::passes(const std::vector<data::MicroBatch>& micro, float grad_scale) {
  double loss_sum = 0.0;
  nn::DropoutContext& drop = model_->dropout();
  for (size_t m = 0; m < micro.size(); ++m) {
    const data::MicroBatch& mb = micro[m];
    const int i = static_cast<int>(m);
    trace::MicroScope ms(i);  // the engine's collectives during the passes carry it
    engine_->begin_micro_batch(m + 1 == micro.size());
    drop = {true, cfg_.seed, step_, mb.batch_row * mb.ids.dim(1)};
    {
      trace::Span span(trace::Kind::Forward, i);
      model_->forward(mb.ids, mb.pos);
    }
    engine_->begin_backward();
    {
      trace::Span span(trace::Kind::Backward, i);
      loss_sum += model_->backward(mb.targets, grad_scale);
    }
    engine_->end_backward();
  }
  drop.training = false;
  return loss_sum;
}

double Trainer::pipeline_passes(const std::vector<data::MicroBatch>& micro, float grad_scale) {
  std::vector<parallel::MicroBatchTensors> mbs;
  for (const data::MicroBatch& mb : micro) mbs.push_back({mb.ids, mb.pos, mb.targets});
  // ZeRO 0/1 reduce after the schedule, not during it; ZeRO 2/3 after every backward.
  engine_->begin_micro_batch(false);
  parallel::PassHooks hooks;
  hooks.before_forward = [&](models::CausalLM& ctx, int i) {
    ctx.dropout() = {true, cfg_.seed, step_, micro[i].batch_row * micro[i].ids.dim(1)};
  };
  hooks.before_backward = [&] { engine_->begin_backward(); };
  hooks.after_backward = [&] { engine_->end_backward(); };
  const double loss_sum = stage_->train(mbs, grad_scale, hooks);
  model_->dropout().training = false;
  for (auto& c : contexts_) c->dropout().training = false;
  engine_->reduce_grads();
  stage_->sum_tied_grads(*engine_);
  return loss_sum;
}

double Trainer::evaluate() {
  if (!valid_) return std::nan("");
  trace::Span span(trace::Kind::Eval);
  model_->dropout().training = false;
  const int64_t T = valid_->seq_len(), B = cfg_.micro_batch;
  // Rank r takes batches r, r + N, ...; every rank runs the same number of forwards (a
  // ZeRO-3 forward is collective), the spare ones on a row whose targets are all ignored.
  // Each sample's sums go to its own slot, summed over ranks (adding only zeros) and then in
  // sample order, so the reduction does not depend on the layout or the batch size.
  const int64_t batches = (valid_->size() + B - 1) / B, N = dp_->size();
  std::vector<double> slots(2 * valid_->size(), 0.0);  // [sample][loss sum, target count]
  Progress progress("evaluating", (batches + N - 1) / N);
  for (int64_t k = dp_->rank(); k < (batches + N - 1) / N * N; k += N) {
    progress.update(k / N);
    const int64_t first = k * B, b = k < batches ? std::min(B, valid_->size() - first) : 1;
    Tensor ids = Tensor::zeros({b, T}, DType::I32), tg = Tensor::zeros({b, T}, DType::I32);
    Tensor pos = valid_->packed() ? Tensor::zeros({b, T}, DType::I32) : Tensor();
    if (k < batches) {
      for (int64_t i = 0; i < b; ++i) {
        valid_->get(first + i, ids.i32() + i * T, tg.i32() + i * T);
        if (valid_->packed()) valid_->get_positions(first + i, pos.i32() + i * T);
      }
    } else {
      std::fill(tg.i32(), tg.i32() + T, kernels::kIgnoreIndex);
    }
    std::vector<double> sums(b, 0.0);
    if (!stage_) {
      model_->forward(ids, pos);
      model_->loss_sums(tg, sums.data());
    } else if (models::CausalLM* last = stage_->forward(ids, pos)) {
      last->loss_sums(tg, sums.data());  // the other stages add zeros below
    }
    for (int64_t i = 0; k < batches && i < b; ++i) {
      slots[2 * (first + i)] = sums[i];
      slots[2 * (first + i) + 1] = static_cast<double>(kernels::count_targets(tg.i32() + i * T, T));
    }
  }
  dp_->all_reduce_sum(slots.data(), static_cast<int64_t>(slots.size()));
  if (stage_) {  // target counts from every stage, losses from the last: keep one of each
    const bool last = model_->last_stage();
    for (size_t s = 0; s < slots.size(); s += 2) {
      if (!last) slots[s] = 0.0;
      if (mesh_->pp_rank() != 0) slots[s + 1] = 0.0;
    }
    mesh_->pp().all_reduce_sum(slots.data(), static_cast<int64_t>(slots.size()));
  }
  double loss = 0.0, count = 0.0;
  for (size_t s = 0; s < slots.size(); s += 2) {
    loss += slots[s];
    count += slots[s + 1];
  }
  return count > 0 ? loss / count : std::nan("");
}

void Trainer::save_checkpoint(const fs::path& dir) {
  TrainerState st;
  st.step = step_;
  st.train_batch = cfg_.train_batch;
  st.world_size = mesh_->world().size();
  st.zero_stage = cfg_.zero.stage;
  st.tensor_parallel = cfg_.tensor_parallel;
  st.pipeline_parallel = cfg_.pipeline.size;
  st.skipped_steps = skipped_steps();
  if (scaler_) st.loss_scaler = scaler_->state();
  const std::string source = model_path(cfg_.model);
  const fs::path tokenizer_from = source.empty() ? fs::path() : expand_user(source);
  // The model: an HF folder or a PEFT adapter folder, each stage writing its tensors (under
  // expert parallelism each of the stage's expert slices too: its part k = stage * ep +
  // ep rank; ep rank 0 also writes the dense tensors).
  const int ep = cfg_.expert_parallel, parts = cfg_.pipeline.size * ep;
  const int part = mesh_->pp_rank() * ep + mesh_->dp_rank() % ep;
  auto adapter_part = [&](const fs::path& d, int k) {
    return parts == 1 ? d / "adapter_model.safetensors"
                      : d / ("adapter_model.part" + std::to_string(k) + ".safetensors");
  };
  auto write_stage = [&](const fs::path& d) {
    const bool experts_only = part % ep != 0;
    if (cfg_.peft.enabled())
      io::write_adapter_weights(*model_, adapter_part(d, part), experts_only);
    else
      io::write_hf_weights(*model_, d / io::hf_weights_file(part, parts), io::StDType::F32,
                           experts_only);
  };
  auto finish_model = [&](const fs::path& d) {
    if (cfg_.peft.enabled()) {
      io::write_adapter_config(*model_, cfg_.peft, d, fs::absolute(tokenizer_from).string(),
                               tokenizer_from);
      std::vector<fs::path> files;
      for (int k = 0; k < parts; ++k) files.push_back(adapter_part(d, k));
      if (parts > 1) io::merge_adapter_weights(d, files);
    } else {
      io::write_hf_config(*model_, d, tokenizer_from);
      if (parts > 1) io::write_hf_index(d, parts);
    }
  };
  save_train_checkpoint(dir, st, *engine_, *mesh_, tp_, write_stage, finish_model);
}

void Trainer::run() {
  // Rank 0 speaks and writes the metrics; every rank trains and takes part in saving.
  const bool lead = mesh_->world().rank() == 0;
  const fs::path out = cfg_.output_dir;
  std::optional<Monitor> monitor;  // metrics.jsonl, TensorBoard, csv_monitor (train/monitor.h)
  if (lead) {
    fs::create_directories(out);
    io::write_json_file(out / "loom_config.json", cfg_.raw);
    monitor.emplace(cfg_, step_);
  }
  auto say = [&](const char* fmt, auto... args) {
    if (lead) std::fprintf(stderr, fmt, args...);
  };
  auto record = [&](const nlohmann::json& row) {
    if (lead) monitor->record(row);
  };
  const bool tty = ::isatty(fileno(stderr));
  // The comm watchdog (dist/watchdog.h) for the run; its reports go to output_dir/.watchdog.
  const fs::path watchdog_dir = out / ".watchdog";
  struct Watchdog {
    bool on = false, lead = false;
    fs::path dir;
    ~Watchdog() {  // (a watchdog that fired ended the process: its reports stay)
      if (!on) return;
      dist::stop_watchdog();
      std::error_code ec;
      if (lead) fs::remove_all(dir, ec);
    }
  } watchdog{false, lead, watchdog_dir};
  if (mesh_->world().size() > 1 && cfg_.comm_timeout_s > 0) {
    if (lead) {
      fs::remove_all(watchdog_dir);
      fs::create_directories(watchdog_dir);
    }
    mesh_->world().barrier();
    dist::start_watchdog(cfg_.comm_timeout_s, watchdog_dir, mesh_->world().rank(),
                         mesh_->world().size());
    watchdog.on = true;
  }
  nn::ParamStore& ps = model_->params();
  // Under pipeline parallelism rank 0 speaks for the first stage.
  const std::string pipe =
      stage_ ? ", pipeline parallel " + std::to_string(cfg_.pipeline.size) + " (" +
                   cfg_.pipeline.schedule + "; the first stage holds layers " +
                   layers_str(stage_range_) + " and up to " + std::to_string(stage_->contexts()) +
                   " micro-batches' activations)"
             : std::string();
  std::string ckpt = checkpointing_str(cfg_.activation_checkpointing);
  if (!ckpt.empty()) ckpt = ", " + ckpt;
  say("loom: %s%s, %.2fM parameters%s, %.3fM trainable (%.2f%%), %lld samples of %lld tokens, "
      "batch %lld = %lld x %lld accumulation x %d data-parallel ranks, tensor parallel %d%s%s, "
      "ZeRO stage %d%s, %lld steps%s\n",
      model_->arch().c_str(), cfg_.peft.enabled() ? (" + " + cfg_.peft.method).c_str() : "",
      ps.numel() / 1e6, stage_ ? " on the first stage" : "", ps.trainable_numel() / 1e6,
      100.0 * ps.trainable_numel() / ps.numel(), static_cast<long long>(data_->size()),
      static_cast<long long>(cfg_.data.seq_len), static_cast<long long>(cfg_.train_batch),
      static_cast<long long>(cfg_.micro_batch), static_cast<long long>(cfg_.grad_accum),
      dp_->size(), cfg_.tensor_parallel, cfg_.sequence_parallel ? " (sequence parallel)" : "",
      pipe.c_str(), cfg_.zero.stage, ckpt.c_str(), static_cast<long long>(cfg_.train_steps),
      step_ > 0 ? (", resuming after step " + std::to_string(step_)).c_str() : "");
  if (!data_summary_.empty()) say("data: %s\n", data_summary_.c_str());
  record({{"run",
           {{"arch", model_->arch()},
            {"peft", cfg_.peft.enabled() ? cfg_.peft.method : ""},
            {"params", ps.numel()},
            {"trainable_params", ps.trainable_numel()},
            {"samples", data_->size()},
            {"seq_len", cfg_.data.seq_len},
            {"data", data_summary_},
            {"train_batch", cfg_.train_batch},
            {"micro_batch", cfg_.micro_batch},
            {"grad_accum", cfg_.grad_accum},
            {"train_steps", cfg_.train_steps},
            {"world_size", mesh_->world().size()},
            {"data_parallel", dp_->size()},
            {"tensor_parallel", cfg_.tensor_parallel},
            {"pipeline_parallel", cfg_.pipeline.size},
            {"expert_parallel", cfg_.expert_parallel},
            {"zero_stage", cfg_.zero.stage},
            {"precision", cfg_.zero.half ? kernels::half_name(*cfg_.zero.half) : "fp32"},
            {"resumed_after_step", step_}}}});
  if (cfg_.zero.half) {
    const bool bf = *cfg_.zero.half == kernels::Half::bf16;
    std::string scale;
    if (scaler_)
      scale = std::string(scaler_->dynamic() ? ", dynamic loss scale from " : ", loss scale ") +
              std::to_string(static_cast<long long>(scaler_->scale()));
    say("precision: %s (matrix products on %s copies of the weights, %s; fp32 master weights, "
        "AdamW and gradient accumulation%s)\n",
        kernels::half_name(*cfg_.zero.half), kernels::half_name(*cfg_.zero.half),
        bf ? kernels::bf16_gemm_description().c_str() : "fp32 sgemm on widened operands",
        scale.c_str());
  }
  MemoryReport mem = memory_report();
  say("memory per rank (planned): weights %s, gradients %s, optimizer state %s, buffers %s\n",
      mib(mem.state.params).c_str(), mib(mem.state.grads).c_str(), mib(mem.state.optimizer).c_str(),
      mib(mem.state.buffers).c_str());
  auto eval_line = [&] {
    const double ev = evaluate();
    if (std::isnan(ev)) return;
    record({{"step", step_}, {"eval_loss", ev}});
    say("%sstep %lld  eval loss %.4f\n", tty ? "\r" : "", static_cast<long long>(step_), ev);
  };
  // Activations: what the first evaluation and step add to the model state already held.
  const int64_t live_before = storage_stats().live_bytes;
  const int64_t first_step = step_;
  reset_storage_peak();
  eval_line();  // before training: the baseline the run should beat
  prof::enable(cfg_.wall_clock_breakdown);
  const bool tracing = !cfg_.trace_path.empty();
  trace::enable(tracing);
  double elapsed = 0.0;
  int64_t comm_bytes = 0;
  auto sent_so_far = [&] {  // over this rank's groups
    return dp_->stats().bytes_sent + mesh_->tp().stats().bytes_sent +
           mesh_->pp().stats().bytes_sent + (ep_ ? ep_->stats().bytes_sent : 0);
  };
  // SIGTERM / SIGINT / SIGUSR1: finish the step on every rank, save, exit (util/stop_signals.h).
  StopSignals stop_signals(lead);
  while (step_ < cfg_.train_steps) {
    const int64_t sent0 = sent_so_far();
    StepStats st = step();
    const int64_t sent = sent_so_far() - sent0;
    comm_bytes += sent;
    if (step_ == first_step + 1) mem.activations = storage_stats().peak_bytes - live_before;
    elapsed += st.seconds;
    const double tok_s = st.tokens / st.seconds;
    // One small all-reduce after each step: any rank's stop request (SIGTERM, SIGINT,
    // SIGUSR1; slot 0) and every rank's resident memory (slot 1 + rank).
    const int world = mesh_->world().size();
    std::vector<double> shared(1 + world, 0.0);
    shared[0] = StopSignals::signal_number();
    shared[1 + mesh_->world().rank()] = static_cast<double>(current_rss_bytes());
    mesh_->world().all_reduce_max(shared.data(), 1 + world);
    nlohmann::json row = {{"step", st.step + 1},
                          {"loss", st.loss},
                          {"lr", st.lr},
                          {"grad_norm", st.grad_norm},
                          {"tokens_per_s", tok_s},
                          {"target_tokens", st.target_tokens},
                          {"step_seconds", st.seconds},
                          {"comm_bytes_sent", sent},  // by this rank (rank 0), algorithmic volume
                          {"epoch", sampler_->epoch_of(st.step)},
                          {"rss_bytes", std::vector<double>(shared.begin() + 1, shared.end())}};
    if (!st.expert_load.empty()) {  // per MoE layer: routed tokens per expert, the bias
      nlohmann::json m;
      for (const optim::ExpertLoad& l : st.expert_load) {
        m["layer"].push_back(l.layer);
        m["tokens_min"].push_back(l.min);
        m["tokens_max"].push_back(l.max);
        m["tokens_mean"].push_back(l.mean);
        m["bias_min"].push_back(l.bias_min);
        m["bias_max"].push_back(l.bias_max);
        if (ep_) m["dispatch_bytes"].push_back(l.dispatch_bytes);
        if (l.aux_loss != 0.0) m["aux_loss"].push_back(l.aux_loss);
      }
      row["moe"] = m;
    }
    if (scaler_) {  // the scale the step ran with; a skipped step's grad_norm is not finite
      row["loss_scale"] = st.loss_scale;
      row["skipped"] = st.skipped;
      row["skipped_steps"] = scaler_->skipped_steps();
      if (!std::isfinite(st.grad_norm)) row["grad_norm"] = nullptr;
    }
    record(row);
    LOOM_CHECK(std::isfinite(st.loss), "loss became " + std::to_string(st.loss) + " at step " +
                                           std::to_string(st.step + 1));
    const double eta = elapsed / (step_ - first_step) * (cfg_.train_steps - step_);
    const bool print_line = (step_ % cfg_.steps_per_print == 0) || step_ == cfg_.train_steps;
    // On a terminal the progress line rewrites itself; in logs it prints every steps_per_print.
    if (tty || print_line)
      say("%sstep %lld/%lld  loss %.4f  lr %.2e  |g| %.3f%s  %.0f tok/s  ETA %.0fs%s",
          tty ? "\r" : "", static_cast<long long>(step_), static_cast<long long>(cfg_.train_steps),
          st.loss, st.lr, st.grad_norm, scale_str(st).c_str(), tok_s, eta,
          print_line ? "\n" : "   ");
    if (cfg_.eval_interval > 0 && step_ % cfg_.eval_interval == 0 && step_ < cfg_.train_steps)
      eval_line();
    const bool saved = cfg_.checkpoint_interval > 0 && step_ % cfg_.checkpoint_interval == 0 &&
                       step_ < cfg_.train_steps;
    if (saved) {
      save_checkpoint(out / ("checkpoint-" + std::to_string(step_)));
      say("loom: saved %s\n", (out / ("checkpoint-" + std::to_string(step_))).string().c_str());
    }
    // A stop request on any rank stops every rank after this step.
    const double stop = shared[0];
    if (stop > 0 && step_ < cfg_.train_steps) {
      const fs::path ck = out / ("checkpoint-" + std::to_string(step_));
      if (!saved) save_checkpoint(ck);
      mesh_->world().barrier();  // every rank's part is written before any rank exits
      record({{"stopped",
               {{"step", step_}, {"signal", StopSignals::signal_name(static_cast<int>(stop))}}}});
      say("%sloom: stopped after step %lld/%lld on %s; saved %s (resume with --set "
          "resume_from=%s); exit status %d\n",
          tty ? "\n" : "", static_cast<long long>(step_), static_cast<long long>(cfg_.train_steps),
          StopSignals::signal_name(static_cast<int>(stop)), ck.string().c_str(),
          ck.string().c_str(), kExitInterrupted);
      interrupted_ = true;
      return;
    }
  }
  eval_line();
  if (tracing) {
    dist::write_job_trace(*mesh_, cfg_.trace_path);
    trace::enable(false);
    say("loom: wrote the schedule trace %s (open it in ui.perfetto.dev)\n",
        cfg_.trace_path.c_str());
  }
  if (cfg_.wall_clock_breakdown && lead) {
    prof::Totals t = prof::totals();
    std::fprintf(stderr,
                 "time by phase over %lld steps:", static_cast<long long>(step_ - first_step));
    for (int i = 0; i < static_cast<int>(prof::Phase::kCount); ++i)
      std::fprintf(stderr, " %s %.2fs", prof::phase_name(static_cast<prof::Phase>(i)),
                   t.ns[i] / 1e9);
    std::fprintf(stderr, "\n");
  }
  // Pipeline stages hold different numbers of micro-batches: each stage's measured
  // activations (its largest rank), beside the number its schedule keeps in flight.
  std::vector<double> stage_acts(cfg_.pipeline.size, 0.0);
  if (stage_) {
    stage_acts[mesh_->pp_rank()] = static_cast<double>(mem.activations);
    mesh_->world().all_reduce_max(stage_acts.data(), cfg_.pipeline.size);
    for (int s = 0; s < cfg_.pipeline.size; ++s) {
      const int held = parallel::max_in_flight(parallel::stage_schedule(
          cfg_.pipeline.schedule, cfg_.pipeline.size, s, static_cast<int>(cfg_.grad_accum),
          cfg_.pipeline.virtual_stages));
      say("pipeline stage %d: up to %d micro-batches in flight, activations and scratch %s "
          "(measured)\n",
          s, held, mib(static_cast<int64_t>(stage_acts[s])).c_str());
    }
  }
  // Measured peaks: the largest over the ranks.
  double peaks[2] = {static_cast<double>(peak_rss_bytes()), static_cast<double>(mem.activations)};
  mesh_->world().all_reduce_max(&peaks[0]);
  mesh_->world().all_reduce_max(&peaks[1]);
  mem.peak_rss = static_cast<int64_t>(peaks[0]);
  mem.activations = static_cast<int64_t>(peaks[1]);
  const int64_t steps_run = std::max<int64_t>(step_ - first_step, 1);
  say("memory per rank: weights %s, gradients %s, optimizer state %s, buffers %s (planned); "
      "activations and scratch %s, peak RSS %s (measured, the largest rank)\n",
      mib(mem.state.params).c_str(), mib(mem.state.grads).c_str(), mib(mem.state.optimizer).c_str(),
      mib(mem.state.buffers).c_str(), mib(mem.activations).c_str(), mib(mem.peak_rss).c_str());
  if (mesh_->world().size() > 1)
    say("communication: %.1f MiB sent per step by rank 0 (algorithmic volume)\n",
        comm_bytes / 1048576.0 / steps_run);
  record({{"memory",
           {{"weights_bytes", mem.state.params},
            {"grads_bytes", mem.state.grads},
            {"optimizer_bytes", mem.state.optimizer},
            {"buffer_bytes", mem.state.buffers},
            {"activations_bytes", mem.activations},
            {"peak_rss_bytes", mem.peak_rss},
            {"trainable_params", ps.trainable_numel()},
            {"params", ps.numel()},
            {"world_size", mesh_->world().size()},
            {"tensor_parallel_size", cfg_.tensor_parallel},
            {"pipeline_parallel_size", cfg_.pipeline.size},
            {"pipeline_stage_activations_bytes", stage_acts},
            {"zero_stage", cfg_.zero.stage}}},
          {"comm_bytes_sent_per_step", comm_bytes / steps_run}});
  const fs::path ck = out / "checkpoint-final";
  save_checkpoint(ck);
  say("loom: saved %s%s\n", ck.string().c_str(),
      cfg_.peft.enabled() ? " (PEFT adapter folder)" : "");
}

}  // namespace loom::train
