#include "loom/io/hf_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "loom/io/gguf.h"
#include "loom/io/hf_tokenizer_writer.h"
#include "loom/io/safetensors.h"
#include "loom/io/tokenizer_loader.h"
#include "loom/kernels/cpu/bf16.h"
#include "loom/models/registry.h"
#include "loom/nn/weight_ops.h"
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
  } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range: a number too large
    throw Error(path.string() + ": malformed JSON: " + e.what());
  }
}

std::unique_ptr<models::CausalLM> load_hf_model(const fs::path& dir, const LoadOptions& opt) {
  LOOM_CHECK(fs::is_directory(dir), dir.string() +
                                        ": not a model folder (expected config.json "
                                        "and model.safetensors inside)");
  auto model = models::make_model(read_json_file(dir / "config.json"),
                                  (dir / "config.json").string(), opt.tp, opt.stage);
  load_hf_weights(*model, dir, opt);
  return model;
}

namespace {
// p's local values (its shard of the full tensor, in our layout) from the checkpoint's
// tensor `key`, into dst.
void read_values(const SafetensorsCheckpoint& ck, const std::string& key,
                 const models::CausalLM& model, const nn::Parameter& p, float* dst) {
  const bool transposed = model.hf_transposed(p);
  if (!transposed && !p.shard.sharded()) return ck.read_f32(key, p.shape, dst);
  // The full tensor, in our layout, then this rank's slice of it.
  const Shape& full = p.full_shape;
  std::vector<float> tmp(shape_numel(full));
  if (transposed) {
    const int64_t rows = full[0], cols = full[1];  // ours [out, in]; HF [in, out]
    std::vector<float> hf(tmp.size());
    const int64_t hf_shape[2] = {cols, rows};
    ck.read_f32(key, hf_shape, hf.data());
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t o = 0; o < rows; ++o) tmp[o * cols + i] = hf[i * rows + o];
  } else {
    ck.read_f32(key, full, tmp.data());
  }
  if (p.shard.sharded())
    nn::shard_from_full(p, tmp.data(), dst);
  else
    std::copy(tmp.begin(), tmp.end(), dst);
}
}  // namespace

void read_param(const SafetensorsCheckpoint& ck, const std::string& key,
                const models::CausalLM& model, nn::Parameter& p,
                std::optional<kernels::Half> half) {
  if (!half) return read_values(ck, key, model, p, p.value.f32());
  std::vector<float> v(shape_numel(p.shape));
  read_values(ck, key, model, p, v.data());
  nn::hold_in_half(p, v.data(), *half);
}

void load_hf_weights(models::CausalLM& model, const fs::path& file_or_dir, const LoadOptions& opt) {
  SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(file_or_dir);
  std::vector<std::string> used;
  bool relaid = false;
  for (auto& p : model.params().all()) {
    // save_pretrained of *LMHeadModel prefixes "transformer."; hub GPT-2 files do not.
    std::string name = p->name;
    if (!ck.find(name) && name.rfind("transformer.", 0) == 0) name = name.substr(12);
    LOOM_CHECK(ck.find(name),
               file_or_dir.string() + ": tensor '" + p->name + "' is missing from the checkpoint");
    used.push_back(name);
    const std::optional<kernels::Half> half = opt.half_for(*p);
    read_param(ck, name, model, *p, half);
    relaid |= half.has_value();
  }
  // Without f32 slots for the 16-bit matrices (never written, so never resident).
  if (relaid) model.params().materialize();
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

void write_folder_atomically(const fs::path& dir,
                             const std::function<void(const fs::path&)>& fill) {
  const fs::path tmp_dir = dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  try {
    fill(tmp_dir);
    if (fs::exists(dir)) fs::remove_all(dir);
    fs::rename(tmp_dir, dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    throw;
  }
}

namespace {

template <class Json>
void write_json(const fs::path& path, const Json& j) {
  std::string text;
  try {
    text = j.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {  // type_error 316: invalid UTF-8
    throw Error(path.string() + ": cannot write JSON: " + e.what());
  }
  std::ofstream out(path);
  out << text;
  out.close();  // a full disk shows when the buffer is written out
  LOOM_CHECK(!out.fail(), path.string() + ": write failed: " + std::strerror(errno));
}

}  // namespace

void write_json_file(const fs::path& path, const nlohmann::json& j) { write_json(path, j); }
void write_json_file(const fs::path& path, const nlohmann::ordered_json& j) { write_json(path, j); }

void write_tokenizer_files(const fs::path& dir, const fs::path& tokenizer_from) {
  if (tokenizer_from.empty()) return;
  if (const fs::path gguf = gguf_tokenizer_source(tokenizer_from); !gguf.empty()) {
    // A GGUF without a vocabulary (a run with data.tokenizer "bytes") has none to write, as
    // a folder without tokenizer.json.
    if (GgufFile::open(gguf).get_string_or("tokenizer.ggml.model", "").empty()) return;
    const GgufTokenizer t = read_gguf_tokenizer(gguf);
    write_hf_tokenizer(dir, t.spec, t.chat_template);
    return;
  }
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    if (fs::exists(tokenizer_from / f)) fs::copy_file(tokenizer_from / f, dir / f);
}

namespace {

void check_export_dtype(StDType dtype) {
  LOOM_CHECK(dtype == StDType::F32 || dtype == StDType::BF16,
             std::string("weights can be written as F32 or BF16, not ") + st_dtype_name(dtype));
}

}  // namespace

void save_hf_checkpoint(models::CausalLM& model, const fs::path& dir,
                        const fs::path& tokenizer_from, StDType dtype) {
  check_export_dtype(dtype);
  write_folder_atomically(dir, [&](const fs::path& tmp) {
    write_hf_config(model, tmp, tokenizer_from, dtype);
    write_hf_weights(model, tmp / hf_weights_file(0, 1), dtype);
  });
}

void write_hf_config(models::CausalLM& model, const fs::path& dir, const fs::path& tokenizer_from,
                     StDType dtype) {
  check_export_dtype(dtype);
  nlohmann::json j = model.hf_config();
  j["torch_dtype"] = dtype == StDType::BF16 ? "bfloat16" : "float32";
  write_json_file(dir / "config.json", j);
  write_tokenizer_files(dir, tokenizer_from);
}

std::string hf_weights_file(int part, int parts) {
  if (parts == 1) return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", part + 1, parts);
  return name;
}

void write_hf_index(const fs::path& dir, int parts) {
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (int s = 0; s < parts; ++s) {
    const std::string file = hf_weights_file(s, parts);
    const SafetensorsFile f = SafetensorsFile::open(dir / file);
    for (const auto& t : f.tensors()) {
      LOOM_CHECK(!map.contains(t.name),
                 (dir / file).string() + ": tensor '" + t.name + "' is in another part too");
      map[t.name] = file;
      total += static_cast<int64_t>(t.data.size());
    }
  }
  write_json_file(
      dir / "model.safetensors.index.json",
      nlohmann::ordered_json{{"metadata", {{"total_size", total}}}, {"weight_map", map}});
}

void write_hf_weights(models::CausalLM& model, const fs::path& file, StDType dtype,
                      bool experts_only) {
  check_export_dtype(dtype);
  // LoRA branches merge into the weight they sit on; other PEFT parameters have no place in
  // the base architecture.
  std::map<const nn::Parameter*, const nn::LoRA*> lora_of;
  for (nn::Linear* l : model.linears())
    if (l->lora()) lora_of[l->weight()] = l->lora();
  for (auto& p : model.params().all()) {
    const bool lora_param =
        p->name.ends_with(".lora_A.weight") || p->name.ends_with(".lora_B.weight");
    LOOM_CHECK(!p->adapter || lora_param,
               file.parent_path().string() + ": " + p->name +
                   " belongs to a bottleneck adapter or prefix, which cannot be merged into the "
                   "base weights (save the adapter folder instead)");
  }
  // HF layout, f32: views of our buffers where nothing changes; copies where a weight is
  // dequantized, has LoRA merged in, or is a transposed Conv1D weight.
  std::vector<std::vector<float>> copies;
  std::vector<StWriteTensor> tensors;
  for (auto& p : model.params().all()) {
    if (p->adapter || p->stage_copy || (experts_only && !p->expert)) continue;
    LOOM_CHECK(p->shape == p->full_shape,
               "internal: " + p->name + " is a tensor-parallel shard; gather it before saving");
    StWriteTensor t;
    t.name = p->name;
    t.dtype = StDType::F32;
    t.nbytes = shape_numel(p->shape) * sizeof(float);
    t.shape = p->shape;
    t.data = p->has_f32() ? p->value.raw() : nullptr;
    auto lora = lora_of.find(p.get());
    const bool transposed = model.hf_transposed(*p);
    if (!p->has_f32() || lora != lora_of.end() || transposed) {
      auto& buf = copies.emplace_back(shape_numel(p->shape));
      if (p->quantized())
        p->quant->dequantize_rows(0, p->quant->rows, buf.data());
      else if (p->held_in_half())
        kernels::from_half(p->half->format, static_cast<const uint16_t*>(p->half->data.raw()),
                           buf.data(), static_cast<int64_t>(buf.size()));
      else
        std::copy_n(p->value.f32(), buf.size(), buf.begin());
      if (lora != lora_of.end()) lora->second->merge_into(buf.data());
      if (transposed) {
        const int64_t rows = p->shape[0], cols = p->shape[1];
        std::vector<float> tr(buf.size());
        for (int64_t o = 0; o < rows; ++o)
          for (int64_t i = 0; i < cols; ++i) tr[i * rows + o] = buf[o * cols + i];
        buf.swap(tr);
        t.shape = {cols, rows};
      }
      t.data = buf.data();
    }
    tensors.push_back(std::move(t));
  }
  // BF16: every tensor rounded from the f32 values above (kernels/cpu/bf16.h).
  std::vector<std::vector<kernels::bf16>> halves;
  if (dtype == StDType::BF16) {
    for (StWriteTensor& t : tensors) {
      const int64_t n = shape_numel(t.shape);
      auto& h = halves.emplace_back(n);
      kernels::to_bf16(static_cast<const float*>(t.data), h.data(), n);
      t.dtype = StDType::BF16;
      t.data = h.data();
      t.nbytes = static_cast<size_t>(n) * sizeof(kernels::bf16);
    }
  }
  write_safetensors(file, tensors, {{"format", "pt"}});
}

}  // namespace loom::io
