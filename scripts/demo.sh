#!/usr/bin/env bash
# The worked example on one process: LoRA fine-tuning of the default model
# (SmolLM2-135M-Instruct, GGUF Q4_1, kept quantized) on ../shared/data/zh_dialogue.json, then
# a few Chinese prompts answered greedily by the base model and by the tuned one.
#   bash scripts/demo.sh [BUILD_DIR]       (make demo runs it after building)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
gguf=$(bash scripts/fetch_default_model.sh)
out=out/sft-smollm2-zh-lora
"$build/loom" train configs/sft-smollm2-zh-lora.json --set "output_dir=$out"
prompts=(
  "用一句话解释什么是人工智能。"
  "列出三种保持健康的方法。"
  "把下面的句子翻译成英文：今天天气很好。"
)
for p in "${prompts[@]}"; do
  echo
  echo "### $p"
  for m in "$gguf" "$out/checkpoint-final"; do
    [ "$m" = "$gguf" ] && echo "--- base model:" || echo "--- after LoRA fine-tuning:"
    "$build/loom" generate --model "$m" --chat 1 --temperature 0 --max-tokens 96 --prompt "$p"
  done
done
