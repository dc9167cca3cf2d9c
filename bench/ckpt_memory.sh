#!/usr/bin/env bash
# Activation checkpointing: peak RSS and activations of GPT-2 124M (random init,
# bench/plan-gpt2-124m.json) at T = SEQ (default 512), micro-batch MICRO (default 2), fp32,
# one process, with none / selective / full (uniform, 1 layer), measured (the trainer's
# memory report in metrics.jsonl: peak RSS from getrusage, activations = the storage peak of
# the first step above the model state; and /usr/bin/time's maximum RSS) against what
# `loom plan` predicts for the same config. Not part of `make test` (about a minute a case on
# 2 cores).
#   bash bench/ckpt_memory.sh [BUILD]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
seq=${SEQ:-512}
micro=${MICRO:-2}
steps=${STEPS:-2}
out=${OUT:-/tmp/loom-ckpt-memory}
cfg=bench/plan-gpt2-124m.json
mkdir -p "$out"
declare -A sets=([none]="" [selective]="activation_checkpointing.granularity=selective"
  [full]="activation_checkpointing.granularity=full")
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc --all) cores," \
  "$(date +%F); GPT-2 124M, T $seq, micro-batch $micro, $steps steps" >&2
printf '| checkpointing | activations est. | measured | peak RSS est. | measured (trainer) | error | max RSS (time -v) | step s |\n'
printf '| --- | --- | --- | --- | --- | --- | --- | --- |\n'
for name in none selective full; do
  args=(--set "data.seq_len=$seq" --set "train_batch_size=$micro"
    --set "train_micro_batch_size_per_gpu=$micro" --set "train_steps=$steps" --set steps_per_print=1
    --set "output_dir=$out/$name")
  [ -n "${sets[$name]}" ] && args+=(--set "${sets[$name]}")
  "$build/loom" plan "$cfg" --world 1 "${args[@]}" > "$out/$name.plan"
  rm -rf "${out:?}/$name"
  /usr/bin/time -v "$build/loom" train "$cfg" "${args[@]}" > "$out/$name.log" 2>&1 ||
    { tail -20 "$out/$name.log"; exit 1; }
  python3 - "$out" "$name" <<'PY'
import json, re, statistics, sys
out, name = sys.argv[1], sys.argv[2]
plan = open(f"{out}/{name}.plan").read()
row = [l for l in plan.splitlines() if l.startswith("stage 0 (cfg)")][0].split()
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
      f"{100 * (peak_est - peak) / peak:+.1f}% | {maxrss:.0f} MiB | {steps[-1]:.2f} |")
PY
  rm -rf "$out/$name"/checkpoint-*  # 1.4 GB each; the metrics and logs stay
done
