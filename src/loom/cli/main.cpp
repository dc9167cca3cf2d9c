// The `loom` program. Subcommands:
//   loom train CONFIG.json [--set key.path=value ...]
//   loom sample --model DIR [--prompt TEXT] [--tokens N] [--temperature F] [--top-k K] [--seed S]
//   loom forward --model DIR (--ids 1,2,3 | --text TEXT) --out FILE.safetensors
// Errors print one line naming the file/key/tensor and exit 1; usage errors exit 2.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/io/hf_checkpoint.h"
#include "loom/io/model_loader.h"
#include "loom/io/safetensors.h"
#include "loom/models/generate.h"
#include "loom/train/config.h"
#include "loom/train/trainer.h"
#include "loom/util/error.h"

namespace {

constexpr const char* kUsage =
    "usage:\n"
    "  loom train CONFIG.json [--set key.path=value ...]\n"
    "  loom sample --model DIR [--prompt TEXT] [--tokens N] [--temperature F] [--top-k K] "
    "[--seed S]\n"
    "  loom forward --model DIR (--ids 1,2,3 | --text TEXT) --out FILE.safetensors\n";

struct UsageError : loom::Error {
  using loom::Error::Error;
};

// --flag value pairs after the subcommand; positional arguments kept in order.
struct Args {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> flags;

  static Args parse(int argc, char** argv, int first) {
    Args a;
    for (int i = first; i < argc; ++i) {
      std::string s = argv[i];
      if (s.rfind("--", 0) == 0) {
        if (i + 1 >= argc) throw UsageError("missing value after " + s);
        a.flags.emplace_back(s, argv[++i]);
      } else {
        a.positional.push_back(s);
      }
    }
    return a;
  }
  const std::string* get(const std::string& name) const {
    const std::string* v = nullptr;
    for (auto& [k, val] : flags)
      if (k == name) v = &val;
    return v;
  }
  void only(std::initializer_list<const char*> allowed) const {
    for (auto& [k, v] : flags) {
      bool ok = false;
      for (const char* a : allowed) ok |= k == a;
      if (!ok) throw UsageError("unknown option " + k);
    }
  }
};

int64_t to_int(const std::string& s, const char* what) {
  try {
    size_t pos;
    long long v = std::stoll(s, &pos);
    if (pos == s.size()) return v;
  } catch (...) {
  }
  throw UsageError(std::string(what) + ": '" + s + "' is not an integer");
}

std::vector<int32_t> bytes_of(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

int cmd_train(const Args& a) {
  a.only({"--set"});
  if (a.positional.size() != 1) throw UsageError("train takes one CONFIG.json");
  std::vector<std::string> sets;
  for (auto& [k, v] : a.flags) sets.push_back(v);
  loom::train::TrainConfig cfg = loom::train::load_config(a.positional[0], sets, /*world=*/1);
  loom::train::Trainer trainer(cfg);
  trainer.run();
  return 0;
}

int cmd_sample(const Args& a) {
  a.only({"--model", "--prompt", "--tokens", "--temperature", "--top-k", "--seed"});
  const std::string* dir = a.get("--model");
  if (!dir) throw UsageError("sample needs --model DIR");
  auto model = loom::io::load_model(*dir);
  loom::models::SampleOptions opt;
  if (auto v = a.get("--tokens")) opt.max_new_tokens = to_int(*v, "--tokens");
  if (auto v = a.get("--top-k")) opt.top_k = to_int(*v, "--top-k");
  if (auto v = a.get("--seed")) opt.seed = to_int(*v, "--seed");
  if (auto v = a.get("--temperature")) opt.temperature = std::stof(*v);
  const std::string prompt = a.get("--prompt") ? *a.get("--prompt") : std::string("The ");
  std::vector<int32_t> out = loom::models::generate(*model, bytes_of(prompt), opt);
  std::string text = prompt;
  for (int32_t t : out) text.push_back(static_cast<char>(t));
  std::printf("%s\n", text.c_str());
  return 0;
}

int cmd_forward(const Args& a) {
  a.only({"--model", "--ids", "--text", "--out"});
  const std::string* dir = a.get("--model");
  const std::string* out = a.get("--out");
  if (!dir || !out) throw UsageError("forward needs --model DIR and --out FILE");
  std::vector<int32_t> ids;
  if (auto v = a.get("--ids")) {
    size_t start = 0;
    while (start <= v->size()) {
      size_t comma = v->find(',', start);
      ids.push_back(static_cast<int32_t>(to_int(v->substr(start, comma - start), "--ids")));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else if (auto t = a.get("--text")) {
    ids = bytes_of(*t);
  } else {
    throw UsageError("forward needs --ids or --text");
  }
  auto model = loom::io::load_model(*dir);
  const int64_t T = static_cast<int64_t>(ids.size());
  loom::Tensor x = loom::Tensor::zeros({1, T}, loom::DType::I32);
  std::copy(ids.begin(), ids.end(), x.i32());
  const loom::Tensor& logits = model->forward(x);
  std::vector<int64_t> ids64(ids.begin(), ids.end());
  std::vector<loom::io::StWriteTensor> ts = {
      {"input_ids", loom::io::StDType::I64, {1, T}, ids64.data(), ids64.size() * 8},
      {"logits", loom::io::StDType::F32, logits.shape(), logits.raw(), logits.nbytes()}};
  loom::io::write_safetensors(*out, ts);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    Args a = Args::parse(argc, argv, 2);
    if (cmd == "train") return cmd_train(a);
    if (cmd == "sample") return cmd_sample(a);
    if (cmd == "forward") return cmd_forward(a);
    throw UsageError("unknown command '" + cmd + "'");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "loom: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: error: %s\n", e.what());
    return 1;
  }
}
