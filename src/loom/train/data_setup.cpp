#include "loom/train/data_setup.h"

#include <cstdlib>
#include <sstream>

#include "loom/data/conversation.h"
#include "loom/data/mixture.h"
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
  TextCodec c = codec_for(io::load_tokenizer(path));
  c.source = path;
  return c;
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

TextCodec data_codec(const DataConfig& data, const nlohmann::json& model_cfg) {
  return data.tokenizer == "bytes" ? bytes_codec() : model_codec(model_cfg);
}

namespace {

fs::path cache_dir(const DataConfig& cfg) {
  if (!cfg.cache_dir.empty()) return cfg.cache_dir;
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/tmp") / ".cache" / "loom" / "tokenized";
}

// Pre-training documents as strings: each "text" message split at every occurrence of the
// EOS text (how a .txt file separates its documents; a record may hold several too). A
// trailing EOS ends the last document rather than starting an empty one, so the windows'
// token stream is the file's own, with an EOS after the last document if it has none.
std::vector<std::string> documents(const std::vector<data::Conversation>& convs,
                                   const std::string& eos_text) {
  std::vector<std::string> out;
  for (const data::Conversation& c : convs) {
    const std::string& t = c.messages.at(0).content;
    size_t from = 0;
    while (!eos_text.empty()) {
      const size_t at = t.find(eos_text, from);
      if (at == std::string::npos) break;
      out.push_back(t.substr(from, at - from));
      from = at + eos_text.size();
    }
    if (from < t.size() || from == 0) out.push_back(t.substr(from));
  }
  return out;
}

std::vector<data::Conversation> as_conversations(std::vector<std::string> docs) {
  std::vector<data::Conversation> out;
  for (std::string& d : docs) out.push_back(data::Conversation{{{"text", std::move(d)}}});
  return out;
}

// Continued pre-training on documents (data/dataset.h's TokenWindowDataset).
TrainData text_data(const DataConfig& cfg, const DataSource& src, const std::string& valid_path,
                    const TextCodec& codec, uint64_t seed,
                    const std::vector<data::Conversation>& train_in,
                    const std::vector<data::Conversation>& valid_in, const data::ReadStats& rs) {
  std::vector<data::Conversation> train = as_conversations(documents(train_in, codec.eos_text));
  std::vector<data::Conversation> valid = as_conversations(documents(valid_in, codec.eos_text));
  if (valid_path.empty()) data::split_validation(train, valid, cfg.valid_fraction, seed);
  const auto windows = [&](const std::vector<data::Conversation>& docs, const std::string& what) {
    std::vector<std::string> text;
    for (const auto& d : docs) text.push_back(d.messages[0].content);
    return std::make_unique<data::TokenWindowDataset>(text, codec.encode, codec.eos_text,
                                                      cfg.seq_len, cfg.pack, what);
  };
  TrainData out;
  auto tw = windows(train, src.path);
  SourceStats& s = out.sources.emplace_back();
  s.path = src.path;
  s.format = "text";
  s.records = rs.records;
  s.skipped = rs.skipped;
  s.rows = tw->size();
  s.documents = tw->num_documents();
  s.tokens = tw->num_tokens();
  s.target_tokens = std::max<int64_t>(s.tokens - 1, 0);
  std::ostringstream sum;
  sum << src.path << ": text, " << rs.records << (rs.records == 1 ? " record" : " records");
  if (rs.skipped) sum << " (" << rs.skipped << " malformed, skipped)";
  sum << ", " << tw->num_documents() << " documents, " << tw->num_tokens() << " tokens; "
      << tw->size() << " windows of " << cfg.seq_len
      << (cfg.pack ? " (packed: attention and loss inside each document)" : "");
  out.train = std::move(tw);
  if (!valid.empty()) {
    out.valid = windows(valid, valid_path.empty() ? src.path : valid_path);
    s.valid_rows = out.valid->size();
    s.valid_documents = static_cast<int64_t>(valid.size());
    sum << "; validation " << valid.size() << " documents, " << out.valid->size() << " windows";
  }
  s.summary = sum.str();
  for (const auto& e : rs.first_errors) s.summary += "\n  skipped: " + e;
  return out;
}

// One data file: read, its validation split off (or read from valid_path), tokenized.
TrainData build_source(const DataConfig& cfg, const DataSource& src, const std::string& valid_path,
                       const TextCodec& codec, uint64_t seed) {
  TrainData out;
  const data::OnError on_error = cfg.on_error == "skip" ? data::OnError::Skip : data::OnError::Stop;
  data::ReadStats rs;
  std::vector<data::Conversation> train =
      data::read_conversations(src.path, src.format, on_error, &rs);
  std::vector<data::Conversation> valid;
  if (!valid_path.empty()) {
    data::ReadStats vs;
    valid = data::read_conversations(valid_path, src.format, on_error, &vs);
    LOOM_CHECK((vs.format == "text") == (rs.format == "text"),
               valid_path + ": config key 'data.valid_path' holds " + vs.format + " but " +
                   src.path + " holds " + rs.format + " (both must be text, or both dialogue)");
  }
  if (rs.format == "text") return text_data(cfg, src, valid_path, codec, seed, train, valid, rs);
  if (valid_path.empty()) data::split_validation(train, valid, cfg.valid_fraction, seed);
  data::SftOptions o;
  o.seq_len = cfg.seq_len;
  o.pack = cfg.pack;
  o.chat_template = cfg.chat_template == "auto" ? codec.chat_template
                                                : data::parse_template_name(cfg.chat_template);
  o.template_options.default_system = codec.default_system;
  o.template_options.eos_text = codec.eos_text;
  o.template_options.train_on_prompt = cfg.train_on_prompt;
  o.pad_id = codec.pad_id;
  o.progress_label = "tokenizing " + fs::path(src.path).filename().string();
  for (const data::Conversation& c : train) {
    if (!data::uses_tools(c) || data::renders_tools(o.chat_template)) continue;
    throw Error(
        src.path + ": conversations with tools or tool calls, and the chat template " +
        data::template_name(o.chat_template) +
        (cfg.chat_template == "auto"
             ? " (" + (codec.source.empty() ? "bytes" : "the model's, from " + codec.source) + ")"
             : std::string()) +
        " cannot render them: set data.template to one that can (qwen2.5, llama3.1)");
  }
  // Everything the rows depend on goes into the cache key.
  const auto key = [&](const std::string& file, const char* part) {
    return std::string("v1|") + part + "|" + std::to_string(data::file_hash(file)) + "|" +
           std::to_string(data::file_hash(src.path)) + "|" + rs.format + "|" + codec.id + "|" +
           data::template_name(o.chat_template) + "|" + o.template_options.default_system + "|" +
           o.template_options.eos_text + "|" + std::to_string(cfg.seq_len) + "|" +
           std::to_string(cfg.pack) + "|" + std::to_string(cfg.train_on_prompt) + "|" +
           std::to_string(cfg.valid_fraction) + "|" + std::to_string(seed) + "|" + cfg.on_error;
  };
  const auto cache_file = [&](const std::string& k) {
    return cache_dir(cfg) / (std::to_string(std::hash<std::string>{}(k)) + ".rows");
  };
  data::SftStats st, vst;
  const std::string tk = key(src.path, "train");
  out.train = data::SftDataset::build(train, codec.encode, o, cache_file(tk), tk, &st);
  SourceStats& s = out.sources.emplace_back();
  s.path = src.path;
  s.format = rs.format;
  s.records = rs.records;
  s.skipped = rs.skipped;
  s.rows = st.rows;
  s.tokens = st.tokens;
  s.target_tokens = st.target_tokens;
  s.truncated = st.truncated;
  s.dropped = st.dropped;
  std::ostringstream sum;
  sum << src.path << ": " << rs.format << ", " << rs.records << " records";
  if (rs.skipped) sum << " (" << rs.skipped << " malformed, skipped)";
  sum << "; template " << data::template_name(o.chat_template) << "; " << st.rows << " rows of "
      << cfg.seq_len << (cfg.pack ? " (packed)" : "") << ", " << st.target_tokens
      << " target tokens, " << st.truncated << " truncated, " << st.dropped << " dropped"
      << (st.from_cache ? " [cached]" : "");
  if (!valid.empty()) {
    const std::string vk = key(valid_path.empty() ? src.path : valid_path, "valid");
    out.valid = data::SftDataset::build(valid, codec.encode, o, cache_file(vk), vk, &vst);
    s.valid_rows = vst.rows;
    sum << "; validation " << vst.rows << " rows";
  }
  s.summary = sum.str();
  for (const auto& e : rs.first_errors) s.summary += "\n  skipped: " + e;
  return out;
}

}  // namespace

TrainData build_train_data(const DataConfig& cfg, const TextCodec& codec, uint64_t seed) {
  LOOM_CHECK(!cfg.sources.empty(), "config key 'data.path' is required");
  if (cfg.sources.size() == 1) {
    TrainData out = build_source(cfg, cfg.sources[0], cfg.valid_path, codec, seed);
    out.sources[0].share = 1.0;
    out.summary = out.sources[0].summary;
    return out;
  }
  // A mixture: each file on its own (its own validation split), blended by weight.
  TrainData out;
  std::vector<std::unique_ptr<data::Dataset>> train, valid;
  std::vector<double> weights, valid_weights;
  double total = 0;
  for (const DataSource& src : cfg.sources) total += src.weight;
  std::ostringstream sum;
  sum << "mixture of " << cfg.sources.size() << " datasets, sampled by weight:";
  for (size_t i = 0; i < cfg.sources.size(); ++i) {
    const DataSource& src = cfg.sources[i];
    TrainData d = build_source(cfg, src, "", codec, seed);
    SourceStats s = d.sources.at(0);
    s.share = src.weight / total;
    char share[32];
    std::snprintf(share, sizeof share, "%.1f%%", 100.0 * s.share);
    sum << "\n  [" << i << "] weight " << src.weight << ", share " << share << ", " << s.summary;
    out.sources.push_back(s);
    train.push_back(std::move(d.train));
    weights.push_back(src.weight);
    if (d.valid) {
      valid_weights.push_back(static_cast<double>(d.valid->size()));
      valid.push_back(std::move(d.valid));
    }
  }
  out.train = std::make_unique<data::MixtureDataset>(std::move(train), weights);
  if (!cfg.valid_path.empty()) {
    DataConfig vc = cfg;
    vc.valid_fraction = 0.0;
    TrainData v = build_source(vc, {cfg.valid_path, cfg.format, 1.0}, "", codec, seed);
    out.valid = std::move(v.train);
    sum << "\n  validation " << v.sources.at(0).summary;
  } else if (!valid.empty()) {  // every held-out row of every dataset, one after another
    out.valid = std::make_unique<data::MixtureDataset>(std::move(valid), valid_weights);
  }
  out.summary = sum.str();
  return out;
}

}  // namespace loom::train
