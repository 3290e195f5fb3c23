#!/usr/bin/env python3
"""Write rewards/code/tests/fixtures/set_literals.jsonl: stdin programs full of set,
frozenset and dict literals of small ints, each with three inputs and what native CPython
3.11 prints for each, the same process compiling each program once as LiveCodeBench does:

    python3 rewards/code/scripts/set_literal_cases.py > rewards/code/tests/fixtures/set_literals.jsonl

Small non-negative ints hash alike on 32-bit and 64-bit CPython, so the guest must print
exactly this. (Issue 32: tests after a program's first one ran its code unmarshalled, which
rebuilds frozenset constants in another order: `for x in {7, 15}` printed 15 before 7.)
Standard library only; seeded, so the file is the same every time."""
import contextlib
import io
import json
import random
import sys

assert sys.version_info[:2] == (3, 11), "the guest is CPython 3.11"


def literal(r):
    xs = [str(r.randrange(0, 64) if r.random() < 0.8 else r.randrange(0, 1 << 30))
          for _ in range(r.randint(2, 7))]
    kind = r.randrange(6)
    if kind == 0:
        return "{%s}" % ", ".join(xs)                      # a set display
    if kind == 1:
        return "frozenset({%s})" % ", ".join(xs)           # frozenset of one
    if kind == 2:
        return "{%s}" % ", ".join("%s: %d" % (x, i) for i, x in enumerate(xs))
    if kind == 3:
        return "[x * n for x in {%s}]" % ", ".join(xs)     # iterated: a constant
    if kind == 4:
        return "[x for x in range(64) if x in {%s}]" % ", ".join(xs)
    return "{%s} | {n}" % ", ".join(xs)


def program(r):
    lines = ["n = int(input())"]
    for _ in range(r.randint(1, 4)):
        lines.append("print(*%s)" % literal(r))
    lines.append("for x in {%s}:\n    print(x * n, end=' ')\nprint()"
                 % ", ".join(str(r.randrange(0, 64)) for _ in range(r.randint(2, 5))))
    if r.random() < 0.3:  # run as a module, not as a function's body
        lines.insert(0, "def f():\n    global n\nf()")
    return "\n".join(lines) + "\n"


def run(code, stdin):
    compiled = compile(code, "<solution>", "exec")
    out = io.StringIO()
    sys.stdin = io.StringIO(stdin)
    with contextlib.redirect_stdout(out):
        exec(compiled, {"__name__": "__main__"})
    sys.stdin = sys.__stdin__
    return out.getvalue()


def main():
    r = random.Random(32)
    for _ in range(120):
        code = program(r)
        tests = [{"input": "%d\n" % n, "output": run(code, "%d\n" % n)} for n in (1, 2, 3)]
        print(json.dumps({"code": code, "tests": tests}))


main()
