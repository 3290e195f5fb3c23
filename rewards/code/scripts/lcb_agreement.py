"""The `lcb` reward's verdicts against LiveCodeBench's own grader, program by program.

Run with the interpreter of the scratch environment that rewards/code/scripts/setup-lcb-grader.sh
makes, from the repository's root, after a release build:

    .cache/lcb-grader/bin/python rewards/code/scripts/lcb_agreement.py [--areal target/release/areal]

For every record of rewards/code/tests/fixtures/lcb_reference.jsonl and lcb_agreement.jsonl
(46 real LiveCodeBench problems, 30 stdin and 16 call-based, from ../shared/data/lcb/, each with
a reference solution written for this repository in `code`), the programs are the
solution and the mistakes models make, written from it: an exception after printing, extra
output, an off-by-one or a string returned instead of a number, input read in unusual ways,
a solution too slow for the limit, a numpy integer returned, solutions written with numpy (8
problems), and the cases where the two graders are known to differ
(docs/sandbox.md, "Where our verdicts differ from LiveCodeBench's"). Each is graded natively
by LiveCodeBench's `run_test` (in a child process, with the timeout LiveCodeBench's own
`check_correctness` gives it) and by `areal grade code`. Prints the confusion table of
pass/fail, the verdicts side by side, and every disagreement with its diagnosis: the row of
docs/sandbox.md it is, or UNEXPECTED.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
RECORDS = [
    os.path.join(ROOT, "rewards/code/tests/fixtures", name)
    for name in ("lcb_reference.jsonl", "lcb_agreement.jsonl")
]
TIMEOUT = 6  # LiveCodeBench's per-test limit, seconds

# The child that runs LiveCodeBench's grader on one program: testing_util is loaded from its
# file (the package's __init__ imports model clients this environment does not have).
NATIVE = r"""
import importlib.util, json, sys
import livecodebench
path = livecodebench.__path__[0] + "/evaluation/testing_util.py"
spec = importlib.util.spec_from_file_location("testing_util", path)
tu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tu)
job = json.loads(sys.stdin.read())
real_stdout = sys.stdout
results, meta = tu.run_test({"input_output": job["input_output"]}, test=job["code"], timeout=job["timeout"])
real_stdout.write("\n\x1elcb-result\x1e" + json.dumps({"results": [r if isinstance(r, (bool, int)) else bool(r) for r in results], "meta": {k: str(v) for k, v in meta.items()}}))
"""

CODES = {-2: "wrong_answer", -3: "time_limit", -4: "runtime_error", -1: "time_limit"}


def lcb_verdict(record, code, tests, python):
    """LiveCodeBench's verdict on `code` and its message."""
    meta = json.loads(record.get("metadata") or "{}")
    io = {
        "inputs": [t["input"] for t in tests],
        "outputs": [t["output"] for t in tests],
        "fn_name": meta.get("func_name"),
    }
    job = {"input_output": json.dumps(io), "code": code, "timeout": TIMEOUT}
    # check_correctness's global timeout: (timeout + 1) per test, plus 5 s
    limit = (TIMEOUT + 1) * len(tests) + 5
    try:
        out = subprocess.run(
            [python, "-c", NATIVE],
            input=json.dumps(job).encode(),
            capture_output=True,
            timeout=limit,
        )
    except subprocess.TimeoutExpired:
        return "time_limit", "the whole run passed %d s" % limit
    text = out.stdout.decode("utf-8", "replace")
    mark = "\x1elcb-result\x1e"
    if mark not in text:
        return "runtime_error", "the grader's process died: " + out.stderr.decode("utf-8", "replace")[-300:]
    report = json.loads(text.rsplit(mark, 1)[1])
    results = report["results"]
    if results and all(r is True for r in results) and len(results) == len(tests):
        return "accepted", None
    bad = next((r for r in results if r is not True), None)
    if bad is False or bad is None:
        # compile_code returning None leaves no result: a compile error
        return ("wrong_answer" if results else "runtime_error"), report["meta"].get("error_message")
    return CODES.get(bad, "runtime_error"), report["meta"].get("error_message") or report["meta"].get("error")


def wrap_method(code, func, body):
    """A call-based solution whose method's result goes through `body` (an expression of `r`)."""
    return code + (
        "\n\n_areal_m = Solution.%s\n"
        "def _areal_w(self, *a):\n"
        "    r = _areal_m(self, *a)\n"
        "    return %s\n"
        "Solution.%s = _areal_w\n" % (func, body, func)
    )


BUSY = "_t = 0\nfor _i in range(%d):\n    _t += _i\n"

# (name, kind it applies to, program from (code, func, expected outputs) or None, the
# docs/sandbox.md row a disagreement is expected from, or None: the graders must agree)
VARIANTS = [
    ("correct", "any", lambda c, f, o: c, None),
    ("raises after printing", "stdin", lambda c, f, o: c + "\nraise RuntimeError('after printing')\n", None),
    ("extra output line", "stdin", lambda c, f, o: c + "\nprint('extra')\n", None),
    ("trailing blank lines", "stdin", lambda c, f, o: c + "\nprint()\nprint('   ')\n", None),
    (
        "reads with sys.stdin.readline",
        "stdin",
        lambda c, f, o: ("import sys\n" + c.replace("input()", "sys.stdin.readline()")) if "input()" in c else None,
        None,
    ),
    (
        "reads all of stdin at once",
        "stdin",
        lambda c, f, o: "import sys\n_lines = iter(sys.stdin.read().split('\\n'))\ninput = lambda: next(_lines)\n" + c,
        None,
    ),
    (
        "reads with open(0)",
        "stdin",
        lambda c, f, o: "_lines = iter(open(0).read().split('\\n'))\ninput = lambda: next(_lines)\n" + c,
        "open(0) bypasses LiveCodeBench's captured streams",
    ),
    ("calls quit() at the end", "stdin", lambda c, f, o: c + "\nquit()\n", "quit is None in LiveCodeBench"),
    (
        "a module-level global",
        "stdin",
        lambda c, f, o: "count = 0\ndef bump():\n    global count\n    count += 1\nbump()\n" + c,
        "code wrapped in a function breaks `global`",
    ),
    (
        "slow, near the limit",
        "stdin-few",
        lambda c, f, o: BUSY % 50_000_000 + c,
        None,
    ),
    ("too slow", "stdin-few", lambda c, f, o: BUSY % 400_000_000 + c, None),
    ("returns a tuple", "call", lambda c, f, o: wrap_method(c, f, "tuple(r) if isinstance(r, list) else r"), None),
    (
        "returns a string",
        "call",
        lambda c, f, o: None if any(x.strip().startswith('"') for x in o) else wrap_method(c, f, "str(r)"),
        None,
    ),
    (
        "off by one",
        "call",
        lambda c, f, o: wrap_method(c, f, "r + 1 if type(r) is int else r") if all(x.strip().lstrip("-").isdigit() for x in o) else None,
        None,
    ),
    (
        "returns a Fraction",
        "call",
        lambda c, f, o: "from fractions import Fraction\n" + wrap_method(c, f, "Fraction(r) if type(r) is int else r"),
        None,
    ),
    (
        "returns a numpy integer",
        "call",
        lambda c, f, o: "import numpy as np\n" + wrap_method(c, f, "np.int64(r) if type(r) is int else r") if all(x.strip().lstrip("-").isdigit() for x in o) else None,
        None,
    ),
    (
        "keeps state on its Solution",
        "call",
        lambda c, f, o: wrap_method(c, f, "(setattr(self, '_n', getattr(self, '_n', 0) + 1), r if self._n == 1 else None)[1]") if len(o) > 1 else None,
        "one Solution() shared by every test",
    ),
]


# Solutions written with numpy, as contestants write them: arrays parsed from the input, vectorised
# comparisons and prefix sums, products past 2**31, numpy integers returned.
NUMPY_SOLUTIONS = {
    "lcb-000": "import numpy as np\nn = int(input())\na = np.array(input().split(), dtype=np.int64)\nprint(np.argsort(a)[-2] + 1)\n",
    "lcb-063": "import numpy as np\nn = int(input())\na = np.array(list(map(int, input().split())))\nb = np.array(list(map(int, input().split())))\nprint(a.max() + b.max())\n",
    "lcb-122": "import numpy as np\nn = int(input())\ns = np.frombuffer(input().strip().encode(), dtype=np.uint8)\nprint(int(np.sum((s[:-2] == ord('#')) & (s[1:-1] == ord('.')) & (s[2:] == ord('#')))))\n",
    "lcb-028": "import numpy as np\nn = int(input())\na = np.array(input().split(), dtype=int)\nc = 0\nwhile (a > 0).sum() > 1:\n    a[::-1].sort()\n    a[0] -= 1\n    a[1] -= 1\n    c += 1\nprint(c)\n",
    "lcb-051": "import numpy as np\nn = int(input())\na = np.array(input().split(), dtype=np.int64)\nlast = np.full(n + 1, -1)\nprev = np.empty(n, dtype=int)\nfor i, v in enumerate(a.tolist()):\n    prev[i] = last[v]\n    last[v] = i\nidx = np.arange(n)\nprint(((idx - prev) * (n - idx)).sum())\n",
    "lcb-268": "import numpy as np\nfrom typing import List\nclass Solution:\n    def countSubarrays(self, nums: List[int]) -> int:\n        a = np.array(nums)\n        return np.sum(2 * (a[:-2] + a[2:]) == a[1:-1])\n",
    "lcb-108": "import numpy as np\nfrom typing import List\nclass Solution:\n    def minElement(self, nums: List[int]) -> int:\n        a = np.array(nums)\n        s = np.zeros_like(a)\n        while a.any():\n            s += a % 10\n            a //= 10\n        return s.min()\n",
    "lcb-253": "import numpy as np\nfrom typing import List\nclass Solution:\n    def maxSubarraySum(self, nums: List[int], k: int) -> int:\n        p = np.concatenate(([0], np.cumsum(nums)))\n        best = None\n        for r in range(k):\n            q = p[r::k]\n            if len(q) < 2:\n                continue\n            v = (q[1:] - np.minimum.accumulate(q[:-1])).max()\n            best = v if best is None or v > best else best\n        return best\n",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--areal", default=os.path.join(ROOT, "target/release/areal"))
    parser.add_argument("--python", default=sys.executable, help="the interpreter with LiveCodeBench's grader")
    parser.add_argument("--markdown", help="also write the report here")
    args = parser.parse_args()

    records = [json.loads(line) for path in RECORDS for line in open(path) if line.strip()]
    stdin_seen = 0
    cases = []  # (record, variant name, expected difference, code, tests)
    for record in records:
        tests = json.loads(record["public_test_cases"]) + json.loads(record.get("private_test_cases") or "[]")
        call = tests[0]["testtype"] == "functional"
        func = json.loads(record.get("metadata") or "{}").get("func_name")
        outputs = [t["output"] for t in tests]
        if not call:
            stdin_seen += 1
        for name, kind, make, expected in VARIANTS:
            applies = (
                kind == "any"
                or (kind == "call" and call)
                or (kind == "stdin" and not call)
                or (kind == "stdin-few" and not call and stdin_seen <= 2)
            )
            if not applies:
                continue
            code = make(record["code"], func, outputs)
            if code is not None:
                cases.append((record, name, expected, code, tests))
        if record["question_id"] in NUMPY_SOLUTIONS:
            cases.append((record, "solved with numpy", None, NUMPY_SOLUTIONS[record["question_id"]], tests))
    sys.stderr.write("%d programs over %d problems\n" % (len(cases), len(records)))

    # Ours: every program in one `areal grade code` call (in order, one line out per line in).
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for record, _, _, code, _ in cases:
            line = {k: v for k, v in record.items() if k != "code"}
            line["code"] = code
            f.write(json.dumps(line) + "\n")
        ours_input = f.name
    out = subprocess.run([args.areal, "grade", "code", "-q", ours_input], capture_output=True, check=True)
    os.unlink(ours_input)
    ours = [json.loads(line) for line in out.stdout.decode().splitlines() if line.strip()]
    assert len(ours) == len(cases), "areal grade code answered %d of %d lines" % (len(ours), len(cases))

    confusion = Counter()
    verdicts = Counter()
    ordinary = [0, 0]  # programs of no known difference: all, agreed
    disagreements = []
    for i, ((record, name, expected, code, tests), mine) in enumerate(zip(cases, ours)):
        theirs, their_message = lcb_verdict(record, code, tests, args.python)
        my_verdict = mine["verdict"]
        lcb_pass, our_pass = theirs == "accepted", my_verdict == "accepted"
        confusion[(lcb_pass, our_pass)] += 1
        if expected is None:
            ordinary[0] += 1
            ordinary[1] += lcb_pass == our_pass
        verdicts[(theirs, my_verdict)] += 1
        if lcb_pass != our_pass:
            disagreements.append(
                (record["question_id"], name, theirs, their_message, my_verdict,
                 mine["provenance"]["details"].get("message"), expected or "UNEXPECTED")
            )
        sys.stderr.write("\r%d/%d" % (i + 1, len(cases)))
    sys.stderr.write("\n")

    lines = []
    lines.append("%d programs over %d LiveCodeBench problems; LiveCodeBench's grader: nvidia-livecodebench 26.3 `testing_util.run_test`, natively (%s)" % (
        len(cases), len(records), sys.version.split()[0]))
    lines.append("")
    lines.append("| | areal accepts | areal rejects |")
    lines.append("|---|---:|---:|")
    lines.append("| LiveCodeBench accepts | %d | %d |" % (confusion[(True, True)], confusion[(True, False)]))
    lines.append("| LiveCodeBench rejects | %d | %d |" % (confusion[(False, True)], confusion[(False, False)]))
    agree = confusion[(True, True)] + confusion[(False, False)]
    lines.append("")
    lines.append("Agreement on pass/fail: %d of %d; on the %d programs of no known difference, %d." % (
        agree, len(cases), ordinary[0], ordinary[1]))
    lines.append("")
    lines.append("| LiveCodeBench | areal | programs |")
    lines.append("|---|---|---:|")
    for (theirs, mine), n in sorted(verdicts.items()):
        lines.append("| %s | %s | %d |" % (theirs, mine, n))
    lines.append("")
    if disagreements:
        lines.append("| problem | program | LiveCodeBench | areal | diagnosis |")
        lines.append("|---|---|---|---|---|")
        for qid, name, theirs, tm, mine, mm, why in disagreements:
            lines.append("| %s | %s | %s | %s | %s |" % (qid, name, theirs, mine, why))
    unexpected = sum(1 for d in disagreements if d[-1] == "UNEXPECTED")
    lines.append("")
    lines.append("Disagreements: %d, of which unexpected: %d." % (len(disagreements), unexpected))
    report = "\n".join(lines)
    print(report)
    if args.markdown:
        open(args.markdown, "w").write(report + "\n")
    for qid, name, theirs, tm, mine, mm, why in disagreements:
        if why == "UNEXPECTED":
            sys.stderr.write("%s / %s:\n  LiveCodeBench %s: %s\n  areal %s: %s\n" % (qid, name, theirs, tm, mine, mm))
    sys.exit(1 if unexpected else 0)


if __name__ == "__main__":
    main()
