#!/usr/bin/env bash
# The worked example: LoRA fine-tuning of the default model (SmolLM2-135M-Instruct, GGUF
# Q4_1, kept quantized) on ../shared/data/zh_dialogue.json on 2 processes with ZeRO-2
# (loom launch runs mpirun; RANKS=1 for one process), then
# a few Chinese prompts answered by the base model and by the tuned one (nucleus sampling,
# fixed seed: greedy decoding of a model this small loops).
#   bash scripts/demo.sh [BUILD_DIR]       (make demo runs it after building)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
gguf=$(bash scripts/fetch_default_model.sh)
out=out/sft-smollm2-zh-lora
"$build/loom" launch -n "${RANKS:-2}" -- train configs/sft-smollm2-zh-lora.json --set "output_dir=$out"
# The run on one page (curves, memory per rank, config): open $out/report.html in a browser.
"$build/loom" report "$out"
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
    "$build/loom" generate --model "$m" --chat 1 --temperature 0.7 --top-p 0.9 --seed 1 \
      --max-tokens 80 --prompt "$p"
  done
done
