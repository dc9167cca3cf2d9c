#!/usr/bin/env bash
# Expert parallelism and DeepSeek-V3's auxiliary-loss-free balancing, measured on the tiny
# DeepSeek-V3 of the tests (tests/fixtures/deepseek_v3_tiny: 2 MoE layers, 8 routed experts,
# top-2 of 4 groups, hidden 32) fine-tuned on ../shared/data/zh_dialogue.json with the bytes
# tokenizer, at ep2 (2 ranks under mpirun), for STEPS steps (default 100), once per
# moe.bias_update_rate in RATES (default "0 0.001 0.01"; 0 leaves the bias as loaded).
# Prints per MoE layer:
#   - the forward token exchange's bytes per micro-batch (rank 0's, from metrics.jsonl)
#     against tokens x top-k x hidden x 4 bytes x (ep-1)/ep, what a uniform routing sends;
#   - the load balance (most loaded expert's tokens / the mean) at step 1 and averaged over
#     the last 10 steps, for each rate.
# Not part of `make test` (a minute of training).
#   bash bench/moe_ep.sh [BUILD_DIR]          (make bench-moe)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${STEPS:-100}
rates=${RATES:-0 0.001 0.01}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores" >&2
for rate in $rates; do
  cat > "$tmp/cfg-$rate.json" <<JSON
{
  "model": "tests/fixtures/deepseek_v3_tiny",
  "data": {"path": "../shared/data/zh_dialogue.json", "format": "prompt_response",
           "tokenizer": "bytes", "template": "plain", "seq_len": 64,
           "cache_dir": "$tmp/cache"},
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "train_steps": $steps,
  "seed": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
  "gradient_clipping": 1.0,
  "expert_parallel": {"size": 2},
  "moe": {"bias_update_rate": $rate},
  "steps_per_print": $steps,
  "output_dir": "$tmp/out-$rate"
}
JSON
  mpirun --oversubscribe --bind-to none -np 2 "$build/loom" train "$tmp/cfg-$rate.json" >&2
done
python3 - "$tmp" $rates <<'PY'
import json, sys
tmp, rates = sys.argv[1], sys.argv[2:]
def rows(rate):
    return [json.loads(l) for l in open(f"{tmp}/out-{rate}/metrics.jsonl") if '"moe"' in l]
runs = {r: rows(r) for r in rates}
first = runs[rates[0]]
B, T, K, C, P = 8, 64, 2, 32, 2
expect = B * T * K * C * 4 * (P - 1) / P
def balance(r, i):
    return r["moe"]["tokens_max"][i] / r["moe"]["tokens_mean"][i]
print(f"tiny DeepSeek-V3, ep2, micro-batch {B} x {T} tokens, top-{K}, hidden {C}, {len(first)} steps")
head = f"{'layer':>5} {'exchange B/micro-batch':>23} {'uniform routing':>16} {'max/mean step 1':>16}"
for r in rates:
    head += f" {'last 10, rate ' + r:>20}"
print(head)
for i, layer in enumerate(first[0]["moe"]["layer"]):
    sent = sum(r["moe"]["dispatch_bytes"][i] for r in first) / len(first)
    line = f"{layer:>5} {sent:23.0f} {expect:16.0f} {balance(first[0], i):16.2f}"
    for r in rates:
        line += f" {sum(balance(x, i) for x in runs[r][-10:]) / 10:20.2f}"
    print(line)
for r in rates:
    last = runs[r][-1]["moe"]
    print(f"rate {r}: bias range after {len(runs[r])} steps: " + ", ".join(
        f"layer {l}: [{a:+.3f}, {b:+.3f}]" for l, a, b in
        zip(last["layer"], last["bias_min"], last["bias_max"])))
PY
