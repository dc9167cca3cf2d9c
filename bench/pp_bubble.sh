#!/usr/bin/env bash
# The pipeline bubble on this machine: 2 pipeline stages (2 ranks x 1 OpenMP thread) of a
# GPT-2 124M-shaped model (12 layers, d=768), GPipe and 1F1B at m = 2, 4 and 8 micro-batches
# of one sequence of SEQ tokens, one warm-up step and STEPS traced ones each
# (bench/pp_bubble.cpp), then each stage's idle fraction from the traces against
# (p - 1) / (m + p - 1) and against the same schedule with the stages' measured times
# (bench/pp_bubble.py), the first traced step left out. Two models:
#   equal  vocabulary 768, layers 6,6: the head weighs ~8% of a layer, so the stages are
#          equal, the case (p - 1) / (m + p - 1) describes;
#   gpt2   vocabulary 50257, layers 8,4 (LAYERS): the tied head's GEMM weighs ~5 layers at
#          T = 256 and no cut of 12 layers balances it; 8,4 is the most even.
# Not part of `make test` (minutes, and timing).
#   bash bench/pp_bubble.sh [BUILD_DIR]          (make bench-pp)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${STEPS:-3}
seq=${SEQ:-256}
layers=${LAYERS:-8,4}
out=${OUT:-$build/pp_bubble-traces}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores," \
  "load $(cut -d' ' -f1-3 /proc/loadavg); GPT-2 124M shape, pp2, T=$seq," \
  "1 sequence per micro-batch, 1 + $steps steps" >&2
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE  # as bench/run.sh: they slow OpenBLAS down here
mkdir -p "$out"
traces=()
for model in "equal 768 6,6" "gpt2 50257 $layers"; do
  read -r name vocab cut <<< "$model"
  for schedule in gpipe 1f1b; do
    for m in 2 4 8; do
      f="$out/trace-$name-$schedule-m$m.json"
      mpirun --oversubscribe --bind-to none -np 2 "$build/pp_bubble" --schedule $schedule \
        --m $m --steps "$steps" --seq "$seq" --layers "$cut" --vocab "$vocab" --out "$f"
      traces+=("$f")
    done
  done
done
python3 bench/pp_bubble.py "${traces[@]}"
