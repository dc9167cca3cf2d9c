#include "loom/train/config.h"

#include <set>

#include "loom/io/hf_checkpoint.h"
#include "loom/util/error.h"

namespace loom::train {

using nlohmann::json;

namespace {

struct Reader {
  const std::string& where;
  std::string prefix;  // "data." for nested keys

  std::string key(const std::string& k) const {
    return where + ": config key '" + prefix + k + "'";
  }

  void only(const json& obj, const std::set<std::string>& allowed) const {
    LOOM_CHECK(obj.is_object(),
               where + ": config " +
                   (prefix.empty() ? "" : "key '" + prefix.substr(0, prefix.size() - 1) + "' ") +
                   "must be a JSON object");
    for (auto& [k, v] : obj.items()) {
      if (!allowed.count(k)) {
        std::string known;
        for (auto& a : allowed) known += (known.empty() ? "" : ", ") + a;
        throw Error(where + ": unknown config key '" + prefix + k + "' (known here: " + known +
                    ")");
      }
    }
  }
  int64_t integer(const json& o, const std::string& k, int64_t dflt, int64_t min = 0) const {
    if (!o.contains(k)) return dflt;
    LOOM_CHECK(o[k].is_number_integer(), key(k) + " must be an integer");
    int64_t v = o[k].get<int64_t>();
    LOOM_CHECK(v >= min, key(k) + " must be >= " + std::to_string(min));
    return v;
  }
  double number(const json& o, const std::string& k, double dflt) const {
    if (!o.contains(k)) return dflt;
    LOOM_CHECK(o[k].is_number(), key(k) + " must be a number");
    return o[k].get<double>();
  }
  std::string string(const json& o, const std::string& k, const std::string& dflt) const {
    if (!o.contains(k)) return dflt;
    LOOM_CHECK(o[k].is_string(), key(k) + " must be a string");
    return o[k].get<std::string>();
  }
  bool boolean(const json& o, const std::string& k, bool dflt) const {
    if (!o.contains(k)) return dflt;
    LOOM_CHECK(o[k].is_boolean(), key(k) + " must be true or false");
    return o[k].get<bool>();
  }
};

// The `peft` section: {"method": lora|adapter|prefix, the method's keys} or
// {"from_pretrained": adapter folder}. Keys of another method are errors.
void parse_peft(const json& p, const std::string& where, TrainConfig& c) {
  Reader r{where, "peft."};
  const std::set<std::string> lora_keys = {
      "r", "lora_alpha", "lora_dropout", "use_rslora", "target_modules", "modules_to_save", "bias"};
  const std::set<std::string> adapter_keys = {"bottleneck_size", "non_linearity"};
  const std::set<std::string> prefix_keys = {"num_virtual_tokens", "prefix_projection",
                                             "encoder_hidden_size"};
  std::set<std::string> all = {"method", "from_pretrained"};
  for (const auto* ks : {&lora_keys, &adapter_keys, &prefix_keys})
    all.insert(ks->begin(), ks->end());
  r.only(p, all);
  if (p.contains("from_pretrained")) {
    LOOM_CHECK(p.size() == 1, r.key("from_pretrained") +
                                  ": the adapter folder's adapter_config.json sets the method; "
                                  "give no other peft keys");
    c.peft_from = r.string(p, "from_pretrained", "");
    return;
  }
  models::PeftConfig& pc = c.peft;
  pc.method = r.string(p, "method", "");
  const std::set<std::string>* mine = pc.method == "lora"      ? &lora_keys
                                      : pc.method == "adapter" ? &adapter_keys
                                      : pc.method == "prefix"  ? &prefix_keys
                                                               : nullptr;
  LOOM_CHECK(mine, r.key("method") + ": '" + pc.method + "' is not one of lora, adapter, prefix");
  for (auto& [k, v] : p.items())
    LOOM_CHECK(k == "method" || mine->count(k),
               r.key(k) + " does not apply to method '" + pc.method + "'");
  auto names = [&](const char* k) {
    std::vector<std::string> out;
    LOOM_CHECK(p[k].is_array(), r.key(k) + " must be a list of module names");
    for (const auto& e : p[k]) {
      LOOM_CHECK(e.is_string(), r.key(k) + " must be a list of module names");
      out.push_back(e.get<std::string>());
    }
    return out;
  };
  if (pc.method == "lora") {
    pc.lora.r = r.integer(p, "r", 8, 1);
    pc.lora.alpha = static_cast<float>(r.number(p, "lora_alpha", 8.0));
    pc.lora.dropout = static_cast<float>(r.number(p, "lora_dropout", 0.0));
    LOOM_CHECK(pc.lora.dropout >= 0.0f && pc.lora.dropout < 1.0f,
               r.key("lora_dropout") + " must be in [0, 1)");
    pc.lora.rslora = r.boolean(p, "use_rslora", false);
    LOOM_CHECK(p.contains("target_modules"), r.key("target_modules") +
                                                 " is required (e.g. [\"q_proj\", \"v_proj\"] "
                                                 "or \"all-linear\")");
    if (p["target_modules"].is_string())
      pc.target_regex = p["target_modules"].get<std::string>();
    else
      pc.target_modules = names("target_modules");
    if (p.contains("modules_to_save")) pc.modules_to_save = names("modules_to_save");
    pc.bias = r.string(p, "bias", "none");
    LOOM_CHECK(pc.bias == "none" || pc.bias == "all" || pc.bias == "lora_only",
               r.key("bias") + ": '" + pc.bias + "' is not one of none, all, lora_only");
  } else if (pc.method == "adapter") {
    pc.adapter.bottleneck = r.integer(p, "bottleneck_size", 64, 1);
    pc.adapter.activation = r.string(p, "non_linearity", "gelu");
    LOOM_CHECK(
        pc.adapter.activation == "gelu" || pc.adapter.activation == "relu",
        r.key("non_linearity") + ": '" + pc.adapter.activation + "' is not one of gelu, relu");
  } else {
    LOOM_CHECK(p.contains("num_virtual_tokens"), r.key("num_virtual_tokens") + " is required");
    pc.num_virtual_tokens = r.integer(p, "num_virtual_tokens", 0, 1);
    pc.prefix_projection = r.boolean(p, "prefix_projection", false);
    pc.encoder_hidden_size = r.integer(p, "encoder_hidden_size", 0, 1);
    LOOM_CHECK(pc.prefix_projection || !p.contains("encoder_hidden_size"),
               r.key("encoder_hidden_size") + " needs prefix_projection: true");
  }
}

}  // namespace

void apply_override(json& j, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  LOOM_CHECK(eq != std::string::npos && eq > 0,
             "--set '" + assignment + "': expected key.path=value");
  const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  json value;
  try {
    value = json::parse(text);
  } catch (const json::exception&) {  // not JSON (or a number out of range): a string
    value = text;
  }
  json* node = &j;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    LOOM_CHECK(!part.empty(), "--set '" + assignment + "': empty key in path");
    if (!node->is_object()) *node = json::object();
    node = &(*node)[part];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  *node = value;
}

std::string checkpointing_str(const models::ActivationCheckpointing& ac) {
  using G = models::ActivationCheckpointing::Granularity;
  if (ac.granularity == G::selective) return "selective activation checkpointing";
  if (ac.granularity != G::full) return "";
  return std::string("full activation checkpointing (") +
         (ac.block_method ? "block, " : "uniform, ") + std::to_string(ac.num_layers) + " layer" +
         (ac.num_layers > 1 ? "s)" : ")");
}

TrainConfig parse_config(const json& j, const std::string& where, int64_t world) {
  Reader r{where, ""};
  r.only(j, {"model",
             "data",
             "train_micro_batch_size_per_gpu",
             "gradient_accumulation_steps",
             "train_batch_size",
             "train_steps",
             "seed",
             "output_dir",
             "optimizer",
             "scheduler",
             "gradient_clipping",
             "steps_per_print",
             "wall_clock_breakdown",
             "tensorboard",
             "csv_monitor",
             "no_decay",
             "eval_interval",
             "zero_optimization",
             "fp16",
             "bf16",
             "data_types",
             "communication_data_type",
             "peft",
             "checkpoint_interval",
             "comm_timeout_s",
             "resume_from",
             "tensor_parallel",
             "pipeline_parallel",
             "activation_checkpointing",
             "moe",
             "expert_parallel",
             "trace"});
  TrainConfig c;
  c.raw = j;
  LOOM_CHECK(j.contains("model"), where + ": config key 'model' is required");
  c.model = j["model"];
  LOOM_CHECK(c.model.is_string() || c.model.is_object(),
             where + ": config key 'model' must be a path or an object");

  LOOM_CHECK(j.contains("data"), where + ": config key 'data' is required");
  Reader rd{where, "data."};
  const json& d = j["data"];
  rd.only(d, {"path", "format", "seq_len", "tokenizer", "shuffle", "template", "pack",
              "train_on_prompt", "valid_fraction", "valid_path", "on_error", "cache_dir"});
  auto one_of = [&](const Reader& r, const std::string& key, const std::string& v,
                    std::initializer_list<const char*> ok) {
    std::string list;
    for (const char* o : ok) {
      if (v == o) return;
      list += (list.empty() ? "" : ", ") + std::string(o);
    }
    throw Error(r.key(key) + ": '" + v + "' is not one of " + list);
  };
  const std::initializer_list<const char*> formats = {"auto",   "text",     "prompt_response",
                                                      "alpaca", "sharegpt", "messages"};
  c.data.format = rd.string(d, "format", "auto");
  one_of(rd, "format", c.data.format, formats);
  // data.path: one file, or a list of {"path", "format", "weight"} mixed by weight.
  LOOM_CHECK(d.contains("path"), where + ": config key 'data.path' is required");
  if (d["path"].is_array()) {
    LOOM_CHECK(!d["path"].empty(), rd.key("path") + ": an empty list of datasets");
    for (size_t i = 0; i < d["path"].size(); ++i) {
      const json& e = d["path"][i];
      const Reader re{where, "data.path[" + std::to_string(i) + "]."};
      re.only(e, {"path", "format", "weight"});
      DataSource src;
      src.path = re.string(e, "path", "");
      LOOM_CHECK(!src.path.empty(), re.key("path") + " is required");
      src.format = re.string(e, "format", c.data.format);
      one_of(re, "format", src.format, formats);
      src.weight = re.number(e, "weight", 1.0);
      LOOM_CHECK(src.weight > 0.0 && std::isfinite(src.weight),
                 re.key("weight") + " must be a number > 0 (got " +
                     e.value("weight", json()).dump() + ")");
      c.data.sources.push_back(src);
    }
  } else {
    const std::string path = rd.string(d, "path", "");
    LOOM_CHECK(!path.empty(), where + ": config key 'data.path' is required");
    c.data.sources.push_back({path, c.data.format, 1.0});
  }
  c.data.tokenizer = rd.string(d, "tokenizer", "model");
  one_of(rd, "tokenizer", c.data.tokenizer, {"model", "bytes"});
  c.data.chat_template = rd.string(d, "template", "auto");
  one_of(rd, "template", c.data.chat_template,
         {"auto", "chatml", "qwen2.5", "llama3", "llama3.1", "plain"});
  c.data.seq_len = rd.integer(d, "seq_len", 128, 1);
  c.data.shuffle = rd.boolean(d, "shuffle", true);
  c.data.pack = rd.boolean(d, "pack", false);
  c.data.train_on_prompt = rd.boolean(d, "train_on_prompt", false);
  c.data.valid_fraction = rd.number(d, "valid_fraction", 0.0);
  LOOM_CHECK(c.data.valid_fraction >= 0.0 && c.data.valid_fraction < 1.0,
             rd.key("valid_fraction") + " must be in [0, 1)");
  c.data.valid_path = rd.string(d, "valid_path", "");
  c.data.on_error = rd.string(d, "on_error", "stop");
  one_of(rd, "on_error", c.data.on_error, {"stop", "skip"});
  c.data.cache_dir = rd.string(d, "cache_dir", "");

  // Tensor parallelism (Megatron's split of each layer's matrices): tp ranks hold one
  // model replica between them, so the data-parallel size is world / tp.
  if (j.contains("tensor_parallel")) {
    Reader rt{where, "tensor_parallel."};
    const json& t = j["tensor_parallel"];
    rt.only(t, {"size", "sequence_parallel"});
    c.tensor_parallel = static_cast<int>(rt.integer(t, "size", 1, 1));
    c.sequence_parallel = rt.boolean(t, "sequence_parallel", false);
  }
  // Pipeline parallelism: stages of consecutive layers (parallel/pipeline.h).
  if (j.contains("pipeline_parallel")) {
    Reader rp{where, "pipeline_parallel."};
    const json& pp = j["pipeline_parallel"];
    rp.only(pp, {"size", "schedule", "partition", "virtual_stages"});
    parallel::PipelineConfig& pc = c.pipeline;
    pc.size = static_cast<int>(rp.integer(pp, "size", 1, 1));
    pc.schedule = rp.string(pp, "schedule", "1f1b");
    LOOM_CHECK(
        pc.schedule == "gpipe" || pc.schedule == "1f1b" || pc.schedule == "interleaved",
        rp.key("schedule") + ": '" + pc.schedule + "' is not one of gpipe, 1f1b, interleaved");
    pc.virtual_stages = static_cast<int>(rp.integer(pp, "virtual_stages", 1, 1));
    LOOM_CHECK((pc.virtual_stages > 1) == (pc.schedule == "interleaved"),
               rp.key("virtual_stages") + " " + std::to_string(pc.virtual_stages) +
                   ": more than 1 goes with schedule \"interleaved\", and only with it");
    if (pp.contains("partition") && pp["partition"].is_array()) {
      for (const json& n : pp["partition"]) {
        LOOM_CHECK(n.is_number_integer(), rp.key("partition") + " must list integers");
        pc.layers.push_back(n.get<int64_t>());
      }
    } else {
      pc.partition = rp.string(pp, "partition", "uniform");
      LOOM_CHECK(pc.partition == "uniform" || pc.partition == "parameters",
                 rp.key("partition") +
                     " must be \"uniform\", \"parameters\" or a list of layer "
                     "counts, got \"" +
                     pc.partition + "\"");
    }
  }
  // Activation checkpointing, Megatron's recompute_granularity / recompute_method /
  // recompute_num_layers (models/causal_lm.h).
  if (j.contains("activation_checkpointing")) {
    Reader ra{where, "activation_checkpointing."};
    const json& a = j["activation_checkpointing"];
    ra.only(a, {"granularity", "method", "num_layers"});
    using G = models::ActivationCheckpointing::Granularity;
    models::ActivationCheckpointing& ac = c.activation_checkpointing;
    LOOM_CHECK(a.contains("granularity"),
               ra.key("granularity") + " is required (full or selective)");
    const std::string g = ra.string(a, "granularity", "");
    LOOM_CHECK(g == "full" || g == "selective",
               ra.key("granularity") + ": '" + g + "' is not one of full, selective");
    ac.granularity = g == "full" ? G::full : G::selective;
    if (ac.granularity == G::selective) {
      // Selective recomputes every layer's attention scores; there are no groups to choose.
      for (const char* k : {"method", "num_layers"})
        LOOM_CHECK(!a.contains(k), ra.key(k) +
                                       " does not apply to granularity \"selective\" "
                                       "(it recomputes every layer's attention scores)");
    } else {
      const std::string m = ra.string(a, "method", "uniform");
      LOOM_CHECK(m == "uniform" || m == "block",
                 ra.key("method") + ": '" + m + "' is not one of uniform, block");
      ac.block_method = m == "block";
      ac.num_layers = ra.integer(a, "num_layers", 1, 1);
    }
  }
  const int64_t model_ranks = int64_t{c.tensor_parallel} * c.pipeline.size;
  LOOM_CHECK(
      world % model_ranks == 0,
      where + ": config key '" +
          (c.pipeline.size > 1 ? "pipeline_parallel.size' " + std::to_string(c.pipeline.size) +
                                     " x 'tensor_parallel.size' "
                               : "tensor_parallel.size' ") +
          std::to_string(c.tensor_parallel) +
          (model_ranks > world ? " exceeds" : " does not divide") + " the world size " +
          std::to_string(world));
  const int64_t dp = world / model_ranks;
  c.data_parallel = static_cast<int>(dp);
  const std::string dp_size = c.tensor_parallel == 1
                                  ? "world size " + std::to_string(world)
                                  : "data-parallel size " + std::to_string(dp) + " (world " +
                                        std::to_string(world) + " / tensor_parallel.size " +
                                        std::to_string(c.tensor_parallel) + ")";

  // DeepSpeed's batch rule: train_batch_size = micro * accum * dp; any two determine the
  // third; all three must agree.
  const bool has_m = j.contains("train_micro_batch_size_per_gpu"),
             has_a = j.contains("gradient_accumulation_steps"),
             has_t = j.contains("train_batch_size");
  int64_t m = r.integer(j, "train_micro_batch_size_per_gpu", 1, 1);
  int64_t a = r.integer(j, "gradient_accumulation_steps", 1, 1);
  int64_t t = r.integer(j, "train_batch_size", 0, 1);
  if (has_t && has_m && !has_a) {
    LOOM_CHECK(t % (m * dp) == 0, where + ": train_batch_size " + std::to_string(t) +
                                      " is not divisible by train_micro_batch_size_per_gpu " +
                                      std::to_string(m) + " x " + dp_size);
    a = t / (m * dp);
  } else if (has_t && has_a && !has_m) {
    LOOM_CHECK(t % (a * dp) == 0, where + ": train_batch_size " + std::to_string(t) +
                                      " is not divisible by gradient_accumulation_steps " +
                                      std::to_string(a) + " x " + dp_size);
    m = t / (a * dp);
  } else if (has_t && !has_m && !has_a) {
    LOOM_CHECK(t % dp == 0, where + ": train_batch_size " + std::to_string(t) +
                                " is not divisible by the " + dp_size);
    m = t / dp;
  }
  if (has_t) {
    LOOM_CHECK(t == m * a * dp, where + ": inconsistent batch sizes: train_batch_size " +
                                    std::to_string(t) + " != train_micro_batch_size_per_gpu " +
                                    std::to_string(m) + " x gradient_accumulation_steps " +
                                    std::to_string(a) + " x " + dp_size);
  }
  c.micro_batch = m;
  c.grad_accum = a;
  c.train_batch = m * a * dp;

  c.train_steps = r.integer(j, "train_steps", 100, 1);
  c.seed = static_cast<uint64_t>(r.integer(j, "seed", 42, 0));
  c.output_dir = r.string(j, "output_dir", "out");
  LOOM_CHECK(!c.output_dir.empty(), r.key("output_dir") + " must not be empty");
  c.gradient_clipping = r.number(j, "gradient_clipping", 0.0);
  LOOM_CHECK(c.gradient_clipping >= 0.0, r.key("gradient_clipping") + " must be >= 0");
  c.steps_per_print = r.integer(j, "steps_per_print", 10, 1);
  c.eval_interval = r.integer(j, "eval_interval", 0, 0);
  c.wall_clock_breakdown = r.boolean(j, "wall_clock_breakdown", false);
  for (auto [name, m] :
       {std::pair{"tensorboard", &c.tensorboard}, std::pair{"csv_monitor", &c.csv_monitor}}) {
    if (!j.contains(name)) continue;
    const Reader rm{where, std::string(name) + "."};
    rm.only(j[name], {"enabled", "output_path", "job_name"});
    m->enabled = rm.boolean(j[name], "enabled", false);
    m->output_path = rm.string(j[name], "output_path", "");
    m->job_name = rm.string(j[name], "job_name", m->job_name);
    LOOM_CHECK(!m->job_name.empty() && m->job_name.find('/') == std::string::npos &&
                   m->job_name != "." && m->job_name != "..",
               rm.key("job_name") + " must be a folder name ('" + m->job_name + "' is not)");
  }
  if (r.boolean(j, "trace", false))
    c.trace_path = (std::filesystem::path(c.output_dir) / "trace.json").string();

  if (j.contains("optimizer")) {
    Reader ro{where, "optimizer."};
    const json& o = j["optimizer"];
    ro.only(o, {"type", "params"});
    const std::string type = ro.string(o, "type", "AdamW");
    LOOM_CHECK(type == "AdamW" || type == "Adam",
               ro.key("type") + ": '" + type + "' is not supported (AdamW, Adam with adam_w_mode)");
    if (o.contains("params")) {
      Reader rp{where, "optimizer.params."};
      const json& p = o["params"];
      rp.only(p, {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam"});
      c.adamw.lr = static_cast<float>(rp.number(p, "lr", c.adamw.lr));
      c.adamw.eps = static_cast<float>(rp.number(p, "eps", c.adamw.eps));
      c.adamw.weight_decay = static_cast<float>(rp.number(p, "weight_decay", c.adamw.weight_decay));
      LOOM_CHECK(rp.boolean(p, "adam_w_mode", true),
                 rp.key("adam_w_mode") + ": L2-mode Adam (false) is not supported");
      rp.boolean(p, "torch_adam", false);
      if (p.contains("betas")) {
        const json& b = p["betas"];
        LOOM_CHECK(b.is_array() && b.size() == 2 && b[0].is_number() && b[1].is_number(),
                   rp.key("betas") + " must be [beta1, beta2]");
        c.adamw.beta1 = b[0].get<float>();
        c.adamw.beta2 = b[1].get<float>();
      }
    }
    LOOM_CHECK(c.adamw.lr >= 0.0f, where + ": config key 'optimizer.params.lr' must be >= 0");
  }
  if (j.contains("scheduler")) {
    c.scheduler = j["scheduler"];
    // Validate now so a bad key fails before any work.
    try {
      optim::Schedule::from_json(c.scheduler, c.adamw.lr, c.train_steps);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  }
  if (j.contains("no_decay")) {
    const json& nd = j["no_decay"];
    LOOM_CHECK(nd.is_array(), r.key("no_decay") + " must be a list of bias|norm|embedding");
    c.adamw.decay_bias = c.adamw.decay_norm = c.adamw.decay_embedding = true;
    for (auto& e : nd) {
      LOOM_CHECK(e.is_string() && (e == "bias" || e == "norm" || e == "embedding"),
                 r.key("no_decay") + ": entries must be \"bias\", \"norm\" or \"embedding\"");
      if (e == "bias") c.adamw.decay_bias = false;
      if (e == "norm") c.adamw.decay_norm = false;
      if (e == "embedding") c.adamw.decay_embedding = false;
    }
  }
  if (j.contains("peft")) parse_peft(j["peft"], where, c);
  if (j.contains("zero_optimization")) {
    // DeepSpeed's keys; the ones Loom does not implement are errors, not silently ignored.
    Reader rz{where, "zero_optimization."};
    const json& z = j["zero_optimization"];
    rz.only(z, {"stage", "reduce_bucket_size", "overlap_comm", "contiguous_gradients"});
    c.zero.stage = static_cast<int>(rz.integer(z, "stage", 0));
    LOOM_CHECK(c.zero.stage <= 3, rz.key("stage") + " must be 0, 1, 2 or 3");
    if (z.contains("reduce_bucket_size")) {
      LOOM_CHECK(z["reduce_bucket_size"].is_number() && z["reduce_bucket_size"].get<double>() >= 1,
                 rz.key("reduce_bucket_size") + " must be a positive number of elements");
      c.zero.reduce_bucket_size = static_cast<int64_t>(z["reduce_bucket_size"].get<double>());
    }
    LOOM_CHECK(rz.boolean(z, "overlap_comm", true),
               rz.key("overlap_comm") +
                   ": false is not supported (reductions always overlap "
                   "the backward)");
    LOOM_CHECK(rz.boolean(z, "contiguous_gradients", true),
               rz.key("contiguous_gradients") +
                   ": false is not supported (gradients are "
                   "always in one flat buffer)");
  }
  if (j.contains("expert_parallel")) {  // nn/moe.h; the size must divide dp (checked below)
    Reader re{where, "expert_parallel."};
    re.only(j["expert_parallel"], {"size"});
    c.expert_parallel = static_cast<int>(re.integer(j["expert_parallel"], "size", 1, 1));
    LOOM_CHECK(dp % c.expert_parallel == 0, re.key("size") + " " +
                                                std::to_string(c.expert_parallel) +
                                                " does not divide the " + dp_size);
  }
  if (j.contains("moe")) {  // mixture-of-experts training rules (optim/expert_balance.h)
    Reader rm{where, "moe."};
    rm.only(j["moe"], {"bias_update_rate"});
    c.moe_bias_update_rate = rm.number(j["moe"], "bias_update_rate", 0.0);
    LOOM_CHECK(c.moe_bias_update_rate >= 0.0,
               rm.key("bias_update_rate") + " must be >= 0 (0: the correction bias stays)");
  }
  c.checkpoint_interval = r.integer(j, "checkpoint_interval", 0, 0);
  c.comm_timeout_s = r.number(j, "comm_timeout_s", c.comm_timeout_s);
  LOOM_CHECK(c.comm_timeout_s >= 0.0,
             where + ": config key 'comm_timeout_s' must be >= 0 (0: off)");
  c.resume_from = r.string(j, "resume_from", "");
  // Mixed precision (DeepSpeed's keys and defaults; see config.h).
  bool enabled[2] = {false, false};
  for (int i = 0; i < 2; ++i) {
    const char* k = i == 0 ? "bf16" : "fp16";
    if (!j.contains(k)) continue;
    Reader rm{where, std::string(k) + "."};
    if (i == 0) {
      rm.only(j[k], {"enabled"});
    } else {
      rm.only(j[k], {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
                     "hysteresis", "consecutive_hysteresis", "min_loss_scale"});
      optim::LossScaleConfig& ls = c.loss_scale;
      ls.loss_scale = rm.number(j[k], "loss_scale", 0);
      LOOM_CHECK(ls.loss_scale >= 0, rm.key("loss_scale") + " must be >= 0 (0: dynamic)");
      ls.initial_scale_power = static_cast<int>(rm.integer(j[k], "initial_scale_power", 16));
      LOOM_CHECK(ls.initial_scale_power <= 64, rm.key("initial_scale_power") + " must be <= 64");
      ls.loss_scale_window = rm.integer(j[k], "loss_scale_window", 1000, 1);
      ls.hysteresis = static_cast<int>(rm.integer(j[k], "hysteresis", 2, 1));
      ls.consecutive_hysteresis = rm.boolean(j[k], "consecutive_hysteresis", false);
      ls.min_loss_scale = rm.number(j[k], "min_loss_scale", 1);
      LOOM_CHECK(ls.min_loss_scale > 0, rm.key("min_loss_scale") + " must be > 0");
    }
    enabled[i] = rm.boolean(j[k], "enabled", false);
  }
  LOOM_CHECK(!(enabled[0] && enabled[1]),
             where + ": config keys 'bf16.enabled' and 'fp16.enabled' are both true; choose one");
  if (enabled[0]) c.precision = TrainConfig::Precision::bf16;
  if (enabled[1]) c.precision = TrainConfig::Precision::fp16;
  if (j.contains("communication_data_type")) {
    Reader rc{where, ""};
    const std::string t = rc.string(j, "communication_data_type", "fp32");
    LOOM_CHECK(t == "fp32" || t == "bf16" || t == "fp16",
               rc.key("communication_data_type") +
                   " must be \"fp32\", \"bf16\" or \"fp16\" (got \"" + t + "\")");
    if (t != "fp32") c.zero.comm = t == "bf16" ? kernels::Half::bf16 : kernels::Half::f16;
  }
  if (j.contains("data_types")) {
    Reader rt{where, "data_types."};
    rt.only(j["data_types"], {"grad_accum_dtype"});
    c.grad_accum_dtype = rt.string(j["data_types"], "grad_accum_dtype", "fp32");
    LOOM_CHECK(c.grad_accum_dtype == "fp32" || c.grad_accum_dtype == "bf16" ||
                   c.grad_accum_dtype == "fp16",
               rt.key("grad_accum_dtype") + " must be \"fp32\", \"bf16\" or \"fp16\" (got \"" +
                   c.grad_accum_dtype + "\")");
  }
  return c;
}

const char* precision_name(const TrainConfig& cfg) {
  switch (cfg.precision) {
    case TrainConfig::Precision::bf16:
      return "bf16";
    case TrainConfig::Precision::fp16:
      return "fp16";
    default:
      return "fp32";
  }
}

TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& sets,
                        int64_t world) {
  json j = io::read_json_file(path);
  for (const auto& s : sets) apply_override(j, s);
  return parse_config(j, path.string(), world);
}

}  // namespace loom::train
