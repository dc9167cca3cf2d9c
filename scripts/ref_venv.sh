#!/usr/bin/env bash
# Creates the reference virtual environment (torch, transformers, peft, gguf, safetensors,
# numpy from PyPI) outside the repo, once. torch's Linux wheel brings several GB of CUDA
# libraries, so neither CI nor `make test` needs it: only fixtures, the HF/PEFT load checks
# and the bench.
set -euo pipefail
venv=${1:-$HOME/.cache/loom/ref-venv}
if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" -c "import torch, transformers, safetensors, peft, gguf, tensorboard" 2>/dev/null; then
  exit 0
fi
echo "ref_venv: creating $venv (torch + transformers + peft; several GB, a few minutes)"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q torch transformers safetensors numpy peft gguf tensorboard
