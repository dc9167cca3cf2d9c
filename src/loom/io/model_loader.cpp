#include "loom/io/model_loader.h"

#include <cstdio>
#include <set>

#include "loom/io/gguf.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/peft_adapter.h"
#include "loom/models/peft.h"
#include "loom/models/registry.h"
#include "loom/util/error.h"
#include "loom/util/path.h"

namespace loom::io {

namespace fs = std::filesystem;

bool is_gguf(const fs::path& p) { return p.extension() == ".gguf"; }

std::unique_ptr<models::CausalLM> load_gguf_model(const fs::path& file, const LoadOptions& opt) {
  GgufFile f = GgufFile::open(file);
  auto model = models::make_model(gguf_hf_config(f), file.string());
  auto keep_f32 = [&](const std::string& hf_name) {
    const std::string module = hf_name.substr(0, hf_name.rfind('.'));
    for (const std::string& m : opt.keep_f32_modules)
      if (models::peft_name_matches(module, m)) return true;
    return false;
  };
  std::set<std::string> filled;
  std::vector<std::string> unused;
  int64_t n_quantized = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::string hf = gguf_to_hf_name(t.name);
    nn::Parameter* p = hf.empty() ? nullptr : model->params().find(hf);
    if (!p) {
      unused.push_back(t.name);
      continue;
    }
    LOOM_CHECK(t.hf_shape() == p->shape, file.string() + ": tensor '" + t.name + "' (" + hf +
                                             ") has shape " + shape_str(t.hf_shape()) +
                                             " vs expected " + shape_str(p->shape));
    if (opt.keep_quantized && t.ne.size() == 2 && t.type != GgmlType::F32 && !keep_f32(hf)) {
      p->quant = std::make_shared<const QuantMatrix>(read_hf_quant(f, t));
      p->trainable = false;
      ++n_quantized;
    } else {
      read_hf_tensor(f, t, p->value.f32());
    }
    filled.insert(hf);
  }
  // Lay the store out again without f32 slots for the quantized weights (their pages in
  // the first layout were never written, so they never became resident).
  if (n_quantized > 0) model->params().materialize();
  for (auto& p : model->params().all())
    LOOM_CHECK(filled.count(p->name), file.string() + ": no tensor for '" + p->name + "'");
  if (!unused.empty())
    std::fprintf(stderr, "note: %s: %zu tensor(s) not used (first: %s)\n", file.string().c_str(),
                 unused.size(), unused[0].c_str());
  return model;
}

std::unique_ptr<models::CausalLM> load_model(const fs::path& path, const LoadOptions& opt) {
  const fs::path p = expand_user(path);
  if (is_adapter_folder(p)) return load_adapter_model(p, opt);
  if (is_gguf(p)) return load_gguf_model(p, opt);
  return load_hf_model(p);
}

}  // namespace loom::io
