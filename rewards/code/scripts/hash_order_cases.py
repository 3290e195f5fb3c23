#!/usr/bin/env python3
"""Write rewards/code/tests/fixtures/hash_order.jsonl: what 64-bit CPython 3.11 prints running
tests/fixtures/hash_order.py (the iteration order of random sets and frozensets of tuples,
large ints, floats, strings, frozensets and other numbers, and random hash() values, 250 cases
a seed) for seeds 0-19, with PYTHONHASHSEED=0 as in the sandbox's snapshot:

    python3.11 rewards/code/scripts/hash_order_cases.py > rewards/code/tests/fixtures/hash_order.jsonl

The guest must print exactly this (`rewards/code/tests/grading/second_pass.rs`)."""
import json
import os
import pathlib
import subprocess
import sys

assert sys.version_info[:2] == (3, 11), "the guest is CPython 3.11"
assert sys.maxsize == 2**63 - 1, "the reference is 64-bit CPython"
program = pathlib.Path(__file__).parents[1] / "tests" / "fixtures" / "hash_order.py"
env = dict(os.environ, PYTHONHASHSEED="0")
for seed in range(20):
    out = subprocess.run([sys.executable, str(program)], input=f"{seed}\n", env=env,
                         capture_output=True, text=True, check=True).stdout
    print(json.dumps({"seed": seed, "output": out}))
