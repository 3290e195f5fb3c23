#!/usr/bin/env bash
# OpenAI's official Python client in a scratch virtual environment under .cache/openai, for
# agent programs written as users write them (examples/agents/, the proxy's tests and
# `areal bench proxy`):
#   .cache/openai/bin/python examples/agents/tool_agent.py
# Nothing `areal` needs to run comes from here. The version is pinned. Needs python3 with the
# venv module. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../../.."
venv="${AREAL_OPENAI_VENV:-.cache/openai}"
ready() { "$venv/bin/python" -c 'import openai' 2>/dev/null; }
if [ -x "$venv/bin/python" ] && ready; then
    echo "openai is ready in $venv"
    exit 0
fi
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 1; }
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet 'openai==3.60.0'
ready && echo "openai installed in $venv: $("$venv/bin/python" -c 'import openai; print(openai.__version__)')"
