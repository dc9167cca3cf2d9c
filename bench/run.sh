#!/usr/bin/env bash
# One command for the step benchmark: Loom's GPT-2 124M training step and PyTorch's
# (bench/torch_step.py, the same model and step), same machine, same thread count, one
# after the other, in fp32 and in bf16 (Loom's bf16 section, torch.autocast); prints the JSON
# lines and a table with the ratios.
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
# fp32, then mixed precision: Loom's bf16 section against torch.autocast(bfloat16) on CPU
# (the forward and loss under autocast, AdamW on fp32 parameters: both keep fp32 masters).
loom=$("$build/bench_step" --steps 10 --warmup 3)
loom16=$("$build/bench_step" --steps 10 --warmup 3 --precision bf16)
torch=$("$venv/bin/python" bench/torch_step.py --threads "$threads" --steps 10)
torch16=$("$venv/bin/python" bench/torch_step.py --threads "$threads" --steps 10 --precision bf16)
printf '%s\n' "$loom" "$loom16" "$torch" "$torch16"
python3 - "$loom" "$loom16" "$torch" "$torch16" <<'PY'
import json, sys
a, a16, b, b16 = (json.loads(x) for x in sys.argv[1:5])
cpu = "unknown CPU"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
bf16_native = "avx512_bf16" in open("/proc/cpuinfo").read()
print(f"GPT-2 124M train step, B=4 T=64, {a['threads']} threads, {cpu}"
      f" ({'with' if bf16_native else 'without'} avx512_bf16)")
print(f"  {'':18} {'ms/step':>9} {'tok/s':>8} {'peak RSS MiB':>13}")
for name, r in (("loom fp32", a), ("loom bf16", a16), ("pytorch fp32", b),
                ("pytorch autocast", b16)):
    print(f"  {name:18} {r['ms_per_step']:9.1f} {r['tokens_per_s']:8.1f} {r['peak_rss_mib']:13.0f}")
print(f"  torch {b['torch']}")
print(f"  speed-up over pytorch (its ms / loom ms): fp32 {b['ms_per_step'] / a['ms_per_step']:.2f}x,"
      f" bf16 {b16['ms_per_step'] / a16['ms_per_step']:.2f}x")
print(f"  loom bf16 over loom fp32: {a['ms_per_step'] / a16['ms_per_step']:.2f}x")
print(f"  loom fp32 step at {a['step_gflops']:.0f} GFLOP/s = {100 * a['fraction_of_sgemm']:.0f}% of this machine's sgemm ({a['sgemm_gflops']:.0f} GFLOP/s)")
print(f"  loom bf16 step at {a16['step_gflops']:.0f} GFLOP/s = {100 * a16['fraction_of_half_gemm']:.0f}% of the bf16 GEMM ({a16['half_gemm_gflops']:.0f} GFLOP/s, {a16['half_gemm']})")
for name, r in (("fp32", a), ("bf16", a16)):
    print(f"  loom {name} ms/step by phase: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(r['ms_breakdown'].items(), key=lambda kv: -kv[1]) if v > 0.05))
PY
