#!/usr/bin/env python3
"""Golden fixtures for the Llama family: LlamaForCausalLM (grouped K/V heads, rope_scaling
llama3, tied embeddings) and Qwen2ForCausalLM (q/k/v biases, untied head).

For each NAME in (llama_tiny, qwen2_tiny) it writes tests/fixtures/NAME/:
  config.json, model.safetensors   the random model, via save_pretrained (every parameter
                                   perturbed so norms are not ones and biases not zero)
  golden.safetensors               input_ids, targets I64 [3,16] (targets aligned with logits,
                                   -100 = ignored), logits F32 [3,16,V], loss F32 [1] (mean over
                                   valid targets), grad.<name> for every named parameter

Run from the repository root:  ~/.cache/loom/ref-venv/bin/python scripts/make_llama_fixtures.py
"""

import os

import torch
import transformers
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
B, T, V = 3, 16, 256

CONFIGS = {
    "llama_tiny": transformers.LlamaConfig(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        attention_bias=False, bos_token_id=1, eos_token_id=2),
    "qwen2_tiny": transformers.Qwen2Config(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
        use_sliding_window=False, bos_token_id=1, eos_token_id=2),
}


def make(name, cfg, seed):
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    model.eval()
    out = os.path.join(ROOT, name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    gen_cfg = os.path.join(out, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)

    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    for b in range(B):  # a different number of ignored targets per row
        targets[b, torch.randperm(T, generator=g)[: 2 + 2 * b]] = -100

    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
    loss.backward()
    tensors = {"input_ids": ids, "targets": targets, "logits": logits.detach().contiguous(),
               "loss": loss.detach().reshape(1)}
    for pname, p in model.named_parameters():
        tensors["grad." + pname] = p.grad.detach().contiguous()
    save_file(tensors, os.path.join(out, "golden.safetensors"),
              metadata={"torch": torch.__version__, "transformers": transformers.__version__})
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name}: loss {loss.item():.6f}, {len(list(model.parameters()))} params, {size / 1e6:.2f} MB")


def main():
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        make(name, cfg, seed=10 + i)


if __name__ == "__main__":
    main()
