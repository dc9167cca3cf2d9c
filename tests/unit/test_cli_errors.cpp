// Bad input through the real `loom` binary: each case exits non-zero, names the file
// (and key or tensor), and leaves no output folder behind.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>

#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/models/gpt2.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

struct Result {
  int code;
  std::string output;
};

Result run(const std::string& args) {
  std::string cmd = test::loom_binary() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

class CliErrors : public ::testing::Test {
 protected:
  test::TempDir tmp;
  fs::path out() const { return tmp.path / "out"; }
  std::string config(const std::string& model_json, const std::string& extra = "") {
    fs::path data = tmp.path / "data.txt";
    write(data, std::string(4000, 'a'));
    fs::path cfg = tmp.path / "cfg.json";
    write(cfg, "{\"model\": " + model_json + ", \"data\": {\"path\": \"" + data.string() +
                   "\", \"seq_len\": 8, \"tokenizer\": \"bytes\"}, \"train_steps\": 1, "
                   "\"output_dir\": \"" +
                   out().string() + "\"" + extra + "}");
    return cfg.string();
  }
  // A tiny GPT-2 folder saved by loom itself.
  fs::path model_folder() {
    models::GPT2Config c;
    c.vocab_size = 256;
    c.n_positions = 16;
    c.n_embd = 8;
    c.n_head = 2;
    c.n_layer = 1;
    models::GPT2 m(c);
    m.params().init(1);
    fs::path dir = tmp.path / "model";
    io::save_hf_checkpoint(m, dir);
    return dir;
  }
  void expect_failure(const Result& r, const std::string& must_contain) {
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find(must_contain), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out())) << "output folder written despite the error";
  }
};

TEST_F(CliErrors, MissingConfigFile) {
  fs::path p = tmp.path / "nope.json";
  expect_failure(run("train " + p.string()), p.string());
}

TEST_F(CliErrors, MalformedJsonNamesFileAndLine) {
  fs::path p = tmp.path / "bad.json";
  write(p, "{\n  \"model\": {\"arch\": \"gpt2\"},\n  \"data\": {,}\n}\n");
  expect_failure(run("train " + p.string()), p.string() + ":3");
}

TEST_F(CliErrors, UnknownKey) {
  expect_failure(run("train " + config("{\"arch\": \"gpt2\"}", ", \"learning_rate\": 1")),
                 "'learning_rate'");
}

// Tensor-parallel layouts that cannot run fail before anything is built or written.
TEST_F(CliErrors, TensorParallelLayouts) {
  const std::string cfg =
      config("{\"arch\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 8, \"n_head\": 2}");
  expect_failure(run("train " + cfg + " --set tensor_parallel.size=2"),
                 "'tensor_parallel.size' 2 exceeds the world size 1");
  expect_failure(run("plan " + cfg + " --world 4 --set tensor_parallel.size=3"),
                 "'tensor_parallel.size' 3 does not divide the world size 4");
  expect_failure(run("train " + cfg + " --set tensor_parallel.degree=2"),
                 "unknown config key 'tensor_parallel.degree'");
  expect_failure(run("plan " + cfg + " --world 3 --set tensor_parallel.size=3"),
                 "n_head 2 is not divisible by tensor_parallel.size 3");
}

// Pipeline layouts: checked before anything is trained or written.
TEST_F(CliErrors, PipelineLayouts) {
  const std::string cfg =
      config("{\"arch\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 8, \"n_head\": 2}");
  expect_failure(run("plan " + cfg + " --world 6 --set pipeline_parallel.size=4"),
                 "'pipeline_parallel.size' 4 x 'tensor_parallel.size' 1 does not divide the world "
                 "size 6");
  expect_failure(run("plan " + cfg + " --world 4 --set pipeline_parallel.size=4"),
                 "'pipeline_parallel.size' asks for 4 stages but the model has 2 layers");
  expect_failure(run("plan " + cfg +
                     " --world 2 --set pipeline_parallel.size=2 --set "
                     "pipeline_parallel.partition=[1,2]"),
                 "'pipeline_parallel.partition' sums to 3 layers, the model has 2");
  expect_failure(run("plan " + cfg + " --world 2 --set pipeline_parallel.schedule=zigzag"),
                 "'pipeline_parallel.schedule': 'zigzag' is not one of gpipe, 1f1b, interleaved");
  expect_failure(run("train " + cfg + " --set pipeline_parallel.stages=2"),
                 "unknown config key 'pipeline_parallel.stages'");
}

// Mixed precision: both enabled, unknown keys and 16-bit gradient accumulation (not built
// yet) fail by name with nothing written; fp16 overflowing at min_loss_scale ends the run
// with exit 1 naming the scale; loom plan plans them.
TEST_F(CliErrors, MixedPrecisionKeys) {
  const std::string cfg =
      config("{\"arch\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 8, \"n_head\": 2}");
  expect_failure(run("train " + cfg + " --set fp16.enabled=true --set bf16.enabled=true"),
                 "'bf16.enabled' and 'fp16.enabled' are both true");
  expect_failure(run("train " + cfg + " --set fp16.initial_scale=8"),
                 "unknown config key 'fp16.initial_scale'");
  expect_failure(run("train " + cfg + " --set bf16.loss_scale=0"),
                 "unknown config key 'bf16.loss_scale'");
  expect_failure(run("train " + cfg + " --set data_types.grad_accum_dtype=fp8"),
                 "'data_types.grad_accum_dtype'");
  expect_failure(run("train " + cfg + " --set communication_data_type=int8"),
                 "config key 'communication_data_type' must be \"fp32\", \"bf16\" or \"fp16\"");
  expect_failure(
      run("train " + cfg + " --set bf16.enabled=true --set data_types.grad_accum_dtype=bf16"),
      "'data_types.grad_accum_dtype' \"bf16\" needs zero_optimization.stage 2 or 3");
  // At 2^40 the scaled logit gradients overflow fp16 on every step down to 2^30.
  const Result scale =
      run("train " + cfg +
          " --set fp16.enabled=true --set fp16.initial_scale_power=40 --set train_steps=30 --set "
          "fp16.hysteresis=1 --set fp16.min_loss_scale=1073741824");
  EXPECT_EQ(scale.code, 1) << scale.output;
  EXPECT_NE(scale.output.find("gradients overflowed at the minimum loss scale 1.07374e+09"),
            std::string::npos)
      << scale.output;
  EXPECT_FALSE(fs::exists(out() / "checkpoint-final")) << "a run that failed saved a model";
  fs::remove_all(out());
  // A dtype loom export cannot write: exit 1 naming it, no folder.
  const fs::path model = model_folder();
  const Result ex =
      run("export --model " + model.string() + " --out " + out().string() + " --dtype fp16");
  expect_failure(ex, "export --dtype 'fp16'");
  const Result plan = run("plan " + cfg + " --world 1 --set bf16.enabled=true");
  EXPECT_EQ(plan.code, 0) << plan.output;
  EXPECT_NE(plan.output.find("bf16"), std::string::npos) << plan.output;
}

// Activation checkpointing: bad values name the key, in train and in plan.
TEST_F(CliErrors, ActivationCheckpointing) {
  const std::string cfg =
      config("{\"arch\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 8, \"n_head\": 2}");
  expect_failure(run("train " + cfg + " --set activation_checkpointing.granularity=partial"),
                 "'activation_checkpointing.granularity': 'partial' is not one of full, selective");
  expect_failure(run("plan " + cfg + " --set activation_checkpointing.method=block"),
                 "'activation_checkpointing.granularity' is required");
  expect_failure(run("train " + cfg +
                     " --set activation_checkpointing.granularity=full --set "
                     "activation_checkpointing.num_layers=3"),
                 "'activation_checkpointing.num_layers' 3 exceeds the model's 2 layers");
  expect_failure(run("plan " + cfg +
                     " --set activation_checkpointing.granularity=full --set "
                     "activation_checkpointing.num_layers=3"),
                 "'activation_checkpointing.num_layers' 3 exceeds the model's 2 layers");
  expect_failure(run("train " + cfg +
                     " --set activation_checkpointing.granularity=selective --set "
                     "activation_checkpointing.num_layers=1"),
                 "'activation_checkpointing.num_layers' does not apply to granularity");
  expect_failure(run("train " + cfg + " --set activation_checkpointing.cpu_checkpointing=true"),
                 "unknown config key 'activation_checkpointing.cpu_checkpointing'");
}

// --memory-per-rank: a positive number of GiB, with the world it lays out (usage errors:
// exit 2, naming the option); a budget nothing fits names the smallest estimate (exit 1).
TEST_F(CliErrors, PlanMemoryPerRank) {
  const std::string cfg =
      config("{\"arch\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 8, \"n_head\": 2}");
  for (const char* bad : {"-1", "0", "abc", "inf"}) {
    const Result r = run("plan " + cfg + " --world 2 --memory-per-rank " + bad);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("--memory-per-rank"), std::string::npos) << r.output;
  }
  Result r = run("plan " + cfg + " --memory-per-rank 4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--memory-per-rank needs --world N"), std::string::npos) << r.output;
  expect_failure(run("plan " + cfg + " --world 2 --memory-per-rank 0.0001"),
                 "no layout of 2 ranks fits in 0.0001 GiB per rank");
  r = run("plan " + cfg + " --world 2 --memory-per-rank 8");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the fastest: --set tensor_parallel.size="), std::string::npos)
      << r.output;
}

TEST_F(CliErrors, MissingDataFile) {
  std::string cfg = config("{\"arch\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 8, \"n_head\": 2}");
  expect_failure(run("train " + cfg + " --set data.path=/nonexistent/data.txt"),
                 "/nonexistent/data.txt");
}

// `loom data`: the report of a mixture on stdout, exit 0, nothing written; a bad entry of
// the list exits 1 naming it.
TEST_F(CliErrors, DataReportAndBadMixtureEntries) {
  write(tmp.path / "a.jsonl", "{\"text\": \"some text to train on\"}\n");
  write(tmp.path / "b.jsonl", "{\"prompt\": \"q\", \"response\": \"an answer\"}\n");
  const auto cfg = [&](const std::string& weight) {
    const fs::path p = tmp.path / "mix.json";
    write(p,
          "{\"model\": {\"arch\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 8, \"n_head\": 2}, "
          "\"data\": {\"path\": [{\"path\": \"" +
              (tmp.path / "a.jsonl").string() + "\", \"weight\": 3}, {\"path\": \"" +
              (tmp.path / "b.jsonl").string() + "\", \"weight\": " + weight +
              "}], \"seq_len\": 8, \"tokenizer\": \"bytes\", "
              "\"template\": \"plain\", \"cache_dir\": \"" +
              (tmp.path / "cache").string() + "\"}, \"output_dir\": \"" + out().string() + "\"}");
    return p.string();
  };
  const Result r = run("data " + cfg("1") + " --samples 1");
  EXPECT_EQ(r.code, 0) << r.output;
  for (const char* want :
       {"a.jsonl: text, 75.0% of the samples", "b.jsonl: prompt_response, 25.0%", "--- row 0"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << " in\n" << r.output;
  EXPECT_FALSE(fs::exists(out()));
  expect_failure(run("data " + cfg("0")), "config key 'data.path[1].weight' must be a number > 0");
  expect_failure(run("train " + cfg("-2")),
                 "config key 'data.path[1].weight' must be a number > 0");
  EXPECT_EQ(run("data " + cfg("1") + " --samples -1").code, 2);
}

TEST_F(CliErrors, TruncatedSafetensors) {
  fs::path dir = model_folder();
  fs::path st = dir / "model.safetensors";
  fs::resize_file(st, fs::file_size(st) - 100);
  expect_failure(run("train " + config("\"" + dir.string() + "\"")), st.string());
}

TEST_F(CliErrors, ShapeMismatchBetweenConfigAndWeights) {
  fs::path dir = model_folder();
  std::string text;
  {
    std::ifstream in(dir / "config.json");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string from = "\"n_embd\": 8", to = "\"n_embd\": 16";
  ASSERT_NE(text.find(from), std::string::npos);
  text.replace(text.find(from), from.size(), to);
  write(dir / "config.json", text);
  Result r = run("train " + config("\"" + dir.string() + "\""));
  expect_failure(r, "transformer.wte.weight");
  EXPECT_NE(r.output.find("[256, 8] vs expected [256, 16]"), std::string::npos) << r.output;
}

TEST_F(CliErrors, UsageErrorsExitTwo) {
  EXPECT_EQ(run("frobnicate").code, 2);
  EXPECT_EQ(run("train").code, 2);
}

// --help after a command is a request, not a flag missing its value.
TEST_F(CliErrors, HelpAfterACommandPrintsTheUsage) {
  for (const char* args : {"--help", "generate --help", "train cfg.json -h", "plan --help"}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 0) << args << ": " << r.output;
    EXPECT_NE(r.output.find("usage:"), std::string::npos) << args;
  }
}

}  // namespace
}  // namespace loom
