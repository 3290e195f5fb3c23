"""A heavy set of LiveCodeBench-style records whose time goes to numpy's matrix products and
linear algebra, each sized to take 2-3 s natively (half of LiveCodeBench's 6 s limit).

Run natively with numpy 1.26.4 (what LiveCodeBench's grader pins), one BLAS thread; it times
each program, takes its output as the expected one, and writes the records:

    OPENBLAS_NUM_THREADS=1 python numpy_heavy_set.py heavy.jsonl

then grade them in the sandbox with LiveCodeBench's limit and the default time scale:

    areal grade code heavy.jsonl

Run with the interpreter of rewards/code/scripts/setup-lcb-grader.sh's environment, it also
grades each program with LiveCodeBench's own `run_test` (its 6 s limit) and prints the verdict:
the one the sandbox must hold.

Matrices hold small integers, so every product is exact and the output does not depend on
the order in which a BLAS sums.
"""

import json
import os
import subprocess
import sys
import time

PROGRAMS = {
    "matmul 1000x30 @ 30x1000": (1000, """
import numpy as np
n = int(input())
rng = np.random.default_rng(1)
A = rng.integers(0, 10, (1000, 30)).astype(np.float64)
B = rng.integers(0, 10, (30, 1000)).astype(np.float64)
t = 0
for r in range(n):
    t += int((A @ B)[r % 1000].sum())
print(t)
"""),
    "np.dot 300x300": (1500, """
import numpy as np
n = int(input())
rng = np.random.default_rng(2)
S = rng.integers(0, 10, (300, 300)).astype(np.float64)
t = 0
for r in range(n):
    t += int(np.dot(S, S)[r % 300].sum())
print(t)
"""),
    "matmul float32 300x300": (2500, """
import numpy as np
n = int(input())
rng = np.random.default_rng(3)
S = rng.integers(0, 4, (300, 300)).astype(np.float32)
t = 0
for r in range(n):
    t += int((S @ S)[r % 300].sum())
print(t)
"""),
    "linalg.solve 200x200": (5000, """
import numpy as np
n = int(input())
rng = np.random.default_rng(4)
M = rng.random((200, 200)) + 200 * np.eye(200)
t = 0
for r in range(n):
    x = np.linalg.solve(M, np.arange(200.0) + r)
    t += int(round(x.sum() * 1000))
print(t)
"""),
}


def grader():
    """LiveCodeBench's verdict as lcb_agreement.py takes it, where its grader is installed."""
    try:
        import livecodebench  # noqa: F401
    except ImportError:
        return None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from lcb_agreement import lcb_verdict

    return lcb_verdict


def main():
    out = sys.argv[1]
    lcb_verdict = grader()
    with open(out, "w") as f:
        for name, (n, code) in PROGRAMS.items():
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", code], input=f"{n}\n", capture_output=True,
                text=True, check=True,
            )
            seconds = time.perf_counter() - start
            tests = [{"input": f"{n}\n", "output": done.stdout, "testtype": "stdin"}]
            verdict = ""
            if lcb_verdict is not None:
                start = time.perf_counter()
                said, why = lcb_verdict({}, code, tests, sys.executable)
                verdict = f"; LiveCodeBench's grader: {said} in {time.perf_counter() - start:.2f} s"
                verdict += f" ({why})" if why else ""
            print(f"{name}: {seconds:.2f} s natively{verdict}", file=sys.stderr)
            record = {
                "question_id": f"numpy-heavy: {name}",
                "question_content": "",
                "starter_code": "",
                "public_test_cases": json.dumps(tests),
                "private_test_cases": "[]",
                "metadata": "{}",
                "code": code.lstrip(),
            }
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
