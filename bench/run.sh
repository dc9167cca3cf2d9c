#!/usr/bin/env bash
# One command for the step benchmark: Loom's GPT-2 124M training step and PyTorch's
# (bench/torch_step.py, the same model and step), same machine, same thread count, one
# after the other; prints both JSON lines and the ratio.
#   bash bench/run.sh [BUILD_DIR] [REF_VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
venv=${2:-$HOME/.cache/loom/ref-venv}
threads=${THREADS:-2}
bash scripts/ref_venv.sh "$venv"
export OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=PASSIVE
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (set on some machines here) slow current numpy and
# torch; unset both for this command only.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
loom=$("$build/bench_step" --steps 10 --warmup 3)
torch=$("$venv/bin/python" bench/torch_step.py --threads "$threads" --steps 10)
echo "$loom"
echo "$torch"
python3 - "$loom" "$torch" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"GPT-2 124M train step, B=4 T=64 fp32, {a['threads']} threads")
print(f"  loom    {a['ms_per_step']:8.1f} ms/step  {a['tokens_per_s']:6.1f} tok/s  peak RSS {a['peak_rss_mib']:6.0f} MiB")
print(f"  pytorch {b['ms_per_step']:8.1f} ms/step  {b['tokens_per_s']:6.1f} tok/s  peak RSS {b['peak_rss_mib']:6.0f} MiB  (torch {b['torch']})")
print(f"  speed-up (pytorch ms / loom ms): {b['ms_per_step'] / a['ms_per_step']:.2f}x")
print(f"  loom step at {a['step_gflops']:.0f} GFLOP/s = {100 * a['fraction_of_sgemm']:.0f}% of this machine's sgemm ({a['sgemm_gflops']:.0f} GFLOP/s)")
print("  loom ms/step by phase: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(a['ms_breakdown'].items(), key=lambda kv: -kv[1]) if v > 0.05))
PY
