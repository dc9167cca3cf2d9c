#!/usr/bin/env python3
"""PyTorch reference for Loom's training-step benchmark.

Model: nanoGPT-style GPT-2 small in plain torch (not transformers): 12 layers,
d=768, 12 heads, vocab 50304, 1024 positions, pre-LN blocks, GELU(tanh), tied
LM head, no dropout, biases everywhere, fp32, causal
F.scaled_dot_product_attention.

One step = zero_grad(set_to_none=True), forward on B=4 x T=64 random token ids,
cross-entropy loss, backward, clip_grad_norm_(1.0), AdamW(lr=6e-4,
betas=(0.9, 0.95), weight_decay=0.1) step. After --warmup steps (default 3) it
times --steps steps (default 10, at least 10) and prints ONE JSON line on
stdout:

  {"impl":"pytorch","ms_per_step":<median>,"tokens_per_s":<B*T/median>,
   "peak_rss_mib":...,"threads":N,"torch":"2.x", ...}

Everything else goes to stderr. Run (bench/run.sh sets the environment, as for Loom):

    ~/.cache/loom/ref-venv/bin/python bench/torch_step.py [--threads 2] [--steps 10]
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def log(*args):
    print(*args, file=sys.stderr, flush=True)


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer=12, d=768, n_head=12, vocab=50304, block_size=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block_size, d)
        self.h = nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        # GPT-2 initialisation (values do not matter for speed, but keep them sane)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description="PyTorch GPT-2 small training-step benchmark")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (>= 10)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: forward and loss under torch.autocast('cpu', torch.bfloat16)")
    args = ap.parse_args()
    if args.steps < 10:
        ap.error("--steps must be >= 10")

    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        log(f"warning: OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')!r}, expected PASSIVE "
            "(spinning OpenMP threads distort timings)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    vocab = 50304
    model = GPT(vocab=vocab)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"torch {torch.__version__}, threads {torch.get_num_threads()}, params {n_params / 1e6:.2f}M, "
        f"B={args.batch} T={args.seq}")
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    idx = torch.randint(0, vocab, (args.batch, args.seq))
    targets = torch.randint(0, vocab, (args.batch, args.seq))

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for i in range(args.warmup):
        t0 = time.perf_counter()
        loss = step()
        log(f"warmup {i}: {1e3 * (time.perf_counter() - t0):.1f} ms, loss {loss:.4f}")
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
        log(f"step {i}: {1e3 * times[-1]:.1f} ms, loss {loss:.4f}")

    med = statistics.median(times)
    result = {
        "case": "gpt2-124m",
        "impl": "pytorch",
        "precision": args.precision,
        "ms_per_step": round(1e3 * med, 2),
        "tokens_per_s": round(args.batch * args.seq / med, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # KiB on Linux
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "batch": args.batch,
        "seq": args.seq,
        "steps": args.steps,
        "ms_min": round(1e3 * min(times), 2),
        "ms_max": round(1e3 * max(times), 2),
    }
    print(json.dumps(result, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
