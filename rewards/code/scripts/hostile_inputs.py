#!/usr/bin/env python3
"""Write the hostile inputs of issue 14's figures into OUTDIR, for timing by hand:

    python3 rewards/code/scripts/hostile_inputs.py OUTDIR
    /usr/bin/time -f '%e s, %M KB' target/release/areal grade code OUTDIR/dict.jsonl
    /usr/bin/time -f '%e s, %M KB' target/release/areal grade code OUTDIR/deep.jsonl
    /usr/bin/time -f '%e s, %M KB' target/release/areal grade code OUTDIR/bomb.jsonl
    target/release/areal grade math OUTDIR/numbers.jsonl

- dict.jsonl: a call test whose answer is a dict of 100 000 keys, expected in reverse order;
- deep.jsonl: a call test whose answer is a list nested 10 000 deep;
- bomb.jsonl: a record whose private tests are a 1.4 MB zlib bomb of a 1.4 GB pickled string;
- numbers.jsonl: maths answers of 50 000-digit integers and 200 000-digit decimals.
Standard library only."""
import base64
import json
import os
import struct
import sys
import zlib


def call_record(qid, func, arg, output, code):
    tests = [{"input": arg, "output": output, "testtype": "functional"}]
    return {
        "question_id": qid,
        "public_test_cases": json.dumps(tests),
        "metadata": json.dumps({"func_name": func}),
        "code": code,
    }


def main(out):
    os.makedirs(out, exist_ok=True)
    n = 100_000
    want = "{" + ", ".join('"%d": %d' % (i, i) for i in reversed(range(n))) + "}"
    code = "def table(n):\n    return {str(i): i for i in range(n)}"
    write(out, "dict.jsonl", [call_record("dict", "table", str(n), want, code)])

    d = 10_000
    code = "def nest(n):\n    v = 1\n    for _ in range(n):\n        v = [v]\n    return v"
    write(out, "deep.jsonl", [call_record("deep", "nest", str(d), "[" * d + "1" + "]" * d, code)])

    size = 1400 << 20
    z = zlib.compressobj(9)
    parts = [z.compress(b"\x80\x04\x8d" + struct.pack("<Q", size))]
    chunk = b"x" * (1 << 20)
    for _ in range(size >> 20):
        parts.append(z.compress(chunk))
    parts += [z.compress(b"\x94."), z.flush()]
    bomb = {
        "question_id": "bomb",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": base64.b64encode(b"".join(parts)).decode(),
        "code": "print(sum(map(int, input().split())))",
    }
    write(out, "bomb.jsonl", [bomb])

    ones = lambda k: "1" * k
    write(out, "numbers.jsonl", [
        {"gold": ones(50_000), "pred": "$\\boxed{%s}$" % ones(50_000)},
        {"gold": ones(50_000), "pred": "$\\boxed{%s2}$" % ones(49_999)},
        {"gold": "0." + ones(200_000), "pred": "$\\boxed{0.%s}$" % ones(200_000)},
        {"gold": "0." + ones(200_000), "pred": "$\\boxed{0.%s2}$" % ones(199_999)},
    ])


def write(out, name, records):
    with open(os.path.join(out, name), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
