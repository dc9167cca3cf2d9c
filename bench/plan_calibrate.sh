#!/usr/bin/env bash
# Measures the constants of loom plan's cost model on this machine and prints them as the
# initializer of calibration() in src/loom/train/cost_model.cpp (paste it there):
#   f32_flops       GPT-2 124M (bench/plan-gpt2-124m.json, seq 128, micro-batch 4 x 2),
#                   one process on every core: the plan's f32 FLOPs per step / (step time -
#                   AdamW's time), the median of steps 2.. (step 1 faults its memory in)
#   adamw_elements  its trainable elements / AdamW's time per step (wall_clock_breakdown)
#   quant_flops     SmolLM2-135M LoRA on its Q4_1 base (configs/sft-smollm2-zh-lora.json,
#                   no evaluation): the FLOPs through quantized weights / what the step
#                   leaves after AdamW and the f32 FLOPs at f32_flops
#   bandwidth       bench/comm_bw (64 MiB per call) at 2, 4 and 8 ranks
#   call_seconds    GPT-2 at tp2 on 2 ranks (100 collectives a step): its comm phase per step
#                   beyond its bytes at that bandwidth, per call
#   process_bytes   peak RSS - the plan's bytes, the mean over those two runs and GPT-2 at
#                   tp2 on 2 ranks
# Not part of `make test` (minutes, and timing on a shared machine: run it when it is quiet).
#   bash bench/plan_calibrate.sh [BUILD]          (STEPS=5 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${STEPS:-5}
out=/tmp/loom-plan-calibrate
export OMP_WAIT_POLICY=PASSIVE OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# As bench/run.sh: these slow OpenBLAS down on some machines here.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
mkdir -p "$out"

# run NAME RANKS CONFIG [--set k=v ...]: the plan and a short training run in $out/NAME.
run() {
  local name=$1 n=$2 cfg=$3
  shift 3
  local sets=(--set "train_steps=$steps" --set "output_dir=$out/$name" --set wall_clock_breakdown=true
    --set steps_per_print=1 "$@")
  rm -rf "${out:?}/$name" && mkdir -p "$out/$name"
  "$build/loom" plan "$cfg" --world "$n" "${sets[@]}" > "$out/$name.plan"
  "$build/loom" launch -n "$n" -- train "$cfg" "${sets[@]}" > "$out/$name.log" 2>&1 ||
    { tail -20 "$out/$name.log"; exit 1; }
}
run gpt2 1 bench/plan-gpt2-124m.json
run lora 1 configs/sft-smollm2-zh-lora.json --set data.valid_fraction=0
run gpt2-tp2 2 bench/plan-gpt2-124m.json --set tensor_parallel.size=2
for n in 2 4 8; do
  OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np $n "$build/comm_bw" > "$out/comm$n.json"
done
python3 - "$out" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" "$(nproc)" <<'PY'
import json, re, statistics, sys, datetime
out, machine, cores = sys.argv[1], sys.argv[2] + f", {sys.argv[3]} cores", int(sys.argv[3])
M = 1048576
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "p2p")

def measured(name):  # median step (of steps 2..), AdamW and comm seconds per step, memory row
    rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
    steps = [r["step_seconds"] for r in rows if "step_seconds" in r]
    mem = next(r["memory"] for r in rows if "memory" in r)
    phases = re.search(r"time by phase over \d+ steps:(.*)", open(f"{out}/{name}.log").read())
    phase = {k: float(v) / len(steps) for k, v in re.findall(r"(\w+) ([0-9.]+)s", phases.group(1))}
    return statistics.median(steps[1:]), phase, mem

def planned(name):  # per step: f32 and quantized FLOPs, bytes by kind, calls; planned bytes
    text = open(f"{out}/{name}.plan").read()
    per_step = int(re.search(r"tokens, (\d+) per step", text).group(1))
    nums = re.search(r"the slowest stage: FLOPs per micro-batch (\S+) through f32 weights, (\S+) "
                     r"through quantized weights; bytes sent per step (\S+) all-reduce, (\S+) "
                     r"reduce-scatter, (\S+) all-gather, (\S+) p2p, in (\S+) calls", text).groups()
    f32, quant, *traffic = map(float, nums)
    total = float(re.search(r"\(cfg\)((?:\s+[0-9.]+){7})", text).group(1).split()[6]) * M
    return f32 * per_step, quant * per_step, dict(zip(KINDS + ("calls",), traffic)), total

bw = {n: json.load(open(f"{out}/comm{n}.json")) for n in (2, 4, 8)}
step, phase, mem = measured("gpt2")
f32, _, _, total = planned("gpt2")
f32_flops = f32 / (step - phase["optimizer"])
adamw = mem["trainable_params"] / phase["optimizer"]
extra = [mem["peak_rss_bytes"] - total]
step_l, phase_l, mem_l = measured("lora")
f32_l, quant_l, _, total_l = planned("lora")
quant_flops = quant_l / (step_l - phase_l["optimizer"] - f32_l / f32_flops)
extra.append(mem_l["peak_rss_bytes"] - total_l)
step_t, phase_t, mem_t = measured("gpt2-tp2")
_, _, traffic, total_t = planned("gpt2-tp2")
extra.append(mem_t["peak_rss_bytes"] - total_t)
# What the tp2 run's collectives took beyond their bytes at the measured bandwidth, per call.
bytes_s = sum(traffic[k] / bw[2][k + "_bytes_per_s"] for k in KINDS)
call_s = max(phase_t["comm"] - bytes_s, 0) / traffic["calls"]
print(f"// GPT-2 step {step:.2f} s (AdamW {phase['optimizer']:.3f} s), SmolLM2 LoRA step "
      f"{step_l:.2f} s (AdamW {phase_l['optimizer']:.4f} s), GPT-2 tp2 step {step_t:.2f} s "
      f"(comm {phase_t['comm']:.3f} s in {traffic['calls']:.0f} calls); peak RSS - planned: " +
      ", ".join(f"{e / M:.0f}" for e in extra) + " MiB (medians of steps 2..)")
print("static const Calibration c{")
print(f'    .machine = "{machine}, {datetime.date.today()}",')
print(f"    .cores = {cores},")
print(f"    .f32_flops = {f32_flops / 1e9:.3g}e9,")
print(f"    .quant_flops = {quant_flops / 1e9:.3g}e9,")
print(f"    .adamw_elements = {adamw / 1e6:.3g}e6,")
print("    .bandwidth = {" + ", ".join("{%d, %s}" % (n, ", ".join(
    f"{bw[n][k + '_bytes_per_s'] / 1e9:.3g}e9" for k in KINDS)) for n in (2, 4, 8)) + "},")
print(f"    .call_seconds = {call_s:.3g},")
print(f"    .process_bytes = int64_t{{{round(sum(extra) / len(extra) / M)}}} << 20,")
print("};")
PY
