#include "loom/train/data_setup.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "loom/data/conversation.h"
#include "loom/io/tokenizer_loader.h"
#include "loom/util/error.h"

namespace loom::train {

namespace fs = std::filesystem;

TextCodec bytes_codec() {
  TextCodec c;
  c.encode = [](const std::string& s) {
    std::vector<int32_t> ids(s.size());
    for (size_t i = 0; i < s.size(); ++i) ids[i] = static_cast<unsigned char>(s[i]);
    return ids;
  };
  c.decode = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s.push_back(static_cast<char>(t));
    return s;
  };
  c.eos_text = "\n\n";  // bytes have no end-of-text token; a blank line ends a sample
  c.id = "bytes";
  return c;
}

TextCodec model_codec(const nlohmann::json& model_cfg) {
  std::string path;
  if (model_cfg.is_string()) path = model_cfg.get<std::string>();
  if (model_cfg.is_object() && model_cfg.contains("path") && model_cfg["path"].is_string())
    path = model_cfg["path"].get<std::string>();
  LOOM_CHECK(!path.empty(),
             "config key 'data.tokenizer': \"model\" needs a model loaded from "
             "a folder or GGUF file (a model built from sizes has no tokenizer; "
             "use \"bytes\")");
  return codec_for(io::load_tokenizer(path));
}

TextCodec codec_for(const io::ModelTokenizer& mt) {
  auto tok = std::make_shared<data::Tokenizer>(mt.tokenizer);
  TextCodec c;
  c.encode = [tok](const std::string& s) { return tok->encode(s, /*allow_special=*/true); };
  c.decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
  c.eos_id = tok->eos_id();
  c.pad_id = tok->pad_id() >= 0 ? tok->pad_id() : std::max(tok->eos_id(), 0);
  if (c.eos_id >= 0) c.eos_text = tok->decode(std::vector<int32_t>{c.eos_id});
  c.id = "bpe:" + std::to_string(tok->fingerprint());
  c.chat_template = data::template_from_jinja(mt.chat_template, &c.default_system);
  return c;
}

namespace {

fs::path cache_dir(const DataConfig& cfg) {
  if (!cfg.cache_dir.empty()) return cfg.cache_dir;
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/tmp") / ".cache" / "loom" / "tokenized";
}

std::unique_ptr<data::Dataset> text_windows(const fs::path& path, const TextCodec& codec,
                                            int64_t seq_len) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), path.string() + ": cannot open data file");
  std::stringstream ss;
  ss << in.rdbuf();
  return std::make_unique<data::TokenWindowDataset>(codec.encode(ss.str()), seq_len, path.string());
}

}  // namespace

TrainData build_train_data(const DataConfig& cfg, const TextCodec& codec, uint64_t seed) {
  TrainData out;
  const data::OnError on_error = cfg.on_error == "skip" ? data::OnError::Skip : data::OnError::Stop;
  data::ReadStats rs;
  // Plain text: windows of the token stream (continued pre-training).
  if (cfg.format == "text" || (cfg.format == "auto" && fs::path(cfg.path).extension() == ".txt")) {
    out.train = text_windows(cfg.path, codec, cfg.seq_len);
    if (!cfg.valid_path.empty()) out.valid = text_windows(cfg.valid_path, codec, cfg.seq_len);
    out.summary = cfg.path + ": text, " + std::to_string(out.train->size()) + " windows of " +
                  std::to_string(cfg.seq_len) + " tokens";
    LOOM_CHECK(cfg.valid_fraction == 0.0,
               "data.valid_fraction applies to dialogue data; give data.valid_path for text");
    return out;
  }
  std::vector<data::Conversation> train =
      data::read_conversations(cfg.path, cfg.format, on_error, &rs);
  std::vector<data::Conversation> valid;
  if (!cfg.valid_path.empty()) {
    valid = data::read_conversations(cfg.valid_path, cfg.format, on_error);
  } else {
    data::split_validation(train, valid, cfg.valid_fraction, seed);
  }
  data::SftOptions o;
  o.seq_len = cfg.seq_len;
  o.pack = cfg.pack;
  o.chat_template = cfg.chat_template == "auto" ? codec.chat_template
                                                : data::parse_template_name(cfg.chat_template);
  o.template_options.default_system = codec.default_system;
  o.template_options.eos_text = codec.eos_text;
  o.template_options.train_on_prompt = cfg.train_on_prompt;
  o.pad_id = codec.pad_id;
  // Everything the rows depend on goes into the cache key.
  const auto key = [&](const std::string& file, const char* part) {
    return std::string("v1|") + part + "|" + std::to_string(data::file_hash(file)) + "|" +
           std::to_string(data::file_hash(cfg.path)) + "|" + codec.id + "|" +
           data::template_name(o.chat_template) + "|" + o.template_options.default_system + "|" +
           o.template_options.eos_text + "|" + std::to_string(cfg.seq_len) + "|" +
           std::to_string(cfg.pack) + "|" + std::to_string(cfg.train_on_prompt) + "|" +
           std::to_string(cfg.valid_fraction) + "|" + std::to_string(seed) + "|" + cfg.on_error;
  };
  const auto cache_file = [&](const std::string& k) {
    return cache_dir(cfg) / (std::to_string(std::hash<std::string>{}(k)) + ".rows");
  };
  data::SftStats st, vst;
  const std::string tk = key(cfg.path, "train");
  out.train = data::SftDataset::build(train, codec.encode, o, cache_file(tk), tk, &st);
  std::ostringstream sum;
  sum << cfg.path << ": " << rs.format << ", " << rs.records << " records";
  if (rs.skipped) sum << " (" << rs.skipped << " malformed, skipped)";
  sum << "; template " << data::template_name(o.chat_template) << "; " << st.rows << " rows of "
      << cfg.seq_len << (cfg.pack ? " (packed)" : "") << ", " << st.target_tokens
      << " target tokens, " << st.truncated << " truncated, " << st.dropped << " dropped"
      << (st.from_cache ? " [cached]" : "");
  if (!valid.empty()) {
    const std::string vk = key(cfg.valid_path.empty() ? cfg.path : cfg.valid_path, "valid");
    out.valid = data::SftDataset::build(valid, codec.encode, o, cache_file(vk), vk, &vst);
    sum << "; validation " << vst.rows << " rows";
  }
  out.summary = sum.str();
  for (const auto& e : rs.first_errors) out.summary += "\n  skipped: " + e;
  return out;
}

}  // namespace loom::train
