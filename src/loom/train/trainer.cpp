#include "loom/train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "loom/io/hf_checkpoint.h"
#include "loom/io/model_loader.h"
#include "loom/io/peft_adapter.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/models/gpt2.h"
#include "loom/optim/clip.h"
#include "loom/util/error.h"
#include "loom/util/path.h"
#include "loom/util/profile.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {
std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
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
  LOOM_CHECK(m.value("arch", std::string()) == "gpt2",
             where + ": config key 'model.arch' must be \"gpt2\" (or give 'model.path')");
  nlohmann::json hf = nlohmann::json::object();
  for (auto& [k, v] : m.items()) {
    static const char* kKeys[] = {
        "arch",   "vocab_size", "n_positions",        "n_embd",           "n_layer",
        "n_head", "n_inner",    "layer_norm_epsilon", "initializer_range"};
    bool known = false;
    for (const char* kk : kKeys) known |= k == kk;
    LOOM_CHECK(known, where + ": unknown config key 'model." + k + "'");
    if (k != "arch") hf[k] = v;
  }
  auto model = std::make_unique<models::GPT2>(models::GPT2Config::from_hf(hf, where + " (model)"));
  model->params().init(seed);
  return model;
}

Trainer::Trainer(const TrainConfig& cfg, std::unique_ptr<data::Dataset> dataset)
    : cfg_(cfg), data_(std::move(dataset)) {
  // PEFT: the base stays frozen, so a GGUF base stays quantized unless the config says no.
  io::LoadOptions load;
  if (!cfg.peft_from.empty()) {
    io::AdapterFolder a = io::read_adapter_config(expand_user(cfg.peft_from));
    cfg_.peft = a.config;
  }
  load.keep_quantized = cfg_.peft.enabled();
  load.keep_f32_modules = cfg_.peft.modules_to_save;
  model_ = build_model(cfg.model, cfg.seed, "config", load);
  LOOM_CHECK(!cfg_.peft.enabled() || model_path(cfg.model) != "",
             "config: PEFT needs a pretrained base model (config key 'model' as a path)");
  LOOM_CHECK(!io::is_adapter_folder(expand_user(model_path(cfg.model))) || !cfg_.peft.enabled(),
             "config: 'model' is an adapter folder; to train it further give its base as "
             "'model' and the folder as peft.from_pretrained");
  models::apply_peft(*model_, cfg_.peft, cfg.seed);
  if (!cfg.peft_from.empty()) io::load_adapter_weights(*model_, expand_user(cfg.peft_from));
  for (auto& p : model_->params().all())
    LOOM_CHECK(!p->quantized() || !p->trainable, "internal: quantized " + p->name + " trains");
  LOOM_CHECK(model_->params().trainable_numel() > 0,
             "config: nothing to train (every parameter is frozen)");
  if (!data_) {
    TextCodec codec;
    if (cfg.data.tokenizer == "bytes") {
      LOOM_CHECK(model_->vocab_size() >= 256,
                 "data.tokenizer 'bytes' needs a vocabulary of at least 256, the model has " +
                     std::to_string(model_->vocab_size()));
      codec = bytes_codec();
    } else {
      codec = model_codec(cfg.model);
    }
    TrainData td = build_train_data(cfg.data, codec, cfg.seed);
    data_ = std::move(td.train);
    valid_ = std::move(td.valid);
    data_summary_ = td.summary;
  }
  LOOM_CHECK(data_->seq_len() <= model_->max_positions(),
             "data.seq_len " + std::to_string(data_->seq_len()) + " exceeds the model's " +
                 std::to_string(model_->max_positions()) + " positions");
  sampler_ = std::make_unique<data::Sampler>(*data_, cfg.seed, cfg.data.shuffle, cfg.micro_batch,
                                             cfg.grad_accum, /*dp_size=*/1, /*dp_rank=*/0);
  opt_ = std::make_unique<optim::AdamW>(model_->params(), cfg.adamw);
  sched_ = optim::Schedule::from_json(cfg.scheduler, cfg.adamw.lr, cfg.train_steps);
}

Trainer::MemoryReport Trainer::memory_report() const {
  MemoryReport m;
  m.weights = model_->params().value_bytes();
  m.grads = static_cast<int64_t>(model_->params().flat_grads().nbytes());
  m.optimizer = opt_->state_bytes();
  return m;
}

StepStats Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  StepStats st;
  st.step = step_;

  // 1. Data: every micro-batch of this step, and the step's target-token count.
  std::vector<data::MicroBatch> micro;
  for (int64_t m = 0; m < cfg_.grad_accum; ++m) micro.push_back(sampler_->micro_batch(step_, m));
  for (auto& mb : micro) {
    st.target_tokens += kernels::count_targets(mb.targets.i32(), mb.targets.numel());
    st.tokens += mb.ids.numel();
  }
  const float grad_scale = 1.0f / static_cast<float>(std::max<int64_t>(st.target_tokens, 1));

  // 2. Forward and backward; gradients accumulate across micro-batches.
  nn::ParamStore& ps = model_->params();
  ps.zero_grads();
  double loss_sum = 0.0;
  nn::DropoutContext& drop = model_->dropout();
  for (auto& mb : micro) {
    drop = {true, cfg_.seed, step_, mb.batch_row * mb.ids.dim(1)};
    model_->forward(mb.ids, mb.pos);
    loss_sum += model_->backward(mb.targets, grad_scale);
  }
  drop.training = false;
  st.loss = loss_sum / std::max<int64_t>(st.target_tokens, 1);

  // 3. Gradient sync: nothing to do at world size 1.
  // 4. Clip by the global norm (the optimizer applies the coefficient as it reads grads).
  st.grad_norm = std::sqrt(optim::sum_of_squares(ps.flat_grads()));
  const float clip = optim::clip_coefficient(st.grad_norm, cfg_.gradient_clipping);
  // 5. Optimizer on the local parameters, at this step's learning rate.
  st.lr = sched_.lr_at(step_);
  opt_->step(static_cast<float>(st.lr), clip);
  // 6. Parameter sync: nothing to do at world size 1.

  ++step_;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

double Trainer::evaluate() {
  if (!valid_) return std::nan("");
  model_->dropout().training = false;
  const int64_t T = valid_->seq_len(), B = cfg_.micro_batch, V = model_->vocab_size();
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t first = 0; first < valid_->size(); first += B) {
    const int64_t b = std::min(B, valid_->size() - first);
    Tensor ids = Tensor::zeros({b, T}, DType::I32), tg = Tensor::zeros({b, T}, DType::I32);
    Tensor pos = valid_->packed() ? Tensor::zeros({b, T}, DType::I32) : Tensor();
    for (int64_t i = 0; i < b; ++i) {
      valid_->get(first + i, ids.i32() + i * T, tg.i32() + i * T);
      if (valid_->packed()) valid_->get_positions(first + i, pos.i32() + i * T);
    }
    const Tensor& logits = model_->forward(ids, pos);
    sum += kernels::cross_entropy_loss(logits.f32(), tg.i32(), b * T, V);
    count += kernels::count_targets(tg.i32(), b * T);
  }
  return count ? sum / count : std::nan("");
}

void Trainer::run() {
  const fs::path out = cfg_.output_dir;
  fs::create_directories(out);
  {
    std::ofstream f(out / "loom_config.json");
    f << cfg_.raw.dump(2) << "\n";
  }
  std::ofstream metrics(out / "metrics.jsonl", std::ios::trunc);
  LOOM_CHECK(metrics.good(), (out / "metrics.jsonl").string() + ": cannot write");
  const bool tty = ::isatty(fileno(stderr));
  nn::ParamStore& ps = model_->params();
  std::fprintf(stderr,
               "loom: %s%s, %.2fM parameters, %.3fM trainable (%.2f%%), %lld samples of %lld "
               "tokens, batch %lld = %lld x %lld accumulation, %lld steps\n",
               model_->arch().c_str(),
               cfg_.peft.enabled() ? (" + " + cfg_.peft.method).c_str() : "", ps.numel() / 1e6,
               ps.trainable_numel() / 1e6, 100.0 * ps.trainable_numel() / ps.numel(),
               static_cast<long long>(data_->size()), static_cast<long long>(cfg_.data.seq_len),
               static_cast<long long>(cfg_.train_batch), static_cast<long long>(cfg_.micro_batch),
               static_cast<long long>(cfg_.grad_accum), static_cast<long long>(cfg_.train_steps));
  if (!data_summary_.empty()) std::fprintf(stderr, "data: %s\n", data_summary_.c_str());
  MemoryReport mem = memory_report();
  std::fprintf(stderr, "memory: weights %s, gradients %s, optimizer state %s\n",
               mib(mem.weights).c_str(), mib(mem.grads).c_str(), mib(mem.optimizer).c_str());
  auto eval_line = [&] {
    const double ev = evaluate();
    if (std::isnan(ev)) return;
    metrics << nlohmann::json{{"step", step_}, {"eval_loss", ev}}.dump() << "\n";
    metrics.flush();
    std::fprintf(stderr, "%sstep %lld  eval loss %.4f\n", tty ? "\r" : "",
                 static_cast<long long>(step_), ev);
  };
  // Activations: what the first evaluation and step add to the model state already held.
  const int64_t live_before = storage_stats().live_bytes;
  reset_storage_peak();
  eval_line();  // before training: the baseline the run should beat
  prof::enable(cfg_.wall_clock_breakdown);
  double elapsed = 0.0;
  while (step_ < cfg_.train_steps) {
    StepStats st = step();
    if (step_ == 1) mem.activations = storage_stats().peak_bytes - live_before;
    elapsed += st.seconds;
    const double tok_s = st.tokens / st.seconds;
    nlohmann::json row = {{"step", st.step + 1},
                          {"loss", st.loss},
                          {"lr", st.lr},
                          {"grad_norm", st.grad_norm},
                          {"tokens_per_s", tok_s},
                          {"target_tokens", st.target_tokens},
                          {"step_seconds", st.seconds},
                          {"epoch", sampler_->epoch_of(st.step)}};
    metrics << row.dump() << "\n";
    metrics.flush();
    LOOM_CHECK(std::isfinite(st.loss), "loss became " + std::to_string(st.loss) + " at step " +
                                           std::to_string(st.step + 1));
    const double eta = elapsed / step_ * (cfg_.train_steps - step_);
    const bool print_line = (step_ % cfg_.steps_per_print == 0) || step_ == cfg_.train_steps;
    // On a terminal the progress line rewrites itself; in logs it prints every steps_per_print.
    if (tty || print_line)
      std::fprintf(
          stderr, "%sstep %lld/%lld  loss %.4f  lr %.2e  |g| %.3f  %.0f tok/s  ETA %.0fs%s",
          tty ? "\r" : "", static_cast<long long>(step_), static_cast<long long>(cfg_.train_steps),
          st.loss, st.lr, st.grad_norm, tok_s, eta, print_line ? "\n" : "   ");
    if (cfg_.eval_interval > 0 && step_ % cfg_.eval_interval == 0 && step_ < cfg_.train_steps)
      eval_line();
  }
  eval_line();
  if (cfg_.wall_clock_breakdown) {
    prof::Totals t = prof::totals();
    std::fprintf(stderr, "time by phase over %lld steps:", static_cast<long long>(step_));
    for (int i = 0; i < static_cast<int>(prof::Phase::kCount); ++i)
      std::fprintf(stderr, " %s %.2fs", prof::phase_name(static_cast<prof::Phase>(i)),
                   t.ns[i] / 1e9);
    std::fprintf(stderr, "\n");
  }
  mem.peak_rss = peak_rss_bytes();
  std::fprintf(stderr,
               "memory: weights %s, gradients %s, optimizer state %s, activations and scratch "
               "%s (measured over the first step); peak RSS %s\n",
               mib(mem.weights).c_str(), mib(mem.grads).c_str(), mib(mem.optimizer).c_str(),
               mib(mem.activations).c_str(), mib(mem.peak_rss).c_str());
  metrics << nlohmann::json{{"memory",
                             {{"weights_bytes", mem.weights},
                              {"grads_bytes", mem.grads},
                              {"optimizer_bytes", mem.optimizer},
                              {"activations_bytes", mem.activations},
                              {"peak_rss_bytes", mem.peak_rss},
                              {"trainable_params", ps.trainable_numel()},
                              {"params", ps.numel()}}}}
                 .dump()
          << "\n";
  const fs::path ck = out / "checkpoint-final";
  const std::string source = model_path(cfg_.model);
  const fs::path tokenizer_from = source.empty() ? fs::path() : expand_user(source);
  if (cfg_.peft.enabled()) {
    io::save_adapter(*model_, cfg_.peft, ck, fs::absolute(tokenizer_from).string(), tokenizer_from);
  } else {
    io::save_hf_checkpoint(*model_, ck, tokenizer_from);
  }
  std::fprintf(stderr, "loom: saved %s%s\n", ck.string().c_str(),
               cfg_.peft.enabled() ? " (PEFT adapter folder)" : "");
}

}  // namespace loom::train
