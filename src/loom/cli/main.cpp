// The `loom` program. Subcommands:
//   loom train CONFIG.json [--set key.path=value ...] [--trace FILE]   (under mpirun: a rank)
//   loom launch -n N [--hostfile F] -- train CONFIG.json ...   (runs mpirun for you)
//   loom plan CONFIG.json --world N [--memory-per-rank GIB]   (memory per rank and stage;
//                                                    the layouts that fit, fastest first)
//   loom launch -n N -- verify CONFIG.json [--steps K] [--rtol R] [--trace FILE]
//     (N ranks == one process?)
//   loom generate --model PATH --prompt TEXT [--chat 1] [sampling flags]
//   loom chat --model PATH [sampling flags]          (interactive; keeps the conversation)
//   loom forward --model DIR (--ids 1,2,3 | --text TEXT) --out FILE.safetensors
//   loom export --model PATH [--merge] --out DIR [--dtype fp32|bf16]   (an HF folder; LoRA merged
//   in)
// --model may be a PEFT adapter folder (its base from base_model_name_or_path, or --base).
// Errors print one line naming the file/key/tensor and exit 1; usage errors exit 2.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "loom/dist/communicator.h"
#include "loom/dist/launch.h"
#include "loom/dist/mesh.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/model_loader.h"
#include "loom/io/peft_adapter.h"
#include "loom/io/safetensors.h"
#include "loom/io/tokenizer_loader.h"
#include "loom/models/generate.h"
#include "loom/nn/weight_ops.h"
#include "loom/train/chat_session.h"
#include "loom/train/config.h"
#include "loom/train/data_report.h"
#include "loom/train/plan.h"
#include "loom/train/report.h"
#include "loom/train/trainer.h"
#include "loom/train/verify.h"
#include "loom/util/error.h"
#include "loom/util/path.h"
#include "loom/util/stop_signals.h"

namespace {

constexpr const char* kUsage =
    "usage:\n"
    "  loom train CONFIG.json [--set key.path=value ...] [--trace FILE]\n"
    "     (--trace: every rank's passes and communication as one Chrome trace, for Perfetto)\n"
    "  loom launch -n N [--hostfile FILE] -- train CONFIG.json ...   (N ranks via mpirun)\n"
    "  loom data CONFIG.json [--samples K] [--set ...]   (what the run would train on, per\n"
    "     file: records, rows, tokens, truncated/dropped, loss share, K rows with the loss\n"
    "     marked; no training)\n"
    "  loom plan CONFIG.json --world N [--set ...]   (memory per rank: ZeRO stages 0-3,\n"
    "     pipeline stages)\n"
    "  loom plan CONFIG.json --world N --memory-per-rank GIB   (the layouts that fit, fastest\n"
    "     first by estimated step time)\n"
    "  loom launch -n N -- verify CONFIG.json [--steps K] [--rtol R] [--set ...] [--trace FILE]\n"
    "     (trains K steps on N ranks and on one process; exit 1 when they differ)\n"
    "  loom generate --model PATH --prompt TEXT [--chat 1] [--system S] [sampling]\n"
    "  loom chat --model PATH [--system S] [sampling]\n"
    "     PATH: an HF folder, a loom checkpoint or a .gguf file; sampling: --max-tokens N\n"
    "     --temperature F (0: greedy) --top-k K --top-p P --seed S --tokenizer auto|bytes|model\n"
    "     --dtype fp32|bf16|fp16 (matrices held and multiplied in 16 bits; fp32 default)\n"
    "     a PEFT adapter folder as PATH loads its base model too (or --base BASE)\n"
    "  loom report RUN_DIR [RUN_DIR ...] [--out FILE.html]   (one HTML page: loss, eval loss,\n"
    "     lr, gradient norm, tokens/s, memory per rank, config; several runs overlaid;\n"
    "     default FILE: the first RUN_DIR/report.html)\n"
    "  loom forward --model PATH (--ids 1,2,3 | --text TEXT) --out FILE.safetensors\n"
    "  loom export --model PATH [--base BASE] --merge --out DIR [--dtype fp32|bf16]   (HF folder,\n"
    "      adapter merged; weights stored fp32 or bf16)\n";

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
      if (s == "--merge") {  // the one switch that takes no value
        a.flags.emplace_back(s, "1");
      } else if (s.rfind("--", 0) == 0) {
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
  void only(const std::vector<const char*>& allowed) const {
    for (const auto& flag : flags) {
      bool ok = false;
      for (const char* a : allowed) ok |= flag.first == a;
      if (!ok) throw UsageError("unknown option " + flag.first);
    }
  }
};

float to_float(const std::string& s, const char* what) {
  try {
    size_t pos;
    float v = std::stof(s, &pos);
    if (pos == s.size()) return v;
  } catch (...) {
  }
  throw UsageError(std::string(what) + ": '" + s + "' is not a number");
}

int64_t to_int(const std::string& s, const char* what) {
  try {
    size_t pos;
    long long v = std::stoll(s, &pos);
    if (pos == s.size()) return v;
  } catch (...) {
  }
  throw UsageError(std::string(what) + ": '" + s + "' is not an integer");
}

// Runs fn(world) as this process's part of the job (mpirun -np N loom ..., or loom launch).
// A rank that fails ends the whole job (MPI_Abort) after saying which rank and why, so no
// other rank waits in a collective.
template <class Fn>
int on_every_rank(Fn&& fn) {
  std::unique_ptr<loom::dist::Communicator> world = loom::dist::make_world_communicator();
  try {
    return fn(*world);
  } catch (const std::exception& e) {
    if (world->size() == 1) throw;
    std::fprintf(stderr, "loom: rank %d of %d: error: %s\n", world->rank(), world->size(),
                 e.what());
    std::fflush(stderr);
    world->abort(1);
  }
  return 1;  // not reached: abort() ends the job
}

// loom train: every rank builds its part of the model (its tensor-parallel shards) and
// trains its data-parallel slice of each global batch.
int cmd_train(const Args& a) {
  a.only({"--set", "--trace"});
  if (a.positional.size() != 1) throw UsageError("train takes one CONFIG.json");
  std::vector<std::string> sets;
  for (auto& [k, v] : a.flags)
    if (k == "--set") sets.push_back(v);
  return on_every_rank([&](loom::dist::Communicator& world) {
    loom::train::TrainConfig cfg = loom::train::load_config(a.positional[0], sets, world.size());
    if (a.get("--trace")) cfg.trace_path = *a.get("--trace");
    loom::dist::ProcessMesh mesh(world, cfg.tensor_parallel, cfg.pipeline.size);
    loom::train::Trainer trainer(cfg, nullptr, &mesh);
    trainer.run();
    return trainer.interrupted() ? loom::kExitInterrupted : 0;
  });
}

// loom data CONFIG [--samples K]: the run's data as it would train on it (train/data_report.h).
int cmd_data(const Args& a) {
  a.only({"--set", "--samples"});
  if (a.positional.size() != 1) throw UsageError("data takes one CONFIG.json");
  std::vector<std::string> sets;
  for (auto& [k, v] : a.flags)
    if (k == "--set") sets.push_back(v);
  const int64_t samples = a.get("--samples") ? to_int(*a.get("--samples"), "--samples") : 3;
  if (samples < 0) throw UsageError("--samples must be >= 0");
  const loom::train::TrainConfig cfg = loom::train::load_config(a.positional[0], sets, 1);
  const std::string report = loom::train::describe_data(
      cfg, loom::train::data_codec(cfg.data, cfg.model), static_cast<int>(samples));
  std::fwrite(report.data(), 1, report.size(), stdout);
  return 0;
}

// loom verify CONFIG [--steps K] [--rtol R] [--set ...], under mpirun: the job's layout
// against one process (train/verify.h). Exit 1 when they differ by more than rtol.
int cmd_verify(const Args& a) {
  a.only({"--set", "--steps", "--rtol", "--trace"});
  if (a.positional.size() != 1) throw UsageError("verify takes one CONFIG.json");
  std::vector<std::string> sets;
  for (auto& [k, v] : a.flags)
    if (k == "--set") sets.push_back(v);
  return on_every_rank([&](loom::dist::Communicator& world) {
    loom::train::TrainConfig cfg = loom::train::load_config(a.positional[0], sets, world.size());
    if (a.get("--trace")) cfg.trace_path = *a.get("--trace");
    loom::dist::ProcessMesh mesh(world, cfg.tensor_parallel, cfg.pipeline.size);
    const int64_t steps = a.get("--steps") ? to_int(*a.get("--steps"), "--steps")
                                           : std::min<int64_t>(cfg.train_steps, 10);
    const double rtol = a.get("--rtol") ? to_float(*a.get("--rtol"), "--rtol") : 1e-5;
    const bool equal = loom::train::verify(cfg, mesh, steps, rtol).equal;
    return equal || world.rank() != 0 ? 0 : 1;
  });
}

// loom launch -n N [--hostfile F] -- ARGS: runs `loom ARGS` as N ranks under mpirun.
int cmd_launch(int argc, char** argv) {
  int n = 0;
  std::string hostfile;
  int i = 2;
  for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    const std::string s = argv[i];
    if (i + 1 >= argc) throw UsageError("missing value after " + s);
    if (s == "-n" || s == "--np")
      n = static_cast<int>(to_int(argv[++i], "-n"));
    else if (s == "--hostfile")
      hostfile = argv[++i];
    else
      throw UsageError("unknown launch option " + s);
  }
  if (n < 1 || i >= argc) throw UsageError("launch needs -n N and -- followed by loom's arguments");
  std::vector<std::string> rest(argv + i + 1, argv + argc);
  if (rest.empty()) throw UsageError("launch: nothing to run after --");
  return loom::dist::launch(n, rest, std::filesystem::read_symlink("/proc/self/exe").string(),
                            hostfile);
}

// loom plan CONFIG --world N: bytes per rank for each ZeRO stage (and pipeline stage), from
// the model's shapes alone (no weights read, nothing trained); with --memory-per-rank GIB,
// the layouts of N ranks that fit, fastest first.
int cmd_report(const Args& a) {
  a.only({"--out"});
  if (a.positional.empty()) throw UsageError("report takes one or more run folders");
  std::vector<std::filesystem::path> runs(a.positional.begin(), a.positional.end());
  const std::filesystem::path out =
      a.get("--out") ? std::filesystem::path(*a.get("--out")) : runs[0] / "report.html";
  loom::train::write_report(runs, out);
  std::fprintf(stderr, "loom: wrote %s\n", out.string().c_str());
  return 0;
}

int cmd_plan(const Args& a) {
  a.only({"--world", "--set", "--memory-per-rank"});
  if (a.positional.size() != 1) throw UsageError("plan takes one CONFIG.json");
  const int world = a.get("--world") ? static_cast<int>(to_int(*a.get("--world"), "--world")) : 1;
  if (world < 1) throw UsageError("--world must be at least 1");
  double budget = 0;
  if (const std::string* g = a.get("--memory-per-rank")) {
    if (!a.get("--world"))
      throw UsageError("--memory-per-rank needs --world N (the ranks to lay out)");
    budget = to_float(*g, "--memory-per-rank");
    if (!(budget > 0) || !std::isfinite(budget))
      throw UsageError("--memory-per-rank must be a positive number of GiB, got '" + *g + "'");
  }
  std::vector<std::string> sets;
  for (auto& [k, v] : a.flags)
    if (k == "--set") sets.push_back(v);
  if (budget > 0) {
    const loom::train::TrainConfig cfg = loom::train::search_config(a.positional[0], sets, world);
    std::printf("%s", loom::train::layouts_report(cfg, world, budget).c_str());
  } else {
    const loom::train::TrainConfig cfg = loom::train::load_config(a.positional[0], sets, world);
    std::printf("%s", loom::train::plan_report(cfg, world).c_str());
  }
  return 0;
}

// Sampling flags shared by generate and chat.
loom::models::SampleOptions sample_options(const Args& a) {
  loom::models::SampleOptions opt;
  if (auto v = a.get("--max-tokens")) opt.max_new_tokens = to_int(*v, "--max-tokens");
  if (auto v = a.get("--top-k")) opt.top_k = to_int(*v, "--top-k");
  if (auto v = a.get("--seed")) opt.seed = to_int(*v, "--seed");
  if (auto v = a.get("--temperature")) opt.temperature = to_float(*v, "--temperature");
  if (auto v = a.get("--top-p")) opt.top_p = to_float(*v, "--top-p");
  return opt;
}

// The model's tokenizer, or bytes (--tokenizer bytes, or auto for a byte-vocabulary model
// folder without tokenizer.json).
loom::train::TextCodec codec_for_model(const std::string& path, const loom::models::CausalLM& m,
                                       const Args& a) {
  const std::string mode = a.get("--tokenizer") ? *a.get("--tokenizer") : "auto";
  if (mode != "auto" && mode != "bytes" && mode != "model")
    throw UsageError("--tokenizer must be auto, bytes or model");
  const bool no_tokenizer_file =
      !loom::io::is_gguf(path) &&
      !std::filesystem::exists(std::filesystem::path(path) / "tokenizer.json");
  if (mode == "bytes" || (mode == "auto" && no_tokenizer_file && m.vocab_size() == 256))
    return loom::train::bytes_codec();
  return loom::train::codec_for(loom::io::load_tokenizer(path));
}

constexpr std::initializer_list<const char*> kSampleFlags = {
    "--model", "--base", "--max-tokens", "--temperature", "--top-k",
    "--top-p", "--seed", "--tokenizer",  "--dtype"};

// The model --model names (with --base for an adapter folder whose base moved). With
// --dtype bf16|fp16 (inference only) its matrices are held in that format alone: products
// on 16-bit operands with fp32 accumulation, norms and softmax in fp32, half the memory.
std::unique_ptr<loom::models::CausalLM> load_model(const Args& a) {
  loom::io::LoadOptions opt;
  if (auto b = a.get("--base")) opt.base = loom::expand_user(*b);
  const std::string dtype = a.get("--dtype") ? *a.get("--dtype") : "fp32";
  if (dtype != "fp32" && dtype != "float32" && dtype != "bf16" && dtype != "bfloat16" &&
      dtype != "fp16" && dtype != "float16")
    throw UsageError("--dtype '" + dtype + "' is not one of fp32, bf16, fp16");
  // Each matrix is rounded as it is read: the load's peak is the 16-bit weights, not an
  // f32 model and its 16-bit copy.
  if (!dtype.starts_with("fp3") && dtype != "float32")
    opt.half = dtype.starts_with("b") ? loom::kernels::Half::bf16 : loom::kernels::Half::f16;
  auto model = loom::io::load_model(*a.get("--model"), opt);
  if (!opt.half) return model;
  // An adapter folder's own matrices (a modules_to_save weight) load f32: held in 16 bits
  // too, after the fact.
  for (auto& p : model->params().all()) p->trainable = false;
  loom::nn::hold_frozen_in_half(model->params(), *opt.half);
  return model;
}

int cmd_generate(const Args& a) {
  std::vector<const char*> allowed(kSampleFlags);
  allowed.insert(allowed.end(), {"--prompt", "--chat", "--system"});
  a.only(allowed);
  const std::string* path = a.get("--model");
  const std::string* prompt = a.get("--prompt");
  if (!path || !prompt) throw UsageError("generate needs --model PATH and --prompt TEXT");
  auto model = load_model(a);
  loom::train::TextCodec codec = codec_for_model(*path, *model, a);
  loom::models::SampleOptions opt = sample_options(a);
  const bool chat = a.get("--chat") && *a.get("--chat") != "0" && *a.get("--chat") != "false";
  if (chat) {
    loom::train::ChatSession s(*model, codec, opt, a.get("--system") ? *a.get("--system") : "");
    s.reply(*prompt, [](const std::string& t) {
      std::fputs(t.c_str(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    return 0;
  }
  if (codec.eos_id >= 0) opt.stop_ids.push_back(codec.eos_id);
  std::vector<int32_t> out = loom::models::generate(*model, codec.encode(*prompt), opt);
  if (!out.empty() && codec.eos_id >= 0 && out.back() == codec.eos_id) out.pop_back();
  std::printf("%s%s\n", prompt->c_str(), codec.decode(out).c_str());
  return 0;
}

int cmd_chat(const Args& a) {
  std::vector<const char*> allowed(kSampleFlags);
  allowed.push_back("--system");
  a.only(allowed);
  const std::string* path = a.get("--model");
  if (!path) throw UsageError("chat needs --model PATH");
  auto model = load_model(a);
  loom::train::ChatSession s(*model, codec_for_model(*path, *model, a), sample_options(a),
                             a.get("--system") ? *a.get("--system") : "");
  const bool tty = ::isatty(fileno(stdin));
  if (tty)
    std::fprintf(stderr, "chat with %s (/reset starts over, /quit or Ctrl-D ends)\n",
                 path->c_str());
  std::string line;
  while (true) {
    if (tty) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/quit") break;
    if (line == "/reset") {
      s.reset();
      continue;
    }
    if (line.empty()) continue;
    try {
      s.reply(line, [](const std::string& t) {
        std::fputs(t.c_str(), stdout);
        std::fflush(stdout);
      });
      std::printf("\n");
    } catch (const loom::Error& e) {  // e.g. the context is full: say so and start over
      std::fprintf(stderr, "loom: %s; starting a new conversation\n", e.what());
      s.reset();
    }
  }
  return 0;
}

int cmd_forward(const Args& a) {
  a.only({"--model", "--base", "--ids", "--text", "--out", "--tokenizer", "--dtype"});
  const std::string* dir = a.get("--model");
  const std::string* out = a.get("--out");
  if (!dir || !out) throw UsageError("forward needs --model PATH and --out FILE");
  auto model = load_model(a);
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
    ids = codec_for_model(*dir, *model, a).encode(*t);
  } else {
    throw UsageError("forward needs --ids or --text");
  }
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

int cmd_export(const Args& a) {
  a.only({"--model", "--base", "--out", "--merge", "--dtype"});
  const std::string* path = a.get("--model");
  const std::string* out = a.get("--out");
  if (!path || !out) throw UsageError("export needs --model PATH and --out DIR");
  // The stored weights' type (transformers' torch_dtype names accepted too).
  const std::string dtype_arg = a.get("--dtype") ? *a.get("--dtype") : "fp32";
  loom::io::StDType dtype = loom::io::StDType::F32;
  if (dtype_arg == "bf16" || dtype_arg == "bfloat16")
    dtype = loom::io::StDType::BF16;
  else
    LOOM_CHECK(dtype_arg == "fp32" || dtype_arg == "float32",
               "export --dtype '" + dtype_arg +
                   "': Loom exports fp32 or bf16 weights (float32, bfloat16)");
  const bool merge = a.get("--merge") != nullptr;
  const bool adapter = loom::io::is_adapter_folder(loom::expand_user(*path));
  if (adapter && !merge)
    throw UsageError(*path +
                     " is an adapter folder: export writes it merged into its base (--merge)");
  auto model = load_model(a);
  loom::io::save_hf_checkpoint(*model, *out, loom::expand_user(*path), dtype);
  std::fprintf(stderr, "loom: wrote %s (%s%s, %s)\n", out->c_str(), model->arch().c_str(),
               adapter ? ", adapter merged" : "", loom::io::st_dtype_name(dtype));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // `loom --help` and `loom CMD --help` (anywhere before launch's `--`) print the usage.
  const auto asks_help = [&] {
    for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i)
      if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return true;
    return false;
  };
  if (argc < 2 || asks_help()) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  // Past a file-size limit (ulimit -f) a write fails with EFBIG and the error names the file;
  // SIGXFSZ's default would end the process without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  const std::string cmd = argv[1];
  try {
    if (cmd == "launch") return cmd_launch(argc, argv);
    Args a = Args::parse(argc, argv, 2);
    if (cmd == "train") return cmd_train(a);
    if (cmd == "generate") return cmd_generate(a);
    if (cmd == "chat") return cmd_chat(a);
    if (cmd == "forward") return cmd_forward(a);
    if (cmd == "export") return cmd_export(a);
    if (cmd == "plan") return cmd_plan(a);
    if (cmd == "verify") return cmd_verify(a);
    if (cmd == "data") return cmd_data(a);
    if (cmd == "report") return cmd_report(a);
    throw UsageError("unknown command '" + cmd + "'");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "loom: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: error: %s\n", e.what());
    return 1;
  }
}
