#!/usr/bin/env python3
"""Golden bf16 logits from transformers for the tiny GPT-2 and Llama fixtures.

For each of tests/fixtures/gpt2_tiny and tests/fixtures/llama_tiny (made by
make_fixtures.py / make_llama_fixtures.py; their weights are not touched), loads
the saved folder with transformers in bfloat16 (dtype=torch.bfloat16, eager
attention: every weight and every activation in bf16, as users run a bf16 model)
and in float32, runs both on the golden file's input_ids and writes

  golden_bf16.safetensors
      input_ids      I64 [3,16]   the same ids as golden.safetensors
      logits_bf16    F32 [3,16,V] the bf16 model's logits, widened exactly
      logits_fp32    F32 [3,16,V] the fp32 model's logits (equal to golden's)

The C++ test (tests/golden/test_bf16_golden.cpp) compares Loom's bf16 forward
with both. Run from the repository root with the reference venv:

    ~/.cache/loom/ref-venv/bin/python scripts/make_bf16_fixtures.py
"""

import os

import torch
import transformers
from safetensors.torch import load_file, save_file

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")


def main():
    torch.manual_seed(0)
    for name in ("gpt2_tiny", "llama_tiny"):
        folder = os.path.join(FIXTURES, name)
        ids = load_file(os.path.join(folder, "golden.safetensors"))["input_ids"]
        out = {"input_ids": ids.contiguous()}
        for dtype, key in ((torch.bfloat16, "logits_bf16"), (torch.float32, "logits_fp32")):
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, attn_implementation="eager")
            model.eval()
            assert all(p.dtype == dtype for p in model.parameters())
            with torch.no_grad():
                out[key] = model(input_ids=ids).logits.float().contiguous()
        diff = (out["logits_bf16"] - out["logits_fp32"]).norm() / out["logits_fp32"].norm()
        print(f"{name}: bf16 vs fp32 logits, relative L2 {diff.item():.3e}")
        save_file(out, os.path.join(folder, "golden_bf16.safetensors"),
                  metadata={"torch": torch.__version__, "transformers": transformers.__version__})


if __name__ == "__main__":
    main()
