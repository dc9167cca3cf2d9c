#include "loom/io/peft_adapter.h"

#include <cmath>
#include <map>
#include <set>

#include "loom/io/hf_checkpoint.h"
#include "loom/io/safetensors.h"
#include "loom/util/error.h"
#include "loom/util/path.h"

namespace loom::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kPrefixKey = "prompt_embeddings";
constexpr const char* kBottleneckType = "LOOM_BOTTLENECK_ADAPTER";

// The adapter's tensors: PEFT's key -> our parameter (the prefix table has its own key).
// A base parameter of a layer PEFT wrapped with LoRA (a bias trained with bias="all" or
// "lora_only") lives under the wrapper's "base_layer." in PEFT's names.
std::map<std::string, nn::Parameter*> adapter_tensors(models::CausalLM& model) {
  std::map<const nn::Parameter*, std::string> wrapped;
  for (nn::Linear* l : model.linears()) {
    if (!l->lora()) continue;
    wrapped[l->weight()] = l->name() + ".base_layer.weight";
    if (l->bias()) wrapped[l->bias()] = l->name() + ".base_layer.bias";
  }
  std::map<std::string, nn::Parameter*> out;
  for (auto& p : model.params().all()) {
    if (p->name.starts_with("prefix_encoder.")) continue;  // saved as the table
    if (!p->adapter && !p->trainable) continue;
    auto w = wrapped.find(p.get());
    out["base_model.model." + (w != wrapped.end() ? w->second : p->name)] = p.get();
  }
  return out;
}

std::vector<std::string> lora_target_leaves(models::CausalLM& model) {
  std::set<std::string> leaves;
  for (nn::Linear* l : model.linears())
    if (l->lora()) leaves.insert(l->name().substr(l->name().rfind('.') + 1));
  return {leaves.begin(), leaves.end()};
}

json config_json(models::CausalLM& model, const models::PeftConfig& cfg, const std::string& base) {
  json j;
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base;
  j["inference_mode"] = true;
  j["revision"] = nullptr;
  if (cfg.method == "lora") {
    j["peft_type"] = "LORA";
    j["r"] = cfg.lora.r;
    j["lora_alpha"] = cfg.lora.alpha;
    j["lora_dropout"] = cfg.lora.dropout;
    j["use_rslora"] = cfg.lora.rslora;
    j["bias"] = cfg.bias;
    j["target_modules"] =
        cfg.target_regex.empty() ? json(lora_target_leaves(model)) : json(cfg.target_regex);
    j["modules_to_save"] = cfg.modules_to_save.empty() ? json(nullptr) : json(cfg.modules_to_save);
    j["fan_in_fan_out"] = model.arch() == "gpt2";  // GPT-2's Conv1D layers
    j["init_lora_weights"] = true;
    j["use_dora"] = false;
    j["layers_to_transform"] = nullptr;
    j["layers_pattern"] = nullptr;
    j["rank_pattern"] = json::object();
    j["alpha_pattern"] = json::object();
  } else if (cfg.method == "prefix") {
    const nn::KVPrefix* pre = model.kv_prefix();
    const int64_t layers = pre->num_layers();
    j["peft_type"] = "PREFIX_TUNING";
    j["num_virtual_tokens"] = pre->length();
    j["token_dim"] = pre->full_kv_width();
    j["num_attention_heads"] = model.kv_heads();
    j["num_layers"] = layers;
    j["num_transformer_submodules"] = 1;
    j["prefix_projection"] = cfg.prefix_projection;
    j["encoder_hidden_size"] = pre->spec().encoder_hidden;
  } else {
    j["peft_type"] = kBottleneckType;
    j["bottleneck_size"] = cfg.adapter.bottleneck;
    j["non_linearity"] = cfg.adapter.activation;
  }
  return j;
}

// Keys of adapter_config.json that must hold their default (Loom does not implement them).
void require_default(const json& j, const std::string& where, const char* key, const json& dflt) {
  if (!j.contains(key) || j[key].is_null() || j[key] == dflt) return;
  throw Error(where + ": key '" + key + "' = " + j[key].dump() + " is not supported (only " +
              dflt.dump() + ")");
}

}  // namespace

bool is_adapter_folder(const fs::path& p) {
  return fs::is_directory(p) && fs::exists(p / "adapter_config.json");
}

AdapterFolder read_adapter_config(const fs::path& dir) {
  const fs::path file = dir / "adapter_config.json";
  const std::string where = file.string();
  const json j = read_json_file(file);
  LOOM_CHECK(j.is_object(), where + ": must be a JSON object");
  auto str = [&](const char* k, const std::string& dflt) {
    if (!j.contains(k) || j[k].is_null()) return dflt;
    LOOM_CHECK(j[k].is_string(), where + ": key '" + k + "' must be a string");
    return j[k].get<std::string>();
  };
  auto num = [&](const char* k, double dflt) {
    if (!j.contains(k) || j[k].is_null()) return dflt;
    LOOM_CHECK(j[k].is_number(), where + ": key '" + k + "' must be a number");
    return j[k].get<double>();
  };
  auto boolean = [&](const char* k, bool dflt) {
    if (!j.contains(k) || j[k].is_null()) return dflt;
    LOOM_CHECK(j[k].is_boolean(), where + ": key '" + k + "' must be true or false");
    return j[k].get<bool>();
  };
  auto strings = [&](const char* k) {
    std::vector<std::string> out;
    if (!j.contains(k) || j[k].is_null()) return out;
    LOOM_CHECK(j[k].is_array(), where + ": key '" + k + "' must be a list of names");
    for (const auto& e : j[k]) {
      LOOM_CHECK(e.is_string(), where + ": key '" + k + "' must be a list of names");
      out.push_back(e.get<std::string>());
    }
    return out;
  };
  AdapterFolder a;
  a.base = str("base_model_name_or_path", "");
  const std::string task = str("task_type", "CAUSAL_LM");
  LOOM_CHECK(task == "CAUSAL_LM",
             where + ": task_type '" + task + "' is not supported (CAUSAL_LM)");
  const std::string type = str("peft_type", "");
  models::PeftConfig& c = a.config;
  if (type == "LORA") {
    c.method = "lora";
    c.lora.r = static_cast<int64_t>(num("r", 8));
    c.lora.alpha = static_cast<float>(num("lora_alpha", 8));
    c.lora.dropout = static_cast<float>(num("lora_dropout", 0));
    c.lora.rslora = boolean("use_rslora", false);
    c.bias = str("bias", "none");
    LOOM_CHECK(c.bias == "none" || c.bias == "all" || c.bias == "lora_only",
               where + ": key 'bias' must be none, all or lora_only");
    LOOM_CHECK(j.contains("target_modules"), where + ": key 'target_modules' is required");
    if (j["target_modules"].is_string())
      c.target_regex = j["target_modules"].get<std::string>();
    else
      c.target_modules = strings("target_modules");
    c.modules_to_save = strings("modules_to_save");
    require_default(j, where, "use_dora", false);
    require_default(j, where, "lora_bias", false);
    require_default(j, where, "rank_pattern", json::object());
    require_default(j, where, "alpha_pattern", json::object());
    require_default(j, where, "layers_to_transform", nullptr);
    require_default(j, where, "exclude_modules", nullptr);
    require_default(j, where, "target_parameters", nullptr);
    require_default(j, where, "trainable_token_indices", nullptr);
  } else if (type == "PREFIX_TUNING") {
    c.method = "prefix";
    c.num_virtual_tokens = static_cast<int64_t>(num("num_virtual_tokens", 0));
    // The saved table is the projection's output; it is used (and trained further) directly,
    // as PEFT does in inference mode.
    c.prefix_projection = false;
    require_default(j, where, "num_transformer_submodules", 1);
  } else if (type == kBottleneckType) {
    c.method = "adapter";
    c.adapter.bottleneck = static_cast<int64_t>(num("bottleneck_size", 64));
    c.adapter.activation = str("non_linearity", "gelu");
  } else {
    throw Error(where + ": peft_type '" + type + "' is not supported (LORA, PREFIX_TUNING, " +
                kBottleneckType + ")");
  }
  return a;
}

void load_adapter_weights(models::CausalLM& model, const fs::path& dir) {
  const fs::path file = dir / "adapter_model.safetensors";
  SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(file);
  std::set<std::string> used;
  for (auto& [key, p] : adapter_tensors(model)) {
    LOOM_CHECK(ck.find(key), file.string() + ": tensor '" + key + "' is missing");
    read_param(ck, key, model, *p);  // a Conv1D weight trained in full comes transposed
    used.insert(key);
  }
  if (nn::KVPrefix* pre = model.kv_prefix()) {
    read_param(ck, kPrefixKey, model, *pre->embedding());
    used.insert(kPrefixKey);
  }
  const std::string prefix = "base_model.model.";
  for (const std::string& n : ck.names())
    LOOM_CHECK(
        used.count(n) || (n.starts_with(prefix) && model.held_elsewhere(n.substr(prefix.size()))),
        file.string() + ": tensor '" + n + "' is not part of this " + model.arch() +
            " model's adapter");
}

std::unique_ptr<models::CausalLM> load_adapter_model(const fs::path& dir, const LoadOptions& opt) {
  AdapterFolder a = read_adapter_config(dir);
  fs::path base = opt.base.empty() ? expand_user(a.base) : opt.base;
  LOOM_CHECK(!base.empty(), (dir / "adapter_config.json").string() +
                                ": base_model_name_or_path is empty; name the base model "
                                "(--base PATH)");
  // A relative base is read from the working directory, as PEFT does, or else from beside
  // the adapter folder (so a folder moved together with its base still loads).
  if (base.is_relative() && !fs::exists(base) && fs::exists(dir / base)) base = dir / base;
  LOOM_CHECK(fs::exists(base), (dir / "adapter_config.json").string() + ": base model '" +
                                   base.string() + "' not found (give --base PATH)");
  LOOM_CHECK(!is_adapter_folder(base), base.string() +
                                           ": the base of an adapter cannot itself "
                                           "be an adapter folder");
  LoadOptions base_opt = opt;
  base_opt.keep_f32_modules = a.config.modules_to_save;
  base_opt.base.clear();
  auto model = load_model(base, base_opt);
  models::apply_peft(*model, a.config, /*seed=*/0);
  load_adapter_weights(*model, dir);
  return model;
}

void save_adapter(models::CausalLM& model, const models::PeftConfig& cfg, const fs::path& dir,
                  const std::string& base, const fs::path& tokenizer_from) {
  write_folder_atomically(dir, [&](const fs::path& tmp) {
    write_adapter_config(model, cfg, tmp, base, tokenizer_from);
    write_adapter_weights(model, tmp / "adapter_model.safetensors");
  });
}

void write_adapter_config(models::CausalLM& model, const models::PeftConfig& cfg,
                          const fs::path& dir, const std::string& base,
                          const fs::path& tokenizer_from) {
  write_json_file(dir / "adapter_config.json", config_json(model, cfg, base));
  write_tokenizer_files(dir, tokenizer_from);
}

void write_adapter_weights(models::CausalLM& model, const fs::path& file, bool experts_only) {
  std::vector<std::vector<float>> copies;
  std::vector<StWriteTensor> tensors;
  for (auto& [key, p] : adapter_tensors(model)) {
    if (p->stage_copy) continue;  // the first pipeline stage writes the tied table
    if (experts_only && !p->expert) continue;
    LOOM_CHECK(p->shape == p->full_shape,
               "internal: " + p->name + " is a tensor-parallel shard; gather it before saving");
    StWriteTensor t{key, StDType::F32, p->shape, p->value.raw(), p->value.nbytes()};
    if (model.hf_transposed(*p)) {
      const int64_t rows = p->shape[0], cols = p->shape[1];
      auto& buf = copies.emplace_back(rows * cols);
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t i = 0; i < cols; ++i) buf[i * rows + o] = p->value.f32()[o * cols + i];
      t.shape = {cols, rows};
      t.data = buf.data();
    }
    tensors.push_back(std::move(t));
  }
  if (nn::KVPrefix* pre = experts_only ? nullptr : model.kv_prefix()) {
    // Without projection the table is the parameter (whole here, nn/full_tensors.h).
    const Tensor& table = pre->spec().projection ? pre->forward() : pre->embedding()->value;
    LOOM_CHECK(table.dim(1) == 2 * pre->num_layers() * pre->full_kv_width(),
               file.parent_path().string() +
                   ": a projected prefix table split over tensor-parallel ranks "
                   "cannot be saved (train it with prefix_projection false)");
    tensors.push_back({kPrefixKey, StDType::F32, table.shape(), table.raw(), table.nbytes()});
  }
  write_safetensors(file, tensors, {{"format", "pt"}});
}

void merge_adapter_weights(const fs::path& dir, const std::vector<fs::path>& parts) {
  std::vector<SafetensorsFile> files;
  std::vector<StWriteTensor> tensors;
  std::set<std::string> seen;
  for (const fs::path& part : parts) {
    const SafetensorsFile& f = files.emplace_back(SafetensorsFile::open(part));
    for (const auto& t : f.tensors()) {
      LOOM_CHECK(seen.insert(t.name).second,
                 part.string() + ": tensor '" + t.name + "' is in another part too");
      tensors.push_back({t.name, t.dtype, t.shape, t.data.data(), t.data.size()});
    }
  }
  write_safetensors(dir / "adapter_model.safetensors", tensors, {{"format", "pt"}});
  files.clear();
  for (const fs::path& part : parts) fs::remove(part);
}

}  // namespace loom::io
