#include "loom/models/registry.h"

#include "loom/models/deepseek.h"
#include "loom/models/gpt2.h"
#include "loom/models/llama.h"
#include "loom/util/error.h"

namespace loom::models {

std::unique_ptr<CausalLM> make_model(const nlohmann::json& j, const std::string& where,
                                     const nn::TensorParallel& tp, const StageRange& stage,
                                     ParamBuffers buffers) {
  LOOM_CHECK(j.is_object(), where + ": model config must be a JSON object");
  std::string type = j.value("model_type", std::string());
  if (type.empty() && j.contains("architectures") && j["architectures"].is_array() &&
      !j["architectures"].empty() && j["architectures"][0] == "GPT2LMHeadModel")
    type = "gpt2";
  if (type == "gpt2")
    return std::make_unique<GPT2>(GPT2Config::from_hf(j, where), tp, stage, buffers);
  if (type == "llama" || type == "qwen2" || type == "qwen2_moe")
    return std::make_unique<Llama>(LlamaConfig::from_hf(j, where), tp, stage, buffers);
  if (type == "deepseek_v3" || type == "deepseek_v2")
    return std::make_unique<Deepseek>(DeepseekConfig::from_hf(j, where), tp, stage, buffers);
  throw Error(where + ": model_type '" + type +
              "' is not supported (gpt2, llama, qwen2, qwen2_moe, deepseek_v2, deepseek_v3)");
}

}  // namespace loom::models
