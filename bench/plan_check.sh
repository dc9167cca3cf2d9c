#!/usr/bin/env bash
# Checks loom plan's estimates against real runs: for GPT-2 124M (bench/plan-gpt2-124m.json,
# random init, seq 128, global batch 8) and SmolLM2-135M LoRA on its Q4_1 base (the default
# config, configs/sft-smollm2-zh-lora.json, without its evaluation) at 2, 4 and 8 ranks,
# `loom plan --memory-per-rank GIB` picks the fastest layout that fits, `loom launch` trains
# it for STEPS steps, and the table compares the estimated peak RSS per rank with the
# measured one (the largest rank's, metrics.jsonl) and the estimated step time with the
# measured median of steps 2.. (step 1 faults its memory in); then the same for pipeline
# layouts given outright (1F1B, GPipe, interleaved). Ranks beyond the cores share them
# (oversubscribed): memory is unaffected, the time is what the cost model assumes too. The
# last column is the machine's load average after the run (other jobs share it).
# Not part of `make test` (about 15 minutes on 2 cores).
#   bash bench/plan_check.sh [BUILD]            (make bench-plan)
#   CASES="gpt2 4 1.5;smollm2 4 - pipeline_parallel.size=2" STEPS=4   (MODEL RANKS GIB|- SETS)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${STEPS:-4}
out=/tmp/loom-plan-check
export OMP_WAIT_POLICY=PASSIVE OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
declare -A config=([gpt2]=bench/plan-gpt2-124m.json [smollm2]=configs/sft-smollm2-zh-lora.json)
declare -A extra=([gpt2]="" [smollm2]="--set data.valid_fraction=0")
# MODEL RANKS GIB: the fastest layout that fits GIB per rank; MODEL RANKS - SETS: the layout
# the overrides give (the pipeline layouts, which the search ranks below these on 2 cores).
cases=${CASES:-"gpt2 2 2;gpt2 4 1.5;gpt2 8 1;smollm2 2 1.5;smollm2 4 1;smollm2 8 0.75;\
gpt2 4 - pipeline_parallel.size=2 tensor_parallel.size=2 train_micro_batch_size_per_gpu=2;\
gpt2 8 - pipeline_parallel.size=4 pipeline_parallel.schedule=interleaved \
pipeline_parallel.virtual_stages=2 train_micro_batch_size_per_gpu=1 zero_optimization.stage=1;\
smollm2 4 - pipeline_parallel.size=4 pipeline_parallel.schedule=gpipe train_micro_batch_size_per_gpu=2;\
smollm2 8 - pipeline_parallel.size=4 train_micro_batch_size_per_gpu=1 zero_optimization.stage=2"}
mkdir -p "$out"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores," \
  "$(date +%F)" >&2
printf '| model | ranks | GiB/rank | layout | peak RSS est. | measured | error | step est. | measured | error | load |\n'
printf '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n'
IFS=';' read -r -a list <<< "$cases"
for c in "${list[@]}"; do
  read -r model n g fixed <<< "$c"
  cfg=${config[$model]}
  # shellcheck disable=SC2206
  sets=(--set "train_steps=$steps" --set steps_per_print=1 ${extra[$model]})
  name=$model-$n-$g
  if [ "$g" = - ]; then
    layout=()
    for kv in $fixed; do layout+=(--set "$kv"); done
    name=$model-$n-$(echo "$fixed" | md5sum | cut -c1-6)
    "$build/loom" plan "$cfg" --world "$n" "${sets[@]}" "${layout[@]}" > "$out/$name.plan"
  else
    "$build/loom" plan "$cfg" --world "$n" --memory-per-rank "$g" "${sets[@]}" > "$out/$name.plan"
    read -r -a layout <<< "$(sed -n 's/^the fastest: //p' "$out/$name.plan")"
  fi
  # The layout's own plan: its estimated peak (the largest stage's) and step.
  "$build/loom" plan "$cfg" --world "$n" "${sets[@]}" "${layout[@]}" > "$out/$name.layout"
  rm -rf "${out:?}/$name"
  "$build/loom" launch -n "$n" -- train "$cfg" "${sets[@]}" "${layout[@]}" \
    --set "output_dir=$out/$name" > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; exit 1; }
  load=$(cut -d' ' -f1 /proc/loadavg)
  python3 - "$out" "$name" "$model" "$n" "$g" "$load" <<'PY'
import json, re, statistics, sys
out, name, model, n, gib, load = sys.argv[1:]
M = 1048576
layout = open(f"{out}/{name}.layout").read()
if "\npipeline:" in layout:  # the stages' rows: the last number is the peak
    rows = re.findall(r"^\d+\s+\S+.*\s([0-9.]+)$", layout, re.M)
    est_peak = max(float(r) for r in rows)
else:
    est_peak = float(re.search(r"\(cfg\)(?:\s+[0-9.]+){7}\s+([0-9.]+)", layout).group(1))
est_step = float(re.search(r"estimated step: (\S+) s", layout).group(1))
first = layout.splitlines()[0]
dp, tp, pp, micro, m = re.search(r"= (\d+) data-parallel x (\d+) tensor-parallel.* x (\d+) pipeline "
                                 r"stages, micro-batch (\d+) x \d+ tokens, (\d+) per step", first).groups()
zero = re.search(r"ZeRO stage (\d)|stage (\d) \(cfg\)", layout).groups()
desc = f"dp{dp} tp{tp} pp{pp} ZeRO-{zero[0] or zero[1]} micro {micro} x {m}"
if pp != "1":
    desc += " " + re.search(r"\((\w+) schedule", layout).group(1)
rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
steps = [r["step_seconds"] for r in rows if "step_seconds" in r][1:]
peak = next(r["memory"] for r in rows if "memory" in r)["peak_rss_bytes"] / M
step = statistics.median(steps)
print(f"| {model} | {n} | {gib} | {desc} | {est_peak:.0f} MiB | {peak:.0f} MiB | "
      f"{(est_peak - peak) / peak * 100:+.1f}% | {est_step:.2f} s | {step:.2f} s | "
      f"{(est_step - step) / step * 100:+.0f}% | {load} |")
PY
done
