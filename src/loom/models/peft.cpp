#include "loom/models/peft.h"

#include <regex>
#include <set>

#include "loom/util/error.h"

namespace loom::models {

namespace {

// "model.layers.0.self_attn.q_proj.weight" -> "model.layers.0.self_attn.q_proj"
std::string module_of(const std::string& param_name) {
  const size_t dot = param_name.rfind('.');
  return dot == std::string::npos ? param_name : param_name.substr(0, dot);
}

std::vector<nn::Linear*> lora_targets(CausalLM& model, const PeftConfig& cfg) {
  std::vector<nn::Linear*> all = model.linears(), out;
  if (!cfg.target_regex.empty()) {
    if (cfg.target_regex == "all-linear") return all;
    std::regex re;
    try {
      re = std::regex(cfg.target_regex);
    } catch (const std::regex_error& e) {
      throw Error("peft.target_modules: '" + cfg.target_regex +
                  "' is not a valid regular expression: " + e.what());
    }
    for (nn::Linear* l : all)
      if (std::regex_match(l->name(), re)) out.push_back(l);
    LOOM_CHECK(!out.empty(),
               "peft.target_modules: '" + cfg.target_regex + "' matches no linear layer");
    return out;
  }
  LOOM_CHECK(!cfg.target_modules.empty(), "peft.target_modules: LoRA needs at least one target");
  std::set<std::string> unmatched(cfg.target_modules.begin(), cfg.target_modules.end());
  for (nn::Linear* l : all) {
    bool hit = false;
    for (const std::string& t : cfg.target_modules) {
      if (peft_name_matches(l->name(), t)) {
        hit = true;
        unmatched.erase(t);
      }
    }
    if (hit) out.push_back(l);
  }
  if (!unmatched.empty()) {
    std::string names, have;
    for (const auto& u : unmatched) names += (names.empty() ? "'" : ", '") + u + "'";
    for (nn::Linear* l : all) {
      const std::string leaf = l->name().substr(l->name().rfind('.') + 1);
      if (have.find(leaf) == std::string::npos) have += (have.empty() ? "" : ", ") + leaf;
    }
    throw Error("peft.target_modules: " + names + " match no linear layer of the " + model.arch() +
                " model (its linear layers: " + have + ")");
  }
  return out;
}

}  // namespace

bool peft_name_matches(const std::string& name, const std::string& entry) {
  return name == entry || (name.size() > entry.size() && name.ends_with(entry) &&
                           name[name.size() - entry.size() - 1] == '.');
}

void apply_peft(CausalLM& model, const PeftConfig& cfg, uint64_t seed) {
  if (!cfg.enabled()) return;
  declare_peft(model, cfg);
  // Each unit's trainable parameters contiguous (what ZeRO partitions and reduces by unit).
  nn::ParamStore& ps = model.params();
  ps.materialize([&](const nn::Parameter& p) { return model.unit_of(p.name); });
  ps.init_new(seed);
}

void declare_peft(CausalLM& model, const PeftConfig& cfg) {
  if (!cfg.enabled()) return;
  nn::ParamStore& ps = model.params();
  const size_t n_base = ps.all().size();
  for (auto& p : ps.all()) p->trainable = false;

  for (const std::string& entry : cfg.modules_to_save) {
    bool hit = false;
    for (auto& p : ps.all()) {
      if (p->kind == nn::ParamKind::Buffer || !peft_name_matches(module_of(p->name), entry))
        continue;
      LOOM_CHECK(!p->quantized() && !p->held_in_half(),
                 "peft.modules_to_save: " + p->name + " is held " +
                     (p->quantized() ? "quantized" : "in 16 bits") +
                     " and cannot be trained in full");
      p->trainable = hit = true;
    }
    LOOM_CHECK(hit, "peft.modules_to_save: '" + entry + "' matches no module of the " +
                        model.arch() + " model" +
                        (entry == "lm_head" ? " (a tied LM head is the token embedding)" : ""));
  }

  if (cfg.method == "lora") {
    std::vector<nn::Linear*> targets = lora_targets(model, cfg);
    for (nn::Linear* l : targets) l->attach_lora(ps, cfg.lora, &model.dropout());
    if (cfg.bias == "all") {  // PEFT: every parameter named *bias, norms' included
      for (auto& p : ps.all())
        if (p->name.ends_with(".bias")) p->trainable = true;
    } else if (cfg.bias == "lora_only") {
      for (nn::Linear* l : targets)
        if (l->bias()) l->bias()->trainable = true;
    }
  } else if (cfg.method == "adapter") {
    model.add_bottleneck_adapters(cfg.adapter);
  } else if (cfg.method == "prefix") {
    model.add_kv_prefix({cfg.num_virtual_tokens, cfg.prefix_projection, cfg.encoder_hidden_size});
  } else {
    throw Error("peft.method: '" + cfg.method + "' is not one of lora, adapter, prefix");
  }
  for (size_t i = n_base; i < ps.all().size(); ++i) ps.all()[i]->adapter = true;
}

}  // namespace loom::models
