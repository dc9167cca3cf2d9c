#!/usr/bin/env bash
# The soak: the worked example (LoRA on SmolLM2's Q4_1 base, 2 ranks, ZeRO-2,
# configs/sft-smollm2-zh-lora.json) run for MINUTES (default 60) with an evaluation every 50
# steps and a checkpoint every 100, watching resident memory. Every step's RSS per rank is in
# metrics.jsonl (rss_bytes); at the end this prints, per rank, the RSS after the first WARM
# minutes (default 5) and the largest after it (flat means the difference is a few MiB, not
# growing with the steps), and writes the run's report (loom report) with the memory curve.
# Not part of `make test`.
#   bash bench/soak.sh [BUILD]         (MINUTES=10 for a short one; OUT=dir for the run)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
minutes=${MINUTES:-60}
warm=${WARM:-5}
out=${OUT:-/tmp/loom-soak}
rm -rf "$out"
mkdir -p "$out"
# A copy of the program, so rebuilding build/ while it runs does not touch the soak.
cp "$build/loom" "$out/loom"
bash scripts/fetch_default_model.sh > /dev/null
# More steps than the time allows (the step rate varies with the machine); the run is stopped
# with SIGTERM when the time is up, which also exercises the graceful stop.
"$out/loom" launch -n 2 -- train configs/sft-smollm2-zh-lora.json \
  --set "output_dir=$out/run" --set train_steps=100000 --set eval_interval=50 \
  --set checkpoint_interval=100 --set steps_per_print=25 \
  --set scheduler.params.total_num_steps=100000 > "$out/train.log" 2>&1 &
pid=$!
sleep $((minutes * 60))
kill -TERM $pid
status=0
wait $pid || status=$?
tail -3 "$out/train.log"
[ "$status" -eq 75 ] || { echo "soak: the run ended with status $status, expected 75 (stopped)"; exit 1; }
"$out/loom" report "$out/run"
python3 - "$out/run/metrics.jsonl" "$warm" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
warm = float(sys.argv[2]) * 60
steps = [r for r in rows if "loss" in r]
t, at = 0.0, []
for r in steps:
    t += r["step_seconds"]
    at.append(t)
ranks = len(steps[0]["rss_bytes"])
M = 1048576
k = next(i for i, s in enumerate(at) if s >= warm)
print(f"soak: {len(steps)} steps in {at[-1] / 60:.1f} min of training "
      f"({at[-1] / len(steps):.1f} s/step), losses {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}")
for r in range(ranks):
    rss = [s["rss_bytes"][r] / M for s in steps]
    after = rss[k:]
    print(f"  rank {r}: RSS {rss[0]:.0f} MiB at step 1, {rss[k]:.0f} MiB at minute {warm / 60:.0f} "
          f"(step {k + 1}), largest after it {max(after):.0f} MiB (+{max(after) - rss[k]:.1f}), "
          f"last {after[-1]:.0f} MiB")
    # the slope over the second half, MiB per hour, from a least-squares line
    half = list(zip(at[len(at) // 2:], rss[len(at) // 2:]))
    n = len(half)
    mx = sum(x for x, _ in half) / n
    my = sum(y for _, y in half) / n
    sxx = sum((x - mx) ** 2 for x, _ in half) or 1.0
    slope = sum((x - mx) * (y - my) for x, y in half) / sxx * 3600
    print(f"          trend over the second half: {slope:+.1f} MiB per hour")
PY
echo "soak: the report with the memory curve: $out/run/report.html"
