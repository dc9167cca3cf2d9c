#!/usr/bin/env bash
# `kill -9` of one rank of a real training job (loom train under mpirun, 2 ranks, ZeRO-2,
# a checkpoint every 3 steps) must end the job within 30 s with mpirun naming the rank, and
# the last checkpoint must be intact: it resumes on one process and finishes.
# usage: kill_rank_mid_training.sh LOOM MPIRUN [mpirun options...]
set -u
loom=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -c "print('the quick brown fox jumps over the lazy dog. ' * 3000)" > "$tmp/data.txt"
cat > "$tmp/cfg.json" <<JSON
{"model": {"arch": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256,
           "n_positions": 64},
 "data": {"path": "$tmp/data.txt", "format": "text", "tokenizer": "bytes", "seq_len": 64},
 "train_batch_size": 8, "train_steps": 100000, "checkpoint_interval": 3, "steps_per_print": 1000,
 "zero_optimization": {"stage": 2}, "output_dir": "$tmp/out"}
JSON
"$@" -np 2 "$loom" train "$tmp/cfg.json" > "$tmp/log" 2>&1 &
job=$!
for _ in $(seq 600); do [ -d "$tmp/out/checkpoint-6" ] && break; sleep 0.2; done
[ -d "$tmp/out/checkpoint-6" ] || { echo "FAIL: no checkpoint after 120 s"; cat "$tmp/log"; exit 1; }
victim=""
for p in $(pgrep -f "$loom train $tmp/cfg.json"); do
  if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
    victim=$p
  fi
done
[ -n "$victim" ] || { echo "FAIL: rank 1 not found"; exit 1; }
start=$(date +%s%N)
kill -9 "$victim"
for _ in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
secs=$((($(date +%s%N) - start) / 1000000000))
if kill -0 "$job" 2>/dev/null; then
  echo "FAIL: the job was still running 30 s after rank 1 was killed"
  kill -9 "$job"
  exit 1
fi
wait "$job"
rc=$?
cat "$tmp/log"
echo "== mpirun exited $rc, ${secs} s after kill -9 of rank 1 (pid $victim)"
[ "$rc" -ne 0 ] || { echo "FAIL: exit status 0"; exit 1; }
grep -Eq "rank 1 .*(signal 9|Killed)" "$tmp/log" || { echo "FAIL: no message naming rank 1"; exit 1; }
last=$(ls -d "$tmp"/out/checkpoint-* | grep -v '\.tmp$' | sort -t- -k2 -n | tail -1)
step=${last##*-}
echo "== resuming $last on one process"
"$loom" train "$tmp/cfg.json" --set "resume_from=\"$last\"" --set train_steps=$((step + 2)) \
  --set zero_optimization.stage=0 --set output_dir=\"$tmp/out2\" 2>&1 | tail -3
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL: the checkpoint did not resume"; exit 1; }
echo "PASS"
