#!/usr/bin/env python3
"""Check that a checkpoint folder written by Loom loads in transformers and gives
the same logits as Loom itself.

DIR must hold config.json and model.safetensors in Hugging Face GPT-2 layout.
The script:
  1. loads DIR with AutoModelForCausalLM.from_pretrained (eager attention,
     float32) and fails if transformers reports missing, unexpected or
     mismatched keys (apart from the attention-mask buffers transformers itself
     ignores for GPT-2: h.N.attn.bias / h.N.attn.masked_bias);
  2. runs `LOOM forward --model DIR --ids 1,2,3,... --out TMP.safetensors`, which
     writes `input_ids` I64 [1,T] and `logits` F32 [1,T,V];
  3. runs the same ids through the transformers model and compares the logits.
The ids are the UTF-8 bytes of a fixed English sentence (the demo model has a
byte-level vocabulary of 256), truncated to the model's n_positions. When DIR holds a
tokenizer.json (Loom writes one for a model that came from a GGUF file, from its tokenizer
metadata), the sentence is encoded by AutoTokenizer.from_pretrained(DIR) instead (no BOS),
Loom gets the text (`--text`) and must tokenize it to the same ids.

Prints one result line and exits 0 when max |logits_loom - logits_hf| <= --tol,
1 on any mismatch, load problem or Loom failure.

Usage (from the repository root):
    /root/loom-ref/bin/python scripts/check_hf_checkpoint.py DIR [--loom build/loom] [--tol 1e-4]
    /root/loom-ref/bin/python scripts/check_hf_checkpoint.py DIR --no-loom   # only step 1 and an HF forward
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

SENTENCE = "The quick brown fox jumps over the lazy dog, and the dog sleeps on."

# Buffers that old GPT-2 checkpoints carry and transformers ignores on load.
# Anchored so that e.g. a missing `attn.c_attn.bias` is NOT excused.
IGNORED_KEY = re.compile(r"(^|\.)h\.\d+\.(attn|crossattention)\.(bias|masked_bias)$")


def fail(msg):
    print(f"check_hf_checkpoint: FAIL {msg}")
    sys.exit(1)


def make_ids(config, model_dir):
    """SENTENCE through DIR's tokenizer, else its UTF-8 bytes truncated to the model's
    positions (and kept < vocab_size). Returns (ids, text Loom should encode or None)."""
    if os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(model_dir).encode(SENTENCE, add_special_tokens=False), SENTENCE
    n_pos = int(config.get("n_positions", config.get("max_position_embeddings", 1024)))
    vocab = int(config["vocab_size"])
    return [b % vocab for b in SENTENCE.encode("utf-8")][:n_pos], None


def load_hf(model_dir):
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            model_dir,
            attn_implementation="eager",
            dtype=torch.float32,
            output_loading_info=True,
        )
    except Exception as e:  # e.g. shape mismatches raise instead of being reported
        fail(f"{model_dir}: transformers cannot load it: {type(e).__name__}: {str(e).splitlines()[0]}")
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = [k if isinstance(k, str) else k[0] for k in info.get(kind, [])]
        keys = [k for k in keys if not IGNORED_KEY.search(k)]
        if keys:
            problems.append(f"{kind}={sorted(keys)}")
    for kind, keys in info.items():  # surface anything else transformers complains about
        if kind not in ("missing_keys", "unexpected_keys", "mismatched_keys") and keys:
            print(f"check_hf_checkpoint: note: loading info {kind}: {keys}", file=sys.stderr)
    if problems:
        fail(f"{model_dir}: transformers load reported " + "; ".join(problems))
    model.eval()
    return model


def run_loom(loom, model_dir, ids, text, tmpdir):
    out = os.path.join(tmpdir, "loom_forward.safetensors")
    given = ["--text", text] if text is not None else ["--ids", ",".join(map(str, ids))]
    cmd = [loom, "forward", "--model", model_dir, *given, "--out", out]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        fail(f"cannot run {loom}: {e}")
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        fail(f"`{' '.join(cmd[:2])} ...` exited with {proc.returncode}")
    if not os.path.exists(out):
        fail(f"{loom} forward wrote no {out}")
    return load_file(out)


def main():
    ap = argparse.ArgumentParser(description="Check a Loom checkpoint against transformers.")
    ap.add_argument("dir", help="checkpoint folder (config.json + model.safetensors)")
    ap.add_argument("--loom", default="build/loom", help="Loom executable (default build/loom)")
    ap.add_argument("--tol", type=float, default=1e-4, help="max abs logits error (default 1e-4)")
    ap.add_argument("--no-loom", action="store_true", help="only check that transformers loads DIR cleanly")
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg_path = os.path.join(args.dir, "config.json")
    if not os.path.isfile(cfg_path) or not os.path.isfile(os.path.join(args.dir, "model.safetensors")):
        fail(f"{args.dir}: needs config.json and model.safetensors")
    with open(cfg_path) as f:
        config = json.load(f)
    ids, text = make_ids(config, args.dir)

    model = load_hf(args.dir)
    with torch.no_grad():
        hf_logits = model(input_ids=torch.tensor([ids], dtype=torch.int64)).logits.float()

    if args.no_loom:
        ok = bool(torch.isfinite(hf_logits).all())
        status = "OK" if ok else "FAIL"
        print(f"check_hf_checkpoint: {status} {args.dir} loads cleanly in transformers "
              f"(T={len(ids)} V={hf_logits.shape[-1]}, Loom not run)")
        sys.exit(0 if ok else 1)

    with tempfile.TemporaryDirectory(prefix="loom_check_") as tmp:
        out = run_loom(args.loom, args.dir, ids, text, tmp)

    for name in ("input_ids", "logits"):
        if name not in out:
            fail(f"loom forward output lacks `{name}` (has {sorted(out)})")
    loom_ids, loom_logits = out["input_ids"], out["logits"]
    if loom_ids.dtype != torch.int64 or loom_ids.tolist() != [ids]:
        source = "transformers' ids" if text else "the ids passed"
        fail(f"loom input_ids {loom_ids.dtype} {loom_ids.tolist()} differ from {source} {ids}")
    if loom_logits.dtype != torch.float32 or loom_logits.shape != hf_logits.shape:
        fail(f"loom logits {loom_logits.dtype} {list(loom_logits.shape)}, "
             f"transformers gives float32 {list(hf_logits.shape)}")
    if not torch.isfinite(loom_logits).all():
        fail("loom logits contain NaN/Inf")

    diff = (loom_logits - hf_logits).abs()
    err = diff.max().item()
    where = list(torch.unravel_index(diff.argmax(), diff.shape))
    argmax_agree = (loom_logits.argmax(-1) == hf_logits.argmax(-1)).float().mean().item()
    status = "OK" if err <= args.tol else "FAIL"
    print(f"check_hf_checkpoint: {status} {args.dir} T={len(ids)}"
          f"{' (ids from its tokenizer.json, Loom equal)' if text else ''} V={hf_logits.shape[-1]} "
          f"max_abs_err={err:.3e} (at {[int(i) for i in where]}) tol={args.tol:g} "
          f"argmax_agree={argmax_agree:.3f}")
    sys.exit(0 if status == "OK" else 1)


if __name__ == "__main__":
    main()
