#include "loom/io/model_loader.h"

#include <cstdio>
#include <set>

#include "loom/io/gguf.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/models/registry.h"
#include "loom/util/error.h"
#include "loom/util/path.h"

namespace loom::io {

namespace fs = std::filesystem;

bool is_gguf(const fs::path& p) { return p.extension() == ".gguf"; }

std::unique_ptr<models::CausalLM> load_gguf_model(const fs::path& file) {
  GgufFile f = GgufFile::open(file);
  auto model = models::make_model(gguf_hf_config(f), file.string());
  std::set<std::string> filled;
  std::vector<std::string> unused;
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
    read_hf_tensor(f, t, p->value.f32());
    filled.insert(hf);
  }
  for (auto& p : model->params().all())
    LOOM_CHECK(filled.count(p->name), file.string() + ": no tensor for '" + p->name + "'");
  if (!unused.empty())
    std::fprintf(stderr, "note: %s: %zu tensor(s) not used (first: %s)\n", file.string().c_str(),
                 unused.size(), unused[0].c_str());
  return model;
}

std::unique_ptr<models::CausalLM> load_model(const fs::path& path) {
  const fs::path p = expand_user(path);
  if (is_gguf(p)) return load_gguf_model(p);
  return load_hf_model(p);
}

}  // namespace loom::io
