#!/usr/bin/env bash
# Memory and communication per rank for ZeRO stages 0-3: GPT-2 124M shape (vocab 50304),
# AdamW, 4 ranks (loom launch, oversubscribed on a small machine), 3 steps of 4 x 64 tokens
# (one sequence per rank). For each stage it prints the engine's planned model state and
# buffers (the ZeRO paper's accounting; `loom plan` prints the same), the measured peak RSS
# of the largest rank, and the bytes rank 0 sent per step against the paper's volumes
# (2 Psi (N-1)/N x 4 bytes for stages 0-2, 3 Psi (N-1)/N x 4 bytes for stage 3).
#   bash bench/zero_memory.sh [BUILD] [RANKS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
n=${2:-4}
out=/tmp/loom-bench-zero
printf '%-6s %10s %8s %12s %12s %13s %14s %15s\n' stage "state MiB" "buf MiB" "planned MiB" \
  "activ. MiB" "peak RSS MiB" "sent MiB/step" "theory MiB/step"
for stage in 0 1 2 3; do
  rm -rf "$out"
  "$build/loom" launch -n "$n" -- train bench/gpt2-124m-zero.json \
    --set zero_optimization.stage=$stage --set output_dir=$out > "$out.log" 2>&1 ||
    { cat "$out.log"; exit 1; }
  python3 - "$out/metrics.jsonl" "$stage" "$n" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
mem = next(r for r in rows if "memory" in r)
m, stage, n = mem["memory"], int(sys.argv[2]), int(sys.argv[3])
sent = [r["comm_bytes_sent"] for r in rows if "comm_bytes_sent" in r][1:]  # after warm-up
psi = m["trainable_params"]
theory = (3 if stage == 3 else 2) * psi * (n - 1) / n * 4
state = m["weights_bytes"] + m["grads_bytes"] + m["optimizer_bytes"]
M = 1048576
print(f"{stage:<6d} {state / M:10.1f} {m['buffer_bytes'] / M:8.1f} "
      f"{(state + m['buffer_bytes']) / M:12.1f} {m['activations_bytes'] / M:12.1f} "
      f"{m['peak_rss_bytes'] / M:13.1f} {sum(sent) / len(sent) / M:14.1f} {theory / M:15.1f}")
PY
done
