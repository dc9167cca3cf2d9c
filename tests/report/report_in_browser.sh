#!/usr/bin/env bash
# `loom report` in a real browser: two runs on the tiny GPT-2 fixture (full fine-tuning and
# LoRA, 8 steps each) overlaid on one page, opened by headless Chromium (Debian's). The DOM
# the browser built must hold every chart, and each run's train-loss path a point per step;
# the screenshot it takes must show both runs' curve colours. The screenshot is kept as
# SHOT for a person to look at.
# Exits 77 (ctest: skipped) without chromium.
# usage: report_in_browser.sh LOOM SOURCE_DIR SHOT.png
set -u
loom=$1 src=$2 shot=$3
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome)
[ -n "$browser" ] || { echo "SKIP: no chromium (apt-get install chromium)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 - "$tmp" <<'PY'
import json, sys
with open(f"{sys.argv[1]}/sft.jsonl", "w") as f:
    for i in range(120):
        f.write(json.dumps({"prompt": f"what is {i % 17} plus {i % 5}?",
                            "response": f"it is {i % 17 + i % 5}."}) + "\n")
PY
for run in full lora; do
  peft='{}'
  [ $run = lora ] && peft='{"method": "lora", "r": 4, "lora_alpha": 8, "target_modules": "all-linear"}'
  cat > "$tmp/$run.json" <<JSON
{"model": "$src/tests/fixtures/gpt2_tiny",
 "data": {"path": "$tmp/sft.jsonl", "tokenizer": "bytes", "seq_len": 32, "valid_fraction": 0.1},
 "train_micro_batch_size_per_gpu": 4, "train_steps": 8, "eval_interval": 4,
 "optimizer": {"type": "AdamW", "params": {"lr": 5e-3}},
 "peft": $peft, "output_dir": "$tmp/$run"}
JSON
  [ $run = full ] && sed -i 's/"peft": {},//' "$tmp/$run.json"
  OMP_NUM_THREADS=1 "$loom" train "$tmp/$run.json" > "$tmp/$run.log" 2>&1 ||
    { cat "$tmp/$run.log"; fail "training $run"; }
done
"$loom" report "$tmp/full" "$tmp/lora" --out "$tmp/report.html" || fail "loom report"

flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run
       --user-data-dir="$tmp/profile")
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$tmp/report.html" > "$tmp/dom.html" \
  2> "$tmp/browser.log" || { cat "$tmp/browser.log"; fail "chromium --dump-dom"; }
timeout 120 "$browser" "${flags[@]}" --window-size=1320,1250 --screenshot="$shot" \
  "file://$tmp/report.html" >> "$tmp/browser.log" 2>&1 ||
  { cat "$tmp/browser.log"; fail "chromium --screenshot"; }

python3 - "$tmp/dom.html" "$shot" <<'PY' || exit 1
import re, struct, sys, zlib
dom, shot = open(sys.argv[1]).read(), sys.argv[2]
fail = lambda m: sys.exit(f"FAIL: {m}")
charts = re.findall(r'<svg class="chart" data-chart="(\w+)"', dom)
if charts != ["loss", "lr", "grad_norm", "tokens_per_s", "memory"]:
    fail(f"the browser's DOM has charts {charts}")
for run in ("full", "lora"):
    m = re.search(r'<path class="series" data-run="%s" data-series="train_loss" '
                  r'data-points="(\d+)"[^>]* d="([^"]+)"' % run, dom)
    if not m:
        fail(f"no train_loss path for {run} in the DOM")
    pts = re.findall(r"[ML]([0-9.]+),", m.group(2))
    if int(m.group(1)) != 8 or len(pts) != 8:
        fail(f"{run}: {len(pts)} points, expected one per step (8)")

# The screenshot: decode the PNG (8-bit RGB or RGBA, filters 0-4) and count each run's
# colour (#1f77b4 for the first, #d62728 for the second).
data = open(shot, "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n":
    fail("the screenshot is not a PNG")
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        if depth != 8 or ctype not in (2, 6):
            fail(f"unexpected PNG format (depth {depth}, colour type {ctype})")
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw, stride = zlib.decompress(idat), w * bpp
prev, counts = bytearray(stride), {(0x1f, 0x77, 0xb4): 0, (0xd6, 0x27, 0x28): 0}
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(w):
        px = tuple(line[x * bpp:x * bpp + 3])
        if px in counts:
            counts[px] += 1
    prev = line
if min(counts.values()) < 200:
    fail(f"the screenshot shows too little of the curves: pixels per run colour {counts}")
print(f"report_in_browser: OK (charts {charts}; {w}x{h} screenshot, run colour pixels "
      f"{list(counts.values())}; saved {shot})")
PY
