# areal-rs guest harness: runs ONE LiveCodeBench test of ONE program inside the sandbox.
#
# stdin: a JSON header line {"kind": "stdin"|"call", "func": name, "code": n, "prelude": text},
# then n bytes of
# program text, then the test's input. The header and the program are read with os.read, byte
# for byte, so the test input is left unread on the real fd 0: `input()`, `sys.stdin`,
# `open(0)` and `os.read(0, n)` all see exactly the test input.
#
# Expected outputs never come here; the host decides the verdict. What leaves:
#   stdin tests: the program's own stdout;
#   call tests:  stdout carries MARK + the return value in a closed JSON encoding (None, bool,
#                int, float, str, list, tuple, dict, set); the program's prints are discarded.
#   stderr:      the program's, then EXEC_MARK + the nanoseconds the program itself ran
#                (after the prelude), which the host strips off.
# Exit status: 0 ran to the end (a stdin program's SystemExit is swallowed, as LiveCodeBench
# does); 1 the program raised (in a call test SystemExit too: nothing was returned);
# 2 the harness itself was misused; 3 MemoryError; 4 a call test's function is missing;
# 5 the return value is outside the closed encoding.
import os
import sys

MARK = b"\x1eareal-result\x1e"
EXEC_MARK = b"\x1eareal-exec-ns="
_t0 = None  # when the program itself started (after the prelude), for start-up/exec timings


def _read_exact(n):
    parts = []
    while n > 0:
        b = os.read(0, min(n, 1 << 16))
        if not b:
            break
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


def _read_line():
    line = bytearray()
    while True:
        c = os.read(0, 1)
        if not c or c == b"\n":
            return bytes(line)
        line += c


def _finish(status):
    for stream in (_stdout, sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    if _t0 is not None:
        try:
            os.write(2, EXEC_MARK + b"%d\n" % (time.perf_counter_ns() - _t0))
        except BaseException:
            pass
    os._exit(status)


def _fail(status):
    import traceback

    sys.stdout = _stdout
    try:
        text = traceback.format_exc()
        sys.__stderr__.write(text[-4000:])
    except BaseException:
        pass
    _finish(status)


_stdout = sys.stdout
import json  # noqa: E402  (after the helpers; the program's own imports come later)
import time  # noqa: E402

try:
    _header = json.loads(_read_line())
    _kind = _header["kind"]
    _code = _read_exact(int(_header["code"])).decode("utf-8", "replace")
except BaseException:
    _fail(2)

PRELUDE = _header["prelude"]  # LiveCodeBench's import prelude, sent by the host


# What the 32-bit guest would get wrong, patched before the program runs (docs/sandbox.md):
# - sys.maxsize is 2**31 - 1 here; programs use it as "infinity", and sums of real values
#   pass 2**31 - 1. Natively (64-bit) it is 2**63 - 1.
# - threads cannot start. The idiom `threading.stack_size(big); Thread(target=main).start()`
#   (for deep recursion) is common, so a thread runs to completion inside start().
sys.maxsize = 2**63 - 1
if "thread" in _code:
    import threading

    def _start_now(self):
        self.run()

    threading.Thread.start = _start_now
    threading.Thread.join = lambda self, timeout=None: None
    threading.stack_size = lambda size=0: 0


class _Sink:
    """Where a call test's prints go: nowhere, but like a text stream."""

    encoding = "utf-8"

    def write(self, s):
        return len(s)

    def flush(self):
        pass

    def isatty(self):
        return False


class _Unencodable(Exception):
    pass


def _encode(v):
    t = type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return {"i": str(v)}
    if t is float:
        return {"f": repr(v)}
    if t is list:
        return [_encode(x) for x in v]
    if t is tuple:
        return {"t": [_encode(x) for x in v]}
    if t is dict:
        return {"d": [[_encode(k), _encode(x)] for k, x in v.items()]}
    if t is set or t is frozenset:
        return {"e": [_encode(x) for x in v]}
    raise _Unencodable(t.__name__)


_globals = {"__builtins__": __builtins__}
if _kind == "stdin":
    _globals["__name__"] = "__main__"
    try:
        exec(compile(PRELUDE, "<prelude>", "exec"), _globals)
        _t0 = time.perf_counter_ns()
        exec(compile(_code, "<solution>", "exec"), _globals)
    except SystemExit:
        pass
    except MemoryError:
        _fail(3)
    except BaseException:
        _fail(1)
    _finish(0)

elif _kind == "call":
    _func = _header.get("func") or ""
    try:
        _args = [json.loads(l) for l in sys.stdin.read().split("\n") if l.strip()]
    except BaseException:
        _fail(2)
    _globals["__name__"] = "__solution__"
    exec(compile(PRELUDE, "<prelude>", "exec"), _globals)
    sys.stdout = _Sink()
    _t0 = time.perf_counter_ns()
    try:
        exec(compile(_code, "<solution>", "exec"), _globals)
        if "class Solution" in _code:
            _target = getattr(_globals["Solution"](), _func, None)
        else:
            _target = _globals.get(_func)
        if _target is None:
            sys.stdout = _stdout
            sys.__stderr__.write("function %r not found\n" % _func)
            _finish(4)
        _result = _target(*_args)
    except MemoryError:
        _fail(3)
    except BaseException:
        _fail(1)
    sys.stdout = _stdout
    if type(_result) is tuple:
        _result = list(_result)
    try:
        sys.set_int_max_str_digits(0)
        _text = json.dumps(_encode(_result), ensure_ascii=True, allow_nan=False)
    except BaseException as e:
        sys.__stderr__.write("return value not encodable: %s\n" % (e,))
        _finish(5)
    sys.stdout.flush()
    os.write(1, MARK + _text.encode() + b"\n")
    _finish(0)

else:
    _fail(2)
