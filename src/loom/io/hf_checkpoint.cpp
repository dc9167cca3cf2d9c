#include "loom/io/hf_checkpoint.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "loom/io/safetensors.h"
#include "loom/models/registry.h"
#include "loom/util/error.h"

namespace loom::io {

namespace fs = std::filesystem;

nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  LOOM_CHECK(in.good(), path.string() + ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    size_t line = 1;
    for (size_t i = 0; i < e.byte && i < text.size(); ++i) line += text[i] == '\n';
    throw Error(path.string() + ":" + std::to_string(line) + ": malformed JSON: " + e.what());
  }
}

std::unique_ptr<models::CausalLM> load_hf_model(const fs::path& dir) {
  LOOM_CHECK(fs::is_directory(dir), dir.string() +
                                        ": not a model folder (expected config.json "
                                        "and model.safetensors inside)");
  auto model =
      models::make_model(read_json_file(dir / "config.json"), (dir / "config.json").string());
  load_hf_weights(*model, dir);
  return model;
}

void load_hf_weights(models::CausalLM& model, const fs::path& file_or_dir) {
  SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(file_or_dir);
  std::vector<std::string> used;
  std::vector<float> tmp;
  for (auto& p : model.params().all()) {
    // save_pretrained of *LMHeadModel prefixes "transformer."; hub GPT-2 files do not.
    std::string name = p->name;
    if (!ck.find(name) && name.rfind("transformer.", 0) == 0) name = name.substr(12);
    LOOM_CHECK(ck.find(name),
               file_or_dir.string() + ": tensor '" + p->name + "' is missing from the checkpoint");
    used.push_back(name);
    float* dst = p->value.f32();
    if (model.hf_transposed(*p)) {
      const int64_t rows = p->shape[0], cols = p->shape[1];  // ours [out, in]; HF [in, out]
      tmp.resize(rows * cols);
      const int64_t hf_shape[2] = {cols, rows};
      ck.read_f32(name, hf_shape, tmp.data());
      for (int64_t i = 0; i < cols; ++i)
        for (int64_t o = 0; o < rows; ++o) dst[o * cols + i] = tmp[i * rows + o];
    } else {
      ck.read_f32(name, p->shape, dst);
    }
  }
  std::vector<std::string> extra;
  for (const auto& n : ck.names()) {
    bool is_used = std::find(used.begin(), used.end(), n) != used.end();
    if (!is_used && !model.hf_ignorable(n)) extra.push_back(n);
  }
  if (!extra.empty()) {
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", " : "") + extra[i];
    std::fprintf(stderr, "note: %s: %zu tensor(s) not used by the %s model: %s%s\n",
                 file_or_dir.string().c_str(), extra.size(), model.arch().c_str(), list.c_str(),
                 extra.size() > 5 ? ", ..." : "");
  }
}

void save_hf_checkpoint(models::CausalLM& model, const fs::path& dir,
                        const fs::path& tokenizer_from) {
  const fs::path tmp_dir = dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  try {
    {
      std::ofstream out(tmp_dir / "config.json");
      out << model.hf_config().dump(2) << "\n";
      LOOM_CHECK(out.good(), (tmp_dir / "config.json").string() + ": write failed");
    }
    // HF layout: transposed copies for Conv1D weights, views of our buffers otherwise.
    std::vector<std::vector<float>> transposed;
    std::vector<StWriteTensor> tensors;
    for (auto& p : model.params().all()) {
      StWriteTensor t;
      t.name = p->name;
      t.dtype = StDType::F32;
      t.nbytes = p->value.nbytes();
      if (model.hf_transposed(*p)) {
        const int64_t rows = p->shape[0], cols = p->shape[1];
        auto& buf = transposed.emplace_back(rows * cols);
        const float* src = p->value.f32();
        for (int64_t o = 0; o < rows; ++o)
          for (int64_t i = 0; i < cols; ++i) buf[i * rows + o] = src[o * cols + i];
        t.shape = {cols, rows};
        t.data = buf.data();
      } else {
        t.shape = p->shape;
        t.data = p->value.raw();
      }
      tensors.push_back(std::move(t));
    }
    write_safetensors(tmp_dir / "model.safetensors", tensors, {{"format", "pt"}});
    if (!tokenizer_from.empty()) {
      if (fs::is_directory(tokenizer_from)) {
        for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
          if (fs::exists(tokenizer_from / f)) fs::copy_file(tokenizer_from / f, tmp_dir / f);
      } else {
        std::ofstream(tmp_dir / "tokenizer_source.json")
            << nlohmann::json{{"gguf", fs::absolute(tokenizer_from).string()}}.dump() << "\n";
      }
    }
    if (fs::exists(dir)) fs::remove_all(dir);
    fs::rename(tmp_dir, dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    throw;
  }
}

}  // namespace loom::io
