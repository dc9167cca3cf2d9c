#!/usr/bin/env python3
"""Check that an adapter folder written by Loom loads in Hugging Face PEFT and gives the same
logits as Loom itself.

ADAPTER must hold adapter_config.json and adapter_model.safetensors (LoRA or Prefix Tuning).
BASE is the base model as transformers loads it: an HF folder, or a .gguf file (loaded with
transformers' gguf_file=, dequantized). The script:
  1. loads BASE with AutoModelForCausalLM (eager attention, float32), then
     PeftModel.from_pretrained(base, ADAPTER) and fails if PEFT reports missing or
     unexpected adapter keys;
  2. runs `LOOM forward --model ADAPTER --base BASE --ids ... --out TMP.safetensors`;
  3. compares the logits of the same ids.
The ids are a fixed sequence below the vocabulary size.
With --merge (LoRA only) step 1 builds the reference without PEFT: every lora_A/lora_B pair
is merged into the base weight in torch, W += (alpha / r) B A (alpha / sqrt(r) with
use_rslora); a routed expert's pair (...mlp.experts.<e>.{gate,up,down}_proj, Linear modules
in transformers 4 and in Loom) goes into the slices of transformers 5's fused expert
parameters (experts.gate_up_proj [E, 2I, C]: gate rows then up rows; experts.down_proj
[E, C, I]). That is for adapters PEFT cannot hold one-to-one.

Prints one result line; exits 0 when max |logits_loom - logits_peft| <= --tol, else 1.

Usage (from the repository root):
    ~/.cache/loom/ref-venv/bin/python scripts/check_peft_adapter.py ADAPTER BASE \
        [--loom build/loom] [--tol 1e-4]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def fail(msg):
    print(f"check_peft_adapter: FAIL {msg}")
    sys.exit(1)


def load_base(base):
    base = os.path.expanduser(base)
    kw = dict(attn_implementation="eager", dtype=torch.float32)
    if base.endswith(".gguf"):
        return AutoModelForCausalLM.from_pretrained(os.path.dirname(base) or ".",
                                                    gguf_file=os.path.basename(base), **kw)
    return AutoModelForCausalLM.from_pretrained(base, **kw)


def merged(base, adapter):
    """The base with every LoRA pair of `adapter` merged into its weights (see --merge)."""
    cfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
    if cfg.get("peft_type") != "LORA":
        fail("--merge takes a LoRA adapter")
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / (r ** 0.5) if cfg.get("use_rslora") else alpha / r
    tensors = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    params = dict(base.named_parameters())
    done = 0
    with torch.no_grad():
        for key, a in tensors.items():
            if not key.endswith(".lora_A.weight"):
                continue
            module = key[: -len(".lora_A.weight")].removeprefix("base_model.model.")
            delta = scale * (tensors[key.replace("lora_A", "lora_B")] @ a)
            if module + ".weight" in params:
                params[module + ".weight"].add_(delta)
            else:  # a routed expert: <layer>.mlp.experts.<e>.<proj>
                experts, e, proj = module.rsplit(".", 2)
                e = int(e)
                if proj == "down_proj":
                    params[experts + ".down_proj"][e].add_(delta)
                else:
                    fused = params.get(experts + ".gate_up_proj")
                    if fused is None:
                        fail(f"--merge: no weight for {module}")
                    inter = fused.shape[1] // 2
                    rows = slice(0, inter) if proj == "gate_proj" else slice(inter, 2 * inter)
                    fused[e, rows].add_(delta)
            done += 1
    if done == 0:
        fail("--merge: the adapter holds no lora_A/lora_B pairs")
    return base


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("adapter")
    ap.add_argument("base")
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--len", type=int, default=24)
    ap.add_argument("--merge", action="store_true")
    args = ap.parse_args()

    base = load_base(args.base)
    vocab = base.config.vocab_size
    if args.merge:
        model = merged(base, args.adapter)
    else:
        try:
            model = PeftModel.from_pretrained(base, args.adapter)
        except Exception as e:  # noqa: BLE001 - report any load problem as a failure
            fail(f"PeftModel.from_pretrained: {e}")
    model.eval()
    ids = [(i * 7919 + 13) % vocab for i in range(args.len)]

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.safetensors")
        cmd = [args.loom, "forward", "--model", args.adapter, "--base", args.base,
               "--ids", ",".join(map(str, ids)), "--out", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"loom forward exited {r.returncode}: {r.stderr.strip()}")
        ours = load_file(out)["logits"]
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor([ids])).logits
    if ours.shape != theirs.shape:
        fail(f"logits shape {tuple(ours.shape)} vs PEFT's {tuple(theirs.shape)}")
    err = (ours - theirs).abs().max().item()
    agree = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    status = "OK" if err <= args.tol else "FAIL"
    print(f"check_peft_adapter: {status} {args.adapter} on {args.base}: "
          f"{'LORA merged in torch' if args.merge else model.peft_config['default'].peft_type} "
          f"T={len(ids)} V={vocab} "
          f"max_abs_err={err:.3e} tol={args.tol} argmax_agree={agree:.3f}")
    sys.exit(0 if status == "OK" else 1)


if __name__ == "__main__":
    main()
