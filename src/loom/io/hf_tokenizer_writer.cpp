#include "loom/io/hf_tokenizer_writer.h"

#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "loom/io/hf_checkpoint.h"
#include "loom/util/error.h"

namespace loom::io {

namespace fs = std::filesystem;
// Ordered: keys in the order HF writes them, and the vocabulary in id order, so the files read
// like the ones transformers saves.
using ojson = nlohmann::ordered_json;

namespace {

ojson byte_level(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}

ojson pre_tokenizer(data::PreTokenizer kind) {
  switch (kind) {
    case data::PreTokenizer::GPT2:
      return byte_level(true);
    case data::PreTokenizer::SMOLLM:
      return {
          {"type", "Sequence"},
          {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}};
    case data::PreTokenizer::LLAMA3:
    case data::PreTokenizer::QWEN2:
      break;
  }
  const ojson split = {{"type", "Split"},
                       {"pattern", {{"Regex", data::pretokenizer_regex(kind)}}},
                       {"behavior", "Isolated"},
                       {"invert", false}};
  return {{"type", "Sequence"}, {"pretokenizers", {split, byte_level(false)}}};
}

// TemplateProcessing with BOS before each sequence (HF's encode with add_special_tokens);
// otherwise ByteLevel, which only adjusts offsets.
ojson post_processor(const data::TokenizerSpec& s) {
  const ojson byte_level_pp = {{"type", "ByteLevel"},
                               {"add_prefix_space", true},
                               {"trim_offsets", false},
                               {"use_regex", true}};
  if (!s.add_bos) return byte_level_pp;
  const std::string& bos = s.tokens[s.bos_id];
  auto special = [&](int type_id) {
    return ojson{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}};
  };
  auto seq = [](const char* id, int type_id) {
    return ojson{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  const ojson tp = {
      {"type", "TemplateProcessing"},
      {"single", {special(0), seq("A", 0)}},
      {"pair", {special(0), seq("A", 0), special(1), seq("B", 1)}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {s.bos_id}}, {"tokens", {bos}}}}}}};
  return {{"type", "Sequence"}, {"processors", {byte_level_pp, tp}}};
}

ojson tokenizer_json(const data::TokenizerSpec& s) {
  const auto V = static_cast<int32_t>(s.tokens.size());
  ojson vocab = ojson::object();
  // ordered_map looks keys up linearly (quadratic over a vocabulary); the uniqueness check
  // is done here, so tokens are appended to its underlying vector directly.
  auto& entries = static_cast<std::vector<std::pair<const std::string, ojson>>&>(
      vocab.get_ref<ojson::object_t&>());
  entries.reserve(V);
  std::unordered_map<std::string_view, int32_t> first_id;
  for (int32_t id = 0; id < V; ++id) {
    auto [it, fresh] = first_id.emplace(s.tokens[id], id);
    LOOM_CHECK(fresh, s.source + ": token '" + s.tokens[id] + "' is at ids " +
                          std::to_string(it->second) + " and " + std::to_string(id) +
                          "; a tokenizer.json vocabulary cannot hold both");
    entries.emplace_back(s.tokens[id], id);
  }
  ojson merges = ojson::array();
  for (const std::string& m : s.merges) {
    // As from_vocab splits them: at the first space after the first character.
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    LOOM_CHECK(sp != std::string::npos && sp + 1 < m.size(),
               s.source + ": merge '" + m + "' is not two tokens separated by a space");
    merges.push_back({m.substr(0, sp), m.substr(sp + 1)});
  }
  // Every added token is non-normalized, as from_vocab's: with no normalizer that only
  // decides HF's matching order (non-normalized tokens first), which must be one pass here.
  ojson added = ojson::array();
  for (int32_t id = 0; id < static_cast<int32_t>(s.token_types.size()); ++id) {
    const int32_t t = s.token_types[id];
    if (t != data::kTokenControl && t != data::kTokenUnknown && t != data::kTokenUserDefined)
      continue;
    added.push_back({{"id", id},
                     {"content", s.tokens[id]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", t != data::kTokenUserDefined}});
  }
  const bool ignore_merges =
      s.ignore_merges.value_or(s.pre_tokenizer == data::PreTokenizer::LLAMA3);
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added)},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer(s.pre_tokenizer)},
          {"post_processor", post_processor(s)},
          {"decoder", byte_level(true)},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", ignore_merges},
            {"vocab", std::move(vocab)},
            {"merges", std::move(merges)}}}};
}

ojson tokenizer_config(const data::TokenizerSpec& s, const std::string& chat_template) {
  auto token = [&](int32_t id) -> ojson { return id < 0 ? ojson(nullptr) : ojson(s.tokens[id]); };
  ojson c = {{"add_bos_token", s.add_bos},
             {"add_eos_token", false},
             {"bos_token", token(s.bos_id)},
             {"eos_token", token(s.eos_id)},
             {"pad_token", token(s.pad_id)},
             {"clean_up_tokenization_spaces", false},
             // The generic class: it takes tokenizer.json as written, where a model-specific
             // class might rebuild the pipeline from the vocabulary its own way.
             {"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (!chat_template.empty()) c["chat_template"] = chat_template;
  return c;
}

}  // namespace

void write_hf_tokenizer(const fs::path& dir, const data::TokenizerSpec& spec,
                        const std::string& chat_template) {
  LOOM_CHECK(!spec.tokens.empty(), spec.source + ": the token list is empty");
  LOOM_CHECK(spec.token_types.empty() || spec.token_types.size() == spec.tokens.size(),
             spec.source + ": " + std::to_string(spec.token_types.size()) + " token types for " +
                 std::to_string(spec.tokens.size()) + " tokens");
  for (const int32_t id : {spec.bos_id, spec.eos_id, spec.pad_id})
    LOOM_CHECK(
        id >= -1 && id < static_cast<int32_t>(spec.tokens.size()),
        spec.source + ": special token id " + std::to_string(id) + " is outside the vocabulary");
  LOOM_CHECK(!spec.add_bos || spec.bos_id >= 0,
             spec.source + ": add_bos is set but there is no bos id");
  write_json_file(dir / "tokenizer.json", tokenizer_json(spec));
  write_json_file(dir / "tokenizer_config.json", tokenizer_config(spec, chat_template));
}

}  // namespace loom::io
