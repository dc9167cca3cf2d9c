#!/usr/bin/env python3
"""Golden fixture for the default model: transformers loads SmolLM2-135M-Instruct from the
same GGUF file Loom reads (gguf_file=..., dequantized to float32) and runs a fixed chat
prompt. Writes tests/fixtures/smollm2/golden.safetensors:
  input_ids   I64 [1, T]   the ChatML prompt "What is the capital of France?" with the
                           generation prompt, tokenized by transformers' GGUF tokenizer
  logits_tail F32 [3, V]   logits of the last 3 positions (full rows; the whole [T, V]
                           would be several MB)
  argmax      I64 [T]      argmax of every position
  greedy      I64 [N]      transformers' greedy continuation (16 tokens)
Needs the GGUF (scripts/fetch_default_model.sh) and torch, transformers, gguf, accelerate.
Run: ~/.cache/loom/ref-venv/bin/python scripts/make_smollm2_fixture.py
"""
import os, subprocess, sys

import torch
import transformers
from safetensors.torch import save_file

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
gguf = subprocess.check_output(["bash", os.path.join(root, "scripts", "fetch_default_model.sh")], text=True).strip()
d, name = os.path.split(gguf)
tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
msgs = [{"role": "user", "content": "What is the capital of France?"}]
text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
with torch.no_grad():
    logits = model(ids).logits[0]
    greedy = model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:]
out = os.path.join(root, "tests", "fixtures", "smollm2")
os.makedirs(out, exist_ok=True)
save_file({"input_ids": ids.contiguous(), "logits_tail": logits[-3:].contiguous(),
           "argmax": logits.argmax(-1).contiguous(), "greedy": greedy.contiguous()},
          os.path.join(out, "golden.safetensors"),
          metadata={"prompt": text, "transformers": transformers.__version__, "gguf": name})
print(repr(text), ids.shape, "->", repr(tok.decode(greedy)))
