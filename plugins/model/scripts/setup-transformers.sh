#!/usr/bin/env bash
# Hugging Face transformers, PEFT and PyTorch (CPU use) in a scratch virtual environment under
# .cache/transformers, for the model plugin's parity fixtures (LoRA's too) and `areal bench
# model`'s PyTorch rows:
#   .cache/transformers/bin/python plugins/model/scripts/make_parity_fixtures.py
#   .cache/transformers/bin/python plugins/model/scripts/make_lora_fixtures.py
# Nothing that `areal` needs to run or test comes from here: the fixtures it writes are
# committed. Versions are pinned; PyPI's torch wheel brings its CUDA libraries along (about
# 3 GB), which a CPU run never loads. transformers 5 needs a `kernels` release that is not
# published for this Python, so the last 4.x is pinned. Needs python3 with the venv module. Idempotent.
#
# With --no-torch: transformers and Jinja alone, under .cache/transformers-light (a minute, no
# PyTorch), which is all the chat-template fixtures need:
#   .cache/transformers-light/bin/python plugins/model/scripts/make_chat_fixtures.py
set -euo pipefail
cd "$(dirname "$0")/../../.."
if [ "${1:-}" = "--no-torch" ]; then
    venv="${AREAL_TRANSFORMERS_VENV:-.cache/transformers-light}"
    ready() { "$venv/bin/python" -c 'import transformers, jinja2' 2>/dev/null; }
    packages=('transformers==4.57.6' 'jinja2')
else
    venv="${AREAL_TRANSFORMERS_VENV:-.cache/transformers}"
    ready() { "$venv/bin/python" -c 'import torch, transformers, peft, safetensors, jinja2' 2>/dev/null; }
    packages=('torch==2.9.1' 'transformers==4.57.6' 'peft==0.17.1' 'safetensors' 'jinja2' 'numpy')
fi
if [ -x "$venv/bin/python" ] && ready; then
    echo "transformers is ready in $venv"
    exit 0
fi
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 1; }
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet "${packages[@]}"
ready && echo "transformers installed in $venv: $("$venv/bin/python" -c 'import transformers; print("transformers", transformers.__version__)' 2>/dev/null)"
