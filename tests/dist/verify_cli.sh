#!/usr/bin/env bash
# `loom verify` end to end: LoRA on the tiny Llama fixture under ZeRO-3 on 3 ranks (an odd
# size) must report EQUAL and exit 0; with --rtol 0 the same run must report DIFFERENT and
# exit non-zero (the layouts sum in another order, so some difference is never exactly 0);
# on one process verify refuses with a message saying how to run it. Tensor parallel: the same
# LoRA run at tp2 (2 ranks, dropout on) is EQUAL; tp3 on 3 ranks fails at once naming the
# heads (the fixture has 4), with nothing written. Pipeline parallel: pp2 is EQUAL and trains.
# bf16: one step EQUAL; a DIFFERENT verdict over more steps says why (16-bit rounding drift);
# ZeRO-2 on 2 ranks, which sums the micro-batches in one process's order, EQUAL over all
# 6 steps with bitwise equal final parameters.
# usage: verify_cli.sh LOOM SOURCE_DIR MPIRUN [mpirun options...]
set -u
loom=$1 src=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/sft.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(48):  # responses of different lengths: micro-batches differ in targets
        f.write(json.dumps({"prompt": f"q{i}" + "?" * (i % 5),
                            "response": chr(97 + i % 26) * (1 + i * 7 % 19)}) + "\n")
PY
cat > "$tmp/cfg.json" <<JSON
{"model": "$src/tests/fixtures/llama_tiny",
 "peft": {"method": "lora", "r": 4, "lora_alpha": 8, "lora_dropout": 0.1,
          "target_modules": "all-linear"},
 "data": {"path": "$tmp/sft.jsonl", "format": "prompt_response", "tokenizer": "bytes",
          "template": "plain", "seq_len": 40, "valid_fraction": 0.2, "cache_dir": "$tmp/cache"},
 "train_batch_size": 12, "gradient_accumulation_steps": 2, "train_steps": 6,
 "gradient_clipping": 0.5, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
 "zero_optimization": {"stage": 3}}
JSON
fail() { echo "FAIL: $*"; exit 1; }
"$@" -np 3 "$loom" verify "$tmp/cfg.json" > "$tmp/equal.log" 2>&1
rc=$?
cat "$tmp/equal.log"
[ $rc -eq 0 ] || fail "verify exited $rc on an equal run"
grep -q '^EQUAL: ' "$tmp/equal.log" || fail "no EQUAL verdict"
grep -q '^final parameters: ' "$tmp/equal.log" || fail "no parameter comparison"

"$@" -np 3 "$loom" verify "$tmp/cfg.json" --rtol 0 > "$tmp/strict.log" 2>&1
rc=$?
tail -2 "$tmp/strict.log"
[ $rc -ne 0 ] || fail "verify --rtol 0 exited 0"
grep -q '^DIFFERENT: ' "$tmp/strict.log" || fail "no DIFFERENT verdict with --rtol 0"

"$@" -np 2 "$loom" verify "$tmp/cfg.json" --set tensor_parallel.size=2 > "$tmp/tp2.log" 2>&1
rc=$?
tail -3 "$tmp/tp2.log"
[ $rc -eq 0 ] || fail "verify at tp2 exited $rc"
grep -q '^EQUAL: ' "$tmp/tp2.log" || fail "no EQUAL verdict at tp2"
grep -q 'tensor parallel 2' "$tmp/tp2.log" || fail "the tp2 layout is not named"

"$@" -np 3 "$loom" verify "$tmp/cfg.json" --set tensor_parallel.size=3 \
  --set output_dir="$tmp/tp3-out" > "$tmp/tp3.log" 2>&1
rc=$?
[ $rc -ne 0 ] || fail "verify at tp3 with 4 heads exited 0"
grep -q 'num_attention_heads 4 is not divisible by tensor_parallel.size 3' "$tmp/tp3.log" ||
  { cat "$tmp/tp3.log"; fail "tp3 did not name the heads"; }
[ ! -e "$tmp/tp3-out" ] || fail "tp3 wrote $tmp/tp3-out"

# Pipeline parallel: the same LoRA run (dropout on) at pp2 is EQUAL, the layout named, and
# --trace writes one Chrome trace with a named track per rank holding its passes; `loom
# train` at pp2 writes one adapter folder (the stages' parts merged, none left behind).
"$@" -np 2 "$loom" verify "$tmp/cfg.json" --set pipeline_parallel.size=2 \
  --set zero_optimization.stage=1 --trace "$tmp/pp2-trace.json" > "$tmp/pp2.log" 2>&1
rc=$?
tail -3 "$tmp/pp2.log"
[ $rc -eq 0 ] || fail "verify at pp2 exited $rc"
grep -q '^EQUAL: ' "$tmp/pp2.log" || fail "no EQUAL verdict at pp2"
grep -q 'pipeline parallel 2 1f1b' "$tmp/pp2.log" || fail "the pp2 layout is not named"
python3 - "$tmp/pp2-trace.json" <<'PY' || fail "the pp2 trace lacks a track or a pass"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
tracks = {e["tid"]: e["args"]["name"] for e in events
          if e["ph"] == "M" and e["name"] == "thread_name"}
assert tracks == {0: "rank 0 (dp 0, pp 0, tp 0)", 1: "rank 1 (dp 0, pp 1, tp 0)"}, tracks
spans = {(e["tid"], e["name"]) for e in events if e["ph"] == "X"}
for rank in (0, 1):
    for name in ("step 0", "F0", "F1", "B0", "B1", "optimizer", "wait irecv"):
        assert (rank, name) in spans, (rank, name)
PY
"$@" -np 2 "$loom" train "$tmp/cfg.json" --set pipeline_parallel.size=2 \
  --set zero_optimization.stage=1 --set output_dir="$tmp/pp2-out" > "$tmp/pp2-train.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$tmp/pp2-train.log"; fail "train at pp2 exited $rc"; }
grep -q 'pipeline parallel 2 (1f1b' "$tmp/pp2-train.log" || fail "the pp2 layout is not reported"
[ -f "$tmp/pp2-out/checkpoint-final/adapter_model.safetensors" ] || fail "no pp2 adapter"
! ls "$tmp/pp2-out/checkpoint-final" | grep -q stage || fail "stage parts left in the folder"

# bf16 (the frozen base loaded straight into 16 bits on every rank): one step is exact up to
# fp32 order, EQUAL; over several steps the 16-bit roundings may drift, and a DIFFERENT
# verdict then explains why and names --steps 1.
"$@" -np 3 "$loom" verify "$tmp/cfg.json" --set bf16.enabled=true --steps 1 > "$tmp/bf16.log" 2>&1
rc=$?
tail -2 "$tmp/bf16.log"
[ $rc -eq 0 ] || fail "verify of one bf16 step exited $rc"
grep -q '^EQUAL: ' "$tmp/bf16.log" || fail "no EQUAL verdict for one bf16 step"
"$@" -np 3 "$loom" verify "$tmp/cfg.json" --set bf16.enabled=true --rtol 0 > "$tmp/bf16s.log" 2>&1
rc=$?
[ $rc -ne 0 ] || fail "verify of bf16 with --rtol 0 exited 0"
grep -q 'run --steps 1' "$tmp/bf16s.log" || fail "no note on 16-bit drift"
"$@" -np 2 "$loom" verify "$tmp/cfg.json" --set bf16.enabled=true --set zero_optimization.stage=2 \
  > "$tmp/bf16z2.log" 2>&1
rc=$?
tail -2 "$tmp/bf16z2.log"
[ $rc -eq 0 ] || fail "verify of bf16 at ZeRO-2 on 2 ranks exited $rc"
grep -q '^final parameters: .* difference 0: every element equal$' "$tmp/bf16z2.log" ||
  fail "bf16 at ZeRO-2 on 2 ranks: final parameters not bitwise equal"

"$loom" verify "$tmp/cfg.json" > "$tmp/one.log" 2>&1
rc=$?
cat "$tmp/one.log"
[ $rc -ne 0 ] || fail "verify on one process exited 0"
grep -q 'loom launch -n 2 -- verify' "$tmp/one.log" || fail "no hint how to run verify"
echo PASS
