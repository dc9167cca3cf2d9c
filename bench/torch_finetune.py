#!/usr/bin/env python3
"""PyTorch (+ PEFT) reference for Loom's fine-tuning benchmark cases.

The model is read from the same GGUF file Loom trains (transformers' gguf_file loader,
weights dequantized to fp32: PyTorch has no CPU kernels for a Q4_1 base, so the quantized
case is compared with this fp32 one). One optimizer step = `--accum` micro-batches of
`--micro` sequences of `--seq` random token ids (forward, causal-LM loss, backward each),
clip_grad_norm_(1.0), AdamW (lr 1e-3, betas (0.9, 0.999), weight decay 0), zero_grad: the
demo config's step (configs/sft-smollm2-zh-lora.json), without dropout's randomness
mattering for speed.
  --mode lora: PEFT LoRA r=8, alpha 16, dropout 0.05 on the seven projections;
  --mode full: every parameter trained.
  --precision bf16: forward and loss under torch.autocast("cpu", torch.bfloat16) (fp32
  parameters, gradients and AdamW: the counterpart of Loom's bf16 section).
After --warmup steps it times --steps steps and prints ONE JSON line on stdout
({"case", "impl": "pytorch", "tokens_per_s", "peak_rss_mib", "ms_per_step", ...});
progress goes to stderr. The caller sets OMP_NUM_THREADS (and the wait policy: bench/run.sh).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description="PyTorch fine-tuning step benchmark")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--mode", choices=["lora", "full"], required=True)
    ap.add_argument("--case", required=True, help="the case name printed in the JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = ap.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = os.path.expanduser(args.gguf)
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), torch_dtype=torch.float32)
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    if args.mode == "lora":
        import peft

        cfg = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, task_type="CAUSAL_LM",
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                              "gate_proj", "up_proj", "down_proj"])
        model = peft.get_peft_model(model, cfg)
        versions += f", peft {peft.__version__}"
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    log(f"{versions}; threads {torch.get_num_threads()}; trainable "
        f"{sum(p.numel() for p in params) / 1e6:.2f}M of "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M")
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, vocab, (args.micro, args.seq), generator=g)
               for _ in range(args.accum)]

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step():
        total = 0.0
        for ids in batches:
            with autocast:
                loss = model(input_ids=ids, labels=ids).loss / args.accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    for i in range(args.warmup):
        t0 = time.perf_counter()
        loss = step()
        log(f"warmup {i}: {time.perf_counter() - t0:.2f} s, loss {loss:.4f}")
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
        log(f"step {i}: {times[-1]:.2f} s, loss {loss:.4f}")
    med = statistics.median(times)
    tokens = args.micro * args.accum * args.seq
    print(json.dumps({
        "case": args.case,
        "impl": "pytorch",
        "precision": args.precision,
        "tokens_per_s": round(tokens / med, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "ms_per_step": round(1e3 * med, 1),
        "tokens_per_step": tokens,
        "threads": torch.get_num_threads(),
        "versions": versions,
        "steps": args.steps,
    }, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
