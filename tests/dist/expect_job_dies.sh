#!/usr/bin/env bash
# A rank that dies must end the whole mpirun job, not leave the others waiting in a
# collective. Runs COMMAND (an mpirun job in which one rank dies) and passes when it exits
# non-zero within LIMIT seconds and PATTERN (an extended regex, which may span lines) matches
# its output followed by the line "== exit status N after S.MMMs". Prints both.
# usage: expect_job_dies.sh LIMIT PATTERN COMMAND...
set -u
limit=$1 pattern=$2
shift 2
start=$(date +%s%N)
out=$(timeout --kill-after=5 "$limit" "$@" 2>&1)
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
secs=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
out+=$'\n'"== exit status $rc after ${secs}s"
printf '%s\n' "$out"
# mpirun itself exits 128+signal when a rank was killed, so the clock, not the status, says
# whether timeout had to stop it.
if [ "$ms" -ge $((limit * 1000)) ]; then
  echo "FAIL: the job was still running after ${limit}s (the other ranks hung)"
  exit 1
fi
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the job exited 0 although a rank died"
  exit 1
fi
if ! grep -Ezq "$pattern" <<<"$out"; then  # -z: the pattern may span lines
  echo "FAIL: the output does not match /$pattern/"
  exit 1
fi
echo "PASS"
