#!/usr/bin/env bash
# Tensor parallelism on this machine: the GPT-2 124M training step (bench_step, B=4 T=64)
# on one process against tp2 (two ranks under mpirun), the same cores for both: THREADS
# OpenMP threads for the one process, THREADS/2 per rank for tp2 (OMP_WAIT_POLICY=PASSIVE),
# so neither side gets more CPU than the other. Then the communication check (tp_comm) at
# tp2 and tp4: bytes per transformer layer per micro-batch, measured against the formula.
# Not part of `make test` (minutes, and timing).
#   bash bench/tp.sh [BUILD_DIR]          (make bench-tp)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${THREADS:-2}
steps=${STEPS:-10}
per_rank=$((threads / 2 > 0 ? threads / 2 : 1))
export OMP_WAIT_POLICY=PASSIVE OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# As bench/run.sh: these slow OpenBLAS down on some machines here.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
mpirun=(mpirun --oversubscribe --bind-to none)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores" >&2
tp1=$(OMP_NUM_THREADS=$threads "$build/bench_step" --steps "$steps" --warmup 3 --tp 1)
tp2=$(OMP_NUM_THREADS=$per_rank "${mpirun[@]}" -np 2 "$build/bench_step" --steps "$steps" \
  --warmup 3 --tp 2)
echo "$tp1"
echo "$tp2"
python3 - "$tp1" "$tp2" "$threads" "$per_rank" <<'PY'
import json, sys
rows = [json.loads(sys.argv[1]), json.loads(sys.argv[2])]
M = 1048576
print(f"GPT-2 124M train step, B=4 T=64 fp32, tp1: {sys.argv[3]} threads, tp2: {sys.argv[4]} per rank")
print(f"{'tp':<4} {'ms/step':>9} {'tok/s':>7} {'peak RSS MiB/rank':>22} {'weights MiB/rank':>17} "
      f"{'tp MiB sent/step/rank':>22}")
for r in rows:
    rss = "/".join(f"{x:.0f}" for x in r["peak_rss_mib_per_rank"])
    print(f"{r['tp']:<4} {r['ms_per_step']:9.1f} {r['tokens_per_s']:7.1f} {rss:>22} "
          f"{r['weights_bytes'] / M:17.1f} {r['tp_bytes_sent_per_step'] / M:22.2f}")
print(f"weights per rank tp2/tp1: {rows[1]['weights_bytes'] / rows[0]['weights_bytes']:.3f}")
PY
for n in 2 4; do
  OMP_NUM_THREADS=1 "${mpirun[@]}" -np $n "$build/tp_comm" --tp $n | grep -v '^\[' |
    { [ $n = 2 ] && cat || tail -n +2; }
done
