#!/usr/bin/env python3
"""Make the GPT-2 golden fixtures that Loom's C++ tests compare against.

What it makes, in tests/fixtures/gpt2_tiny/ (folder created, files overwritten):

  config.json, model.safetensors
      A randomly initialised transformers GPT2LMHeadModel (2 layers, d=64,
      4 heads, vocab 256, 32 positions, gelu_new, no dropout), every parameter
      perturbed by 0.02*randn so LayerNorm weights are not all ones and biases
      are not zero. Written with save_pretrained (HF layout: Conv1D weights are
      [in, out]; lm_head is tied to transformer.wte and not stored).

  golden.safetensors  (all F32 unless noted)
      input_ids          I64 [3,16]
      targets            I64 [3,16]   targets[b,t] labels logits[b,t]; -100 = ignore
      logits             [3,16,256]   model(input_ids).logits
      loss               [1]          mean cross-entropy over targets != -100
      grad.<name>        d loss / d param, one per model.named_parameters()
      train_input_ids    I64 [10,3,16]  batch of step s is train_input_ids[s]
      train_targets      I64 [10,3,16]
      train_losses       [10]         loss of step s, before its update
      train_grad_norms   [10]         pre-clip global grad L2 norm of step s
      train_lrs          [10]         learning rate used by step s
      final.<name>       parameters after the 10 AdamW steps
    plus string metadata with the optimiser / schedule hyper-parameters.

The 10-step run: AdamW(betas=(0.9,0.95), eps=1e-8), weight decay 0.1 on
parameters with dim >= 2 except the wte/wpe embeddings, 0 on the rest;
clip_grad_norm_(CLIP) each step; lr from DeepSpeed's WarmupCosineLR (linear
warmup). See lr_at_step().

Run from the repository root:

    /root/loom-ref/bin/python scripts/make_fixtures.py           # write fixtures
    /root/loom-ref/bin/python scripts/make_fixtures.py --probe   # only print the
        pre-clip norms of an unclipped run (used once to choose CLIP)
"""

import argparse
import copy
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gpt2_tiny")

VOCAB = 256
BATCH, SEQ = 3, 16
TRAIN_STEPS = 10

# Optimiser and schedule.
LR = 1e-3
BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.1
WARMUP_STEPS = 3
WARMUP_MIN_RATIO = 0.1
COS_MIN_RATIO = 0.1
# Chosen from `--probe` output (pre-clip norms of an unclipped run: 2.80, 3.02,
# 2.65, 2.65, 2.29, 2.18, 2.09, 2.15, 2.05, 1.96): the clipped run has norms
# above CLIP in its first steps and below it later; main() asserts both occur.
CLIP = 2.5

IGNORE = -100


def make_config():
    cfg = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        activation_function="gelu_new",
    )
    cfg._attn_implementation = "eager"  # plain matmul/softmax attention
    return cfg


def lr_at_step(s):
    """DeepSpeed WarmupCosineLR, warmup_type "linear", for 0-based step s."""
    if s < WARMUP_STEPS:
        ratio = WARMUP_MIN_RATIO + (1.0 - WARMUP_MIN_RATIO) * (s / WARMUP_STEPS)
    else:
        progress = (s - WARMUP_STEPS + 1) / (TRAIN_STEPS - WARMUP_STEPS)
        ratio = COS_MIN_RATIO + (1.0 - COS_MIN_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress))
        ratio = max(0.0, ratio)
    return LR * ratio


def random_batch(gen):
    """Random ids and aligned targets; each row gets a different number of -100s
    (2..6 of 16, about 25% on average) at random positions."""
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen, dtype=torch.int64)
    counts = (torch.randperm(5, generator=gen)[:BATCH] + 2).tolist()  # distinct counts in 2..6
    for b, n in enumerate(counts):
        pos = torch.randperm(SEQ, generator=gen)[:n]
        targets[b, pos] = IGNORE
    return ids, targets


def lm_loss(model, ids, targets):
    logits = model(input_ids=ids).logits
    loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=IGNORE)
    return logits, loss


def param_groups(model):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.dim() >= 2 and name not in ("transformer.wte.weight", "transformer.wpe.weight"):
            decay.append(p)
        else:
            no_decay.append(p)
    return [
        {"params": decay, "weight_decay": WEIGHT_DECAY},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def train(model, batches, clip):
    """Run len(batches) steps; return per-step losses, pre-clip norms and lrs."""
    model.train()  # dropout is 0, so train() and eval() compute the same thing
    params = [p for _, p in model.named_parameters()]
    opt = torch.optim.AdamW(param_groups(model), lr=LR, betas=BETAS, eps=EPS, foreach=False)
    losses, norms, lrs = [], [], []
    for s, (ids, targets) in enumerate(batches):
        opt.zero_grad()
        _, loss = lm_loss(model, ids, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=clip)
        lr = lr_at_step(s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
        lrs.append(lr)
    model.eval()
    return losses, norms, lrs


def sort_header_metadata(path):
    """Rewrite the safetensors header with __metadata__ keys sorted.

    save_file stores metadata from a hash map, so its key order (and thus the
    file's bytes) changes from run to run although the content does not. The
    sorted header has exactly the same length, so it is rewritten in place and
    re-running the script gives a byte-identical file."""
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        raw = f.read(n)
        header = json.loads(raw)
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        new = json.dumps(header, separators=(",", ":")).encode()
        new += b" " * (n - len(new))
        assert len(new) == n and json.loads(new) == json.loads(raw)
        f.seek(8)
        f.write(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", action="store_true", help="print unclipped grad norms and exit")
    ap.add_argument("--out", default=OUT_DIR, help="output folder (default tests/fixtures/gpt2_tiny)")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)

    # --- model -----------------------------------------------------------
    model = GPT2LMHeadModel(make_config())
    assert model.config._attn_implementation == "eager"
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.02 * torch.randn_like(p))
    model.eval()

    names = [n for n, _ in model.named_parameters()]
    assert model.lm_head.weight is model.transformer.wte.weight, "lm_head must be tied to wte"
    assert "lm_head.weight" not in names, "tied lm_head must not appear in named_parameters"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    initial = copy.deepcopy(model)  # fresh copy for the training run

    gen = torch.Generator().manual_seed(1234)
    input_ids, targets = random_batch(gen)
    train_batches = [random_batch(gen) for _ in range(TRAIN_STEPS)]

    if args.probe:
        _, norms, _ = train(initial, train_batches, clip=float("inf"))
        print("unclipped pre-clip norms:", ", ".join(f"{n:.4f}" for n in norms))
        print(f"min {min(norms):.4f}  max {max(norms):.4f}")
        return

    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    gen_cfg = os.path.join(args.out, "generation_config.json")
    if os.path.exists(gen_cfg):  # not part of the fixture; Loom does not write one
        os.remove(gen_cfg)

    # --- forward / backward on one batch ---------------------------------
    tensors = {"input_ids": input_ids, "targets": targets}
    model.zero_grad(set_to_none=True)
    logits, loss = lm_loss(model, input_ids, targets)
    loss.backward()
    tensors["logits"] = logits.detach().clone()
    tensors["loss"] = loss.detach().reshape(1).clone()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        tensors["grad." + name] = p.grad.detach().clone()
    print(f"loss {loss.item():.6f}  valid targets {(targets != IGNORE).sum().item()}/{targets.numel()}")

    # Round trip: the saved folder must reload to the same weights and logits.
    reloaded, info = GPT2LMHeadModel.from_pretrained(
        args.out, attn_implementation="eager", dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    reloaded.eval()
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), reloaded.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=input_ids).logits, tensors["logits"])

    # --- 10-step training run --------------------------------------------
    losses, norms, lrs = train(initial, train_batches, clip=CLIP)
    print("train losses:", ", ".join(f"{x:.4f}" for x in losses))
    print("pre-clip norms:", ", ".join(f"{x:.4f}" for x in norms), f"(CLIP={CLIP})")
    print("lrs:", ", ".join(f"{x:.6g}" for x in lrs))
    clipped = sum(n > CLIP for n in norms)
    assert 0 < clipped < TRAIN_STEPS, f"CLIP={CLIP} must clip some steps and not others ({clipped} clipped)"
    print(f"clipping active in {clipped}/{TRAIN_STEPS} steps")

    tensors["train_input_ids"] = torch.stack([b[0] for b in train_batches])
    tensors["train_targets"] = torch.stack([b[1] for b in train_batches])
    tensors["train_losses"] = torch.tensor(losses, dtype=torch.float32)
    tensors["train_grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    tensors["train_lrs"] = torch.tensor(lrs, dtype=torch.float32)
    for name, p in initial.named_parameters():
        tensors["final." + name] = p.detach().clone()

    metadata = {
        "lr": str(LR),
        "beta1": str(BETAS[0]),
        "beta2": str(BETAS[1]),
        "eps": str(EPS),
        "weight_decay": str(WEIGHT_DECAY),
        "clip": str(CLIP),
        "total_num_steps": str(TRAIN_STEPS),
        "warmup_num_steps": str(WARMUP_STEPS),
        "warmup_min_ratio": str(WARMUP_MIN_RATIO),
        "cos_min_ratio": str(COS_MIN_RATIO),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    golden_path = os.path.join(args.out, "golden.safetensors")
    save_file(tensors, golden_path, metadata=metadata)
    sort_header_metadata(golden_path)

    total = 0
    for fn in sorted(os.listdir(args.out)):
        size = os.path.getsize(os.path.join(args.out, fn))
        total += size
        print(f"{size:>10,d}  {os.path.relpath(os.path.join(args.out, fn))}")
    print(f"{total:>10,d}  total")
    if total > 2 * 1024 * 1024:
        print("warning: fixture folder is over 2 MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
