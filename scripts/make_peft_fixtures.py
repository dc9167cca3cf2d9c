#!/usr/bin/env python3
"""Golden fixtures for parameter-efficient fine-tuning, made with Hugging Face `peft` on the
tiny random base models the other fixture scripts commit (tests/fixtures/gpt2_tiny and
llama_tiny, which has grouped K/V heads).

For each NAME it writes tests/fixtures/peft/NAME/:
  adapter_config.json, adapter_model.safetensors
      the adapter exactly as PeftModel.save_pretrained writes it (LoRA B perturbed away
      from zero so that every LoRA tensor gets a gradient)
  golden.safetensors
      input_ids, targets I64 [3, 12] (targets aligned with logits, -100 = ignored),
      logits F32 [3, 12, V], loss F32 [1], and for every trainable tensor
      param.<name> (its value) and grad.<name> (its gradient), where <name> is the name Loom
      gives it: PEFT's name without "base_model.model." and the adapter name ("default"),
      and "prompt_encoder." read as "prefix_encoder."

  gpt2_lora     LoRA r=4 alpha=8 on c_attn, c_proj, c_fc (Conv1D layers)
  llama_lora    LoRA r=4 alpha=16 rsLoRA on all seven projections
  gpt2_prefix   Prefix Tuning, 3 virtual tokens, table trained directly
  llama_prefix  Prefix Tuning, 3 virtual tokens, prefix_projection (MLP, hidden 24), GQA

Run from the repository root:  ~/.cache/loom/ref-venv/bin/python scripts/make_peft_fixtures.py
"""

import json
import os

import peft
import torch
import transformers
from safetensors.torch import save_file

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
B, T = 3, 12

CONFIGS = {
    "gpt2_lora": ("gpt2_tiny", peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], lora_dropout=0.0,
        fan_in_fan_out=True, task_type="CAUSAL_LM")),
    "llama_lora": ("llama_tiny", peft.LoraConfig(
        r=4, lora_alpha=16, use_rslora=True, lora_dropout=0.0, task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"])),
    "gpt2_prefix": ("gpt2_tiny", peft.PrefixTuningConfig(
        num_virtual_tokens=3, prefix_projection=False, task_type="CAUSAL_LM")),
    "llama_prefix": ("llama_tiny", peft.PrefixTuningConfig(
        num_virtual_tokens=3, prefix_projection=True, encoder_hidden_size=24,
        task_type="CAUSAL_LM")),
}


def loom_name(peft_name):
    n = peft_name.replace(".default", "")
    n = n.removeprefix("base_model.model.")
    return n.replace("prompt_encoder.", "prefix_encoder.")


def make(name, base, cfg, seed):
    torch.manual_seed(seed)
    base_dir = os.path.join(FIX, base)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        base_dir, attn_implementation="eager", dtype=torch.float32)
    model = peft.get_peft_model(model, cfg)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "lora_B" in pname:
                p.normal_(0.0, 0.05)
            elif p.requires_grad and "prompt_encoder" in pname:
                p.add_(0.02 * torch.randn_like(p))  # not PEFT's init exactly: any values do
    model.eval()

    out = os.path.join(FIX, "peft", name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    # base_model_name_or_path: where Loom's tests find the base, relative to the fixture.
    cfg_path = os.path.join(out, "adapter_config.json")
    with open(cfg_path) as f:
        ac = json.load(f)
    ac["base_model_name_or_path"] = "../../" + base
    with open(cfg_path, "w") as f:
        json.dump(ac, f, indent=2, sort_keys=True)
    readme = os.path.join(out, "README.md")
    if os.path.exists(readme):
        os.remove(readme)

    V = model.config.vocab_size
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    for b in range(B):
        targets[b, torch.randperm(T, generator=g)[: 1 + 2 * b]] = -100
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                                             ignore_index=-100)
    loss.backward()
    tensors = {"input_ids": ids, "targets": targets, "logits": logits.detach().contiguous(),
               "loss": loss.detach().reshape(1)}
    for pname, p in model.named_parameters():
        if p.requires_grad:
            tensors["param." + loom_name(pname)] = p.detach().contiguous()
            tensors["grad." + loom_name(pname)] = p.grad.detach().contiguous()
    save_file(tensors, os.path.join(out, "golden.safetensors"),
              metadata={"torch": torch.__version__, "transformers": transformers.__version__,
                        "peft": peft.__version__})
    n = sum(1 for k in tensors if k.startswith("grad."))
    print(f"{name}: loss {loss.item():.6f}, {n} trainable tensors")


def main():
    for i, (name, (base, cfg)) in enumerate(CONFIGS.items()):
        make(name, base, cfg, seed=40 + i)


if __name__ == "__main__":
    main()
