#!/usr/bin/env bash
# `kill -9` of one rank of a real training job (loom train under mpirun, NP ranks, ZeRO-2,
# PP pipeline stages, a checkpoint every 3 steps) must end the job within 30 s with mpirun
# naming the rank, and the last checkpoint must be intact: it resumes on one process and
# finishes. Run as 2 ranks data-parallel (rank 1 killed) and as a pp4 pipeline (rank 2, a
# middle stage, killed).
# usage: kill_rank_mid_training.sh LOOM NP RANK PP MPIRUN [mpirun options...]
set -u
loom=$1 np=$2 rank=$3 pp=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -c "print('the quick brown fox jumps over the lazy dog. ' * 3000)" > "$tmp/data.txt"
cat > "$tmp/cfg.json" <<JSON
{"model": {"arch": "gpt2", "n_layer": 4, "n_embd": 64, "n_head": 4, "vocab_size": 256,
           "n_positions": 64},
 "pipeline_parallel": {"size": $pp}, "gradient_accumulation_steps": 4,
 "data": {"path": "$tmp/data.txt", "format": "text", "tokenizer": "bytes", "seq_len": 64},
 "train_batch_size": 8, "train_steps": 100000, "checkpoint_interval": 3, "steps_per_print": 1000,
 "zero_optimization": {"stage": 2}, "output_dir": "$tmp/out"}
JSON
"$@" -np "$np" "$loom" train "$tmp/cfg.json" > "$tmp/log" 2>&1 &
job=$!
for _ in $(seq 600); do [ -d "$tmp/out/checkpoint-6" ] && break; sleep 0.2; done
[ -d "$tmp/out/checkpoint-6" ] || { echo "FAIL: no checkpoint after 120 s"; cat "$tmp/log"; exit 1; }
victim=""
for p in $(pgrep -f "$loom train $tmp/cfg.json"); do
  if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then
    victim=$p
  fi
done
[ -n "$victim" ] || { echo "FAIL: rank $rank not found"; exit 1; }
start=$(date +%s%N)
kill -9 "$victim"
for _ in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
secs=$((($(date +%s%N) - start) / 1000000000))
if kill -0 "$job" 2>/dev/null; then
  echo "FAIL: the job was still running 30 s after rank $rank was killed"
  kill -9 "$job"
  exit 1
fi
wait "$job"
rc=$?
cat "$tmp/log"
echo "== mpirun exited $rc, ${secs} s after kill -9 of rank $rank (pid $victim)"
[ "$rc" -ne 0 ] || { echo "FAIL: exit status 0"; exit 1; }
grep -Eq "rank $rank .*(signal 9|Killed)" "$tmp/log" ||
  { echo "FAIL: no message naming rank $rank"; exit 1; }
last=$(ls -d "$tmp"/out/checkpoint-* | grep -v '\.tmp$' | sort -t- -k2 -n | tail -1)
step=${last##*-}
echo "== resuming $last on one process"
"$loom" train "$tmp/cfg.json" --set "resume_from=\"$last\"" --set train_steps=$((step + 2)) \
  --set zero_optimization.stage=0 --set pipeline_parallel.size=1 \
  --set output_dir=\"$tmp/out2\" 2>&1 | tail -3
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL: the checkpoint did not resume"; exit 1; }
echo "PASS"
