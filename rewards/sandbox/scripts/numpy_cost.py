"""numpy's cost per operation class, natively and in the sandbox's guest (no BLAS).

Natively, one thread (LiveCodeBench's grader runs pip's numpy 1.26.4, with OpenBLAS):

    OPENBLAS_NUM_THREADS=1 python numpy_cost.py

In the guest, as a Python reward whose details carry the timings (`numpy-cost.toml`):

    echo '{"prompt": "", "completion": "", "reference": ""}' > /tmp/one.jsonl
    areal grade reward --config rewards/sandbox/scripts/numpy-cost.toml /tmp/one.jsonl

Each line: the operation and the best of its repetitions, in milliseconds.
"""

import json
import time

import numpy as np


def timed(fn, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


rng = np.random.default_rng(0)
x = rng.random(10**6)
y = rng.random(10**6)
i = rng.integers(0, 10**6, 10**6)
A = rng.random((1000, 30))
B = rng.random((30, 1000))
M = rng.random((200, 200))
S = rng.random((300, 300))
S32 = S.astype(np.float32)
OPS = [
    ("elementwise: x * y + 1 (10^6 floats)", lambda: x * y + 1, 20),
    ("ufunc: np.sqrt, np.exp (10^6)", lambda: np.exp(np.sqrt(x)), 10),
    ("reduction: x.sum(), x.max() (10^6)", lambda: (x.sum(), x.max()), 20),
    ("cumsum (10^6 ints)", lambda: np.cumsum(i), 10),
    ("sort (10^6 floats)", lambda: np.sort(x), 5),
    ("argsort (10^6 ints)", lambda: np.argsort(i), 5),
    ("fancy indexing x[i] (10^6)", lambda: x[i], 10),
    ("bincount (10^6)", lambda: np.bincount(i), 10),
    ("matmul 1000x30 @ 30x1000", lambda: A @ B, 3),
    ("matmul 300x300 @ 300x300", lambda: S @ S, 3),
    ("np.dot 300x300, 300x300", lambda: np.dot(S, S), 3),
    ("matmul float32 300x300 @ 300x300", lambda: S32 @ S32, 3),
    ("dot of 10^6-vectors", lambda: x.dot(y), 10),
    ("linalg.solve 200x200", lambda: np.linalg.solve(M, x[:200]), 5),
    ("linalg.inv 200x200", lambda: np.linalg.inv(M), 5),
    ("linalg.eigvals 200x200", lambda: np.linalg.eigvals(M), 3),
    ("fft of 2^16", lambda: np.fft.fft(x[:65536]), 10),
]


def run():
    return [(name, timed(fn, reps) * 1e3) for name, fn, reps in OPS]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "timings_ms": json.dumps(run())}


if __name__ == "__main__":
    for name, ms in run():
        print(f"{name}\t{ms:.3f}")
