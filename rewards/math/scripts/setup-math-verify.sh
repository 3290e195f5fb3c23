#!/usr/bin/env bash
# Math-Verify 0.9.0 (the Python reference verifier) in a virtual environment under
# .cache/math-verify, for `areal bench math` and for comparing verdicts:
#   .cache/math-verify/bin/python rewards/math/scripts/math_verify_ref.py < pairs.jsonl
# Installs from PyPI; needs python3 with the venv module. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../../.."
venv="${AREAL_MATH_VERIFY:-.cache/math-verify}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import math_verify' 2>/dev/null; then
    echo "Math-Verify is ready in $venv"
    exit 0
fi
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 1; }
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet 'math-verify==0.9.0'
"$venv/bin/python" -c 'import math_verify; print("Math-Verify installed in '"$venv"'")'
