// Pipeline parallelism's configuration and how the decoder's layers are cut into stages
// (`pipeline_parallel` in the config; DeepSpeed's partition_method, Megatron's stages).
// A stage is a run of consecutive layers; the first stage also holds the embedding, the
// last the final norm, the head and the loss. With `virtual_stages` v > 1 (Megatron's
// interleaved schedule) the layers are cut into size * v chunks and rank r holds chunks
// r, r + size, r + 2 size, ...
//   partition "uniform"   : chunk c ends at layer floor((c + 1) L / chunks) (counts differ by
//                           at most one, the larger ones spread out)
//   partition "parameters": the contiguous cut that minimises the largest chunk's parameter
//                           count, the embedding counted with the first chunk and the head
//                           with the last
//   partition [n0, n1, ...]: layers per chunk, given (must sum to L, each at least 1)
// Errors name the config key and the numbers ("8 stages but the model has 6 layers").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/models/causal_lm.h"

namespace loom::parallel {

struct PipelineConfig {
  int size = 1;                       // pipeline stages (ranks along pp)
  std::string schedule = "1f1b";      // gpipe | 1f1b | interleaved
  std::string partition = "uniform";  // uniform | parameters (or `layers` given)
  std::vector<int64_t> layers;        // an explicit partition: layers per chunk
  int virtual_stages = 1;             // model chunks per rank (interleaved)
  int chunks() const { return size * virtual_stages; }
};

// The layer counts of `model`'s chunks (its blocks' parameters per layer; the embedding unit
// and the head unit, see models/causal_lm.h, for the "parameters" rule).
std::vector<int64_t> partition_model(const PipelineConfig& cfg, models::CausalLM& model,
                                     const std::string& where);

// Layers per chunk (chunks() of them, in model order). layer_params[l]: parameters of layer
// l; embed_params / head_params: of the embedding and of the final norm + head (only the
// "parameters" rule reads them). `where` names the config file in errors.
std::vector<int64_t> partition_layers(const PipelineConfig& cfg,
                                      const std::vector<int64_t>& layer_params,
                                      int64_t embed_params, int64_t head_params,
                                      const std::string& where);

}  // namespace loom::parallel
