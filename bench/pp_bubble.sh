#!/usr/bin/env bash
# The pipeline bubble on this machine: GPT-2 124M shape on 2 pipeline stages (2 ranks x 1
# OpenMP thread), GPipe and 1F1B at m = 2, 4 and 8 micro-batches of one sequence of SEQ
# tokens, one warm-up step and STEPS traced ones each (bench/pp_bubble.cpp), then each
# stage's idle fraction from the traces against (p - 1) / (m + p - 1), the first traced step
# left out (bench/pp_bubble.py). LAYERS: layers per stage (default 8,4: the tied head's GEMM
# weighs ~5 layers at T = 256, and 8,4 measured the most even here).
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
  "load $(cut -d' ' -f1-3 /proc/loadavg); GPT-2 124M shape, pp2 (layers $layers), T=$seq," \
  "1 sequence per micro-batch, 1 + $steps steps" >&2
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE  # as bench/run.sh: they slow OpenBLAS down here
mkdir -p "$out"
traces=()
for schedule in gpipe 1f1b; do
  for m in 2 4 8; do
    f="$out/trace-$schedule-m$m.json"
    mpirun --oversubscribe --bind-to none -np 2 "$build/pp_bubble" --schedule $schedule --m $m \
      --steps "$steps" --seq "$seq" --layers "$layers" --out "$f"
    traces+=("$f")
  done
done
python3 bench/pp_bubble.py "${traces[@]}"
