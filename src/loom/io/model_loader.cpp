#include "loom/io/model_loader.h"

#include <cstdio>
#include <set>

#include "loom/io/gguf.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/peft_adapter.h"
#include "loom/models/peft.h"
#include "loom/models/registry.h"
#include "loom/nn/weight_ops.h"
#include "loom/util/error.h"
#include "loom/util/path.h"

namespace loom::io {

namespace fs = std::filesystem;

bool is_gguf(const fs::path& p) { return p.extension() == ".gguf"; }

bool LoadOptions::keeps_f32(const std::string& hf_name) const {
  const std::string module = hf_name.substr(0, hf_name.rfind('.'));
  for (const std::string& m : keep_f32_modules)
    if (models::peft_name_matches(module, m)) return true;
  return false;
}

std::optional<kernels::Half> LoadOptions::half_for(const nn::Parameter& p) const {
  if (!half || !nn::takes_half(p) || keeps_f32(p.name)) return std::nullopt;
  return half;
}

namespace {

// This rank's shard of a quantized [rows, cols] weight, still in its blocks: whole rows
// (column-parallel) or, per row, a run of whole blocks (row-parallel).
QuantMatrix shard_of(const QuantMatrix& q, const nn::Parameter& p, const fs::path& file) {
  if (!p.shard.sharded()) return q;
  const nn::ShardSpec& s = p.shard;
  const int64_t bs = ggml_block_size(q.type), tb = ggml_type_size(q.type);
  if (s.dim == 0) {
    QuantMatrix out = QuantMatrix::empty(q.type, s.parts * s.size, q.cols);
    const int64_t block_rows = q.rows / s.parts, rb = static_cast<int64_t>(q.row_bytes());
    for (int part = 0; part < s.parts; ++part)
      std::copy_n(q.bytes.data() + (part * block_rows + s.offset) * rb, s.size * rb,
                  out.bytes.data() + part * s.size * rb);
    return out;
  }
  LOOM_CHECK(s.offset % bs == 0 && s.size % bs == 0,
             file.string() + ": " + p.name + " is kept in " + ggml_type_name(q.type) +
                 " blocks of " + std::to_string(bs) + " columns, which its tensor-parallel " +
                 "slice (columns " + std::to_string(s.offset) + "+" + std::to_string(s.size) +
                 ") does not split on; use another tensor_parallel.size or keep_quantized false");
  QuantMatrix out = QuantMatrix::empty(q.type, q.rows, s.size);
  const int64_t first = s.offset / bs * tb, n = s.size / bs * tb;
  for (int64_t r = 0; r < q.rows; ++r)
    std::copy_n(q.bytes.data() + r * q.row_bytes() + first, n,
                out.bytes.data() + r * out.row_bytes());
  return out;
}

}  // namespace

std::unique_ptr<models::CausalLM> load_gguf_model(const fs::path& file, const LoadOptions& opt) {
  GgufFile f = GgufFile::open(file);
  auto model = models::make_model(gguf_hf_config(f), file.string(), opt.tp, opt.stage);
  std::set<std::string> filled;
  std::vector<std::string> unused;
  int64_t n_relaid = 0;  // parameters kept quantized or in 16 bits: no f32 slot
  // p's values (p's local shape) into its f32 slot, or rounded into 16 bits when `h` (p's
  // opt.half_for) is set.
  auto store = [&](nn::Parameter& p, const float* v, std::optional<kernels::Half> h) {
    if (h) {
      nn::hold_in_half(p, v, *h);
      ++n_relaid;
    } else {
      std::copy_n(v, shape_numel(p.shape), p.value.f32());
    }
  };
  // A whole (unsharded) parameter from values in HF layout; tensor parallelism is refused
  // for the architectures whose tensors need this.
  auto fill = [&](const std::string& hf, const std::string& gguf_name, const float* v,
                  const Shape& shape) {
    nn::Parameter* p = model->params().find(hf);
    if (!p) {
      if (!model->hf_ignorable(hf)) unused.push_back(gguf_name);
      return;
    }
    LOOM_CHECK(shape == p->full_shape && !p->shard.sharded(),
               file.string() + ": tensor '" + gguf_name + "' gives " + hf + " shape " +
                   shape_str(shape) + " vs expected " + shape_str(p->full_shape));
    store(*p, v, opt.half_for(*p));
    filled.insert(hf);
  };
  for (const GgufTensorInfo& t : f.tensors()) {
    // deepseek2: stacked routed experts [E, out, in], each expert's rows [e out, (e+1) out)
    // one HF matrix; only the experts this rank holds (expert parallelism) are read, kept in
    // their ggml blocks with keep_quantized.
    if (const std::vector<std::string> slices = gguf_stacked_hf_names(t); !slices.empty()) {
      const int64_t rows = t.ne[1];
      std::vector<float> one(static_cast<size_t>(rows * t.ne[0]));
      for (size_t e = 0; e < slices.size(); ++e) {
        nn::Parameter* p = model->params().find(slices[e]);
        const int64_t r0 = static_cast<int64_t>(e) * rows;
        if (p && opt.keep_quantized && t.type != GgmlType::F32 && !opt.keeps_f32(slices[e])) {
          LOOM_CHECK(p->full_shape == (Shape{rows, t.ne[0]}) && !p->shard.sharded(),
                     file.string() + ": tensor '" + t.name + "' gives " + slices[e] + " shape " +
                         shape_str({rows, t.ne[0]}) + " vs expected " + shape_str(p->full_shape));
          p->quant = std::make_shared<const QuantMatrix>(read_quant_rows(f, t, r0, r0 + rows));
          p->trainable = false;
          ++n_relaid;
          filled.insert(slices[e]);
          continue;
        }
        if (p) dequantize_rows(t, r0, r0 + rows, one.data());
        fill(slices[e], t.name, one.data(), {rows, t.ne[0]});
      }
      continue;
    }
    if (std::vector<float> kv; t.name.ends_with(".attn_k_b.weight")) {
      const std::string hf = read_split_kv_b(f, t, &kv);
      const int64_t R = t.ne[1];
      // Files that keep attn_kv_b as well: that one is read by name below.
      if (!hf.empty() && !f.find_tensor(t.name.substr(0, t.name.size() - 15) + "attn_kv_b.weight"))
        fill(hf, t.name, kv.data(), {static_cast<int64_t>(kv.size()) / R, R});
      continue;
    }
    if (t.name.ends_with(".attn_v_b.weight")) continue;  // read with attn_k_b
    const std::string hf = gguf_to_hf_name(t.name);
    nn::Parameter* p = hf.empty() ? nullptr : model->params().find(hf);
    if (!p) {
      if (hf.empty() || !model->hf_ignorable(hf)) unused.push_back(t.name);
      continue;
    }
    LOOM_CHECK(t.hf_shape() == p->full_shape, file.string() + ": tensor '" + t.name + "' (" + hf +
                                                  ") has shape " + shape_str(t.hf_shape()) +
                                                  " vs expected " + shape_str(p->full_shape));
    const std::optional<kernels::Half> half = opt.half_for(*p);
    if (opt.keep_quantized && t.ne.size() == 2 && t.type != GgmlType::F32 && !opt.keeps_f32(hf)) {
      p->quant = std::make_shared<const QuantMatrix>(shard_of(read_hf_quant(f, t), *p, file));
      p->trainable = false;
      ++n_relaid;
    } else if (!p->shard.sharded() && !half) {
      read_hf_tensor(f, t, p->value.f32());  // straight into its slot
    } else {
      std::vector<float> v(shape_numel(p->full_shape));
      read_hf_tensor(f, t, v.data());
      if (p->shard.sharded()) {  // this rank's slice
        std::vector<float> mine(shape_numel(p->shape));
        nn::shard_from_full(*p, v.data(), mine.data());
        v.swap(mine);
      }
      store(*p, v.data(), half);
    }
    filled.insert(hf);
  }
  // Lay the store out again without f32 slots for the quantized and 16-bit weights (their
  // pages in the first layout were never written, so they never became resident).
  if (n_relaid > 0) model->params().materialize();
  for (auto& p : model->params().all())
    LOOM_CHECK(filled.count(p->name), file.string() + ": no tensor for '" + p->name + "'");
  if (!unused.empty())
    std::fprintf(stderr, "note: %s: %zu tensor(s) not used (first: %s)\n", file.string().c_str(),
                 unused.size(), unused[0].c_str());
  return model;
}

nlohmann::json read_model_config(const fs::path& path, const fs::path& base) {
  const fs::path p = expand_user(path);
  if (is_adapter_folder(p)) {
    fs::path b = base.empty() ? expand_user(read_adapter_config(p).base) : base;
    if (b.is_relative() && !fs::exists(b) && fs::exists(p / b)) b = p / b;  // as load_adapter_model
    return read_model_config(b);
  }
  if (is_gguf(p)) return gguf_hf_config(GgufFile::open(p));
  LOOM_CHECK(fs::is_directory(p), p.string() +
                                      ": not a model folder (expected config.json "
                                      "and model.safetensors inside)");
  return read_json_file(p / "config.json");
}

std::unique_ptr<models::CausalLM> load_model(const fs::path& path, const LoadOptions& opt) {
  const fs::path p = expand_user(path);
  if (is_adapter_folder(p)) return load_adapter_model(p, opt);
  if (is_gguf(p)) return load_gguf_model(p, opt);
  return load_hf_model(p, opt);
}

}  // namespace loom::io
