#include "loom/io/tokenizer_loader.h"

#include "loom/io/gguf.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/model_loader.h"
#include "loom/util/error.h"
#include "loom/util/path.h"

namespace loom::io {

namespace fs = std::filesystem;

GgufTokenizer read_gguf_tokenizer(const fs::path& file) {
  GgufFile f = GgufFile::open(file);
  const std::string model = f.get_string_or("tokenizer.ggml.model", "");
  LOOM_CHECK(model == "gpt2", file.string() + ": tokenizer.ggml.model '" + model +
                                  "' is not supported (byte-level BPE, \"gpt2\")");
  data::TokenizerSpec s;
  s.tokens = f.get_string_array("tokenizer.ggml.tokens");
  s.merges = f.get_string_array("tokenizer.ggml.merges");
  if (f.has("tokenizer.ggml.token_type"))
    s.token_types = f.get_i32_array("tokenizer.ggml.token_type");
  s.pre_tokenizer =
      data::pretokenizer_from_gguf_name(f.get_string_or("tokenizer.ggml.pre", "gpt-2"));
  auto id = [&](const char* key) { return f.has(key) ? static_cast<int32_t>(f.get_i64(key)) : -1; };
  s.bos_id = id("tokenizer.ggml.bos_token_id");
  s.eos_id = id("tokenizer.ggml.eos_token_id");
  s.pad_id = id("tokenizer.ggml.padding_token_id");
  s.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", false);
  s.source = file.string();
  return {std::move(s), f.get_string_or("tokenizer.chat_template", "")};
}

fs::path gguf_tokenizer_source(const fs::path& path) {
  const fs::path p = expand_user(path);
  if (is_gguf(p)) return p;
  const fs::path src = p / "tokenizer_source.json";
  if (fs::exists(p / "tokenizer.json") || !fs::exists(src)) return {};
  // A checkpoint fine-tuned from a GGUF file before folders carried tokenizer.json.
  nlohmann::json j = read_json_file(src);
  LOOM_CHECK(j.is_object() && j.contains("gguf") && j["gguf"].is_string(),
             src.string() + ": expected {\"gguf\": path}");
  return j["gguf"].get<std::string>();
}

ModelTokenizer load_tokenizer(const fs::path& path) {
  if (const fs::path g = gguf_tokenizer_source(path); !g.empty()) {
    GgufTokenizer t = read_gguf_tokenizer(g);
    return {data::Tokenizer::from_vocab(t.spec), std::move(t.chat_template)};
  }
  const fs::path p = expand_user(path);
  const fs::path tj = p / "tokenizer.json";
  LOOM_CHECK(fs::exists(tj), p.string() +
                                 ": no tokenizer.json (use data.tokenizer \"bytes\" "
                                 "for a byte-level model)");
  ModelTokenizer mt{data::Tokenizer::from_hf_json(tj), ""};
  const fs::path tc = p / "tokenizer_config.json";
  if (fs::exists(tc)) {
    nlohmann::json j = read_json_file(tc);
    if (j.contains("chat_template") && j["chat_template"].is_string())
      mt.chat_template = j["chat_template"].get<std::string>();
  }
  return mt;
}

}  // namespace loom::io
