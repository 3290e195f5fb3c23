#!/usr/bin/env bash
# LiveCodeBench's own grader (`testing_util`, as published on PyPI in nvidia-livecodebench 26.3)
# in a scratch virtual environment under .cache/lcb-grader, for comparing its verdicts with the
# `lcb` reward's:
#   .cache/lcb-grader/bin/python rewards/code/scripts/lcb_agreement.py
# The wheel is checked against its sha256 and installed without its dependencies (model
# clients, datasets: the grader needs none of them); numpy is added because the grader, and the
# programs it accepts, import it. Needs python3 with the venv module. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../../.."
venv="${AREAL_LCB_GRADER:-.cache/lcb-grader}"
wheel=nvidia_livecodebench-26.3-py3-none-any.whl
sha256=d7d7cd2a5c3123b172ad138130abb53da9a81e8e47fb1e38ab66277030456fa8
ready() { "$venv/bin/python" -c 'import numpy, livecodebench' 2>/dev/null; }
if [ -x "$venv/bin/python" ] && ready; then
    echo "LiveCodeBench's grader is ready in $venv"
    exit 0
fi
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 1; }
python3 -m venv "$venv"
"$venv/bin/pip" download --quiet --no-deps -d "$venv/wheels" 'nvidia-livecodebench==26.3'
echo "$sha256  $venv/wheels/$wheel" | sha256sum --check --quiet \
    || { echo "$wheel does not have the sha256 this script pins" >&2; exit 1; }
"$venv/bin/pip" install --quiet --no-deps "$venv/wheels/$wheel"
"$venv/bin/pip" install --quiet 'numpy==1.26.4'
ready && echo "LiveCodeBench's grader installed in $venv"
