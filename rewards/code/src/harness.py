# areal-rs guest harness: runs ONE LiveCodeBench test of ONE program inside the sandbox.
#
# The host prepends `PRELUDE = "<LiveCodeBench's import prelude>"` and program.py (how a stdin
# program is compiled: `compile_program`, `run_program`). Everything at module level
# runs once, when the sandbox is built, and is snapshotted (the prelude's imports included);
# each run then calls `areal_main()` in a fresh instance of that snapshot.
#
# stdin of a run: a JSON header line {"kind": "stdin"|"call", "func": name, "code": n,
# "compiled": m, "as_function": bool}, then n bytes of program text, then m bytes of the
# program compiled (a marshalled code object this harness wrote in an earlier test of the same
# program, or none), then the test's input. The header and the program are read with os.read,
# byte for byte, so the test input is left unread on the real fd 0: `input()`, `sys.stdin`,
# `open(0)` and `os.read(0, n)` all see exactly the test input.
#
# Expected outputs never come here; the host decides the verdict. What leaves:
#   stdin tests: the program's own stdout;
#   call tests:  stdout carries MARK + the return value in a closed JSON encoding (None, bool,
#                int, float, str, list, tuple, dict as [k1, v1, k2, v2, ...], set; their
#                subclasses that keep their `==`, Fraction, Decimal, complex and numpy's
#                scalars as the values they equal: `_encode`); the program's prints are
#                discarded.
#   stderr:      first, in ONE write made before the program gets control (so nothing the
#                program does can forge, reorder or precede it):
#                  - for a stdin program compiled here whose marshalled code loads back as
#                    exactly the same code, COMPILED_MARK + "<m> function|module\n" + the m
#                    bytes (at most COMPILED_MAX): the host passes them to the program's next
#                    tests, which skip compiling;
#                  - STARTED_MARK + "function|module\n": the program runs from here on, as a
#                    function's body or as written (program.py).
#                Warnings raised while compiling (a SyntaxWarning) are held back until after
#                that write, then shown as CPython shows them. Then the program's own stderr,
#                then EXEC_MARK + the nanoseconds the program itself ran, as the guest
#                measured it (a figure for benchmarks only: the program could write one of
#                its own, so no verdict or reward reads it). The host strips the marks off.
#                Without STARTED_MARK the program never ran, so an exit status then is the
#                harness's; with it, every status is the program's (it can call os._exit(n)
#                with any n) and never counts as a grader failure.
# Exit status: 0 ran to the end (a stdin program's SystemExit is swallowed, as LiveCodeBench
# does); 1 the program raised (in a call test SystemExit too: nothing was returned);
# 2 the harness itself was misused; 3 MemoryError; 4 a call test's function is missing;
# 5 the return value is outside the closed encoding.
import collections
import json
import marshal
import os
import random
import sys
import threading
import time
import types
import warnings

MARK = b"\x1eareal-result\x1e"
EXEC_MARK = b"\x1eareal-exec-ns="
STARTED_MARK = b"\x1eareal-started "
COMPILED_MARK = b"\x1eareal-compiled="
COMPILED_MAX = 16 << 10

# The prelude, imported once into a template of the program's globals.
_TEMPLATE = {"__builtins__": __builtins__}
exec(compile(PRELUDE, "<prelude>", "exec"), _TEMPLATE)  # noqa: F821 (prepended by the host)

# What the 32-bit guest would get wrong, patched before any program runs (docs/sandbox.md):
# - sys.maxsize is 2**31 - 1 here; programs use it as "infinity", and sums of real values
#   pass 2**31 - 1. Natively (64-bit) it is 2**63 - 1.
# - threads cannot start. The idiom `threading.stack_size(big); Thread(target=main).start()`
#   (for deep recursion) is common, so a thread runs to completion inside start().
sys.maxsize = 2**63 - 1
if "maxsize" in _TEMPLATE:  # the prelude's `from sys import *` copied the 32-bit one
    _TEMPLATE["maxsize"] = sys.maxsize


def _start_now(self):
    self.run()


threading.Thread.start = _start_now
threading.Thread.join = lambda self, timeout=None: None
threading.stack_size = lambda size=0: 0

# numpy is linked into the interpreter; imported here, once, a program's `import numpy` costs
# it nothing. sympy (and mpmath, which it imports) likewise: ~0.3 s of CPU per test otherwise,
# which a program importing it pays in every test. Neither is in the program's globals: a
# program imports them as natively.
import numpy  # noqa: E402
import sympy  # noqa: E402
import sympy.core.random  # noqa: E402

# What a stdin program can read without binding it (program.py).
_KNOWN = known_names(_TEMPLATE)  # noqa: F821 (program.py, prepended by the host)

_stdout = sys.stdout
_t0 = None  # when the program itself started, for start-up/exec timings


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


def _start(as_function=False, compiled=None, warned=()):
    """The program runs from here on: say so (with its compiled code for the host, if any) in
    one write, show the warnings compiling it raised, then start its clock."""
    global _t0
    prefix = b""
    if compiled is not None:
        how = b"function" if as_function else b"module"
        prefix = COMPILED_MARK + b"%d %s\n" % (len(compiled), how) + compiled
    os.write(2, prefix + STARTED_MARK + (b"function\n" if as_function else b"module\n"))
    for w in warned:
        try:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)
        except BaseException:
            pass
    _t0 = time.perf_counter_ns()


def _fail(status):
    import traceback

    sys.stdout = _stdout
    try:
        text = traceback.format_exc()
        sys.__stderr__.write(text[-4000:])
    except BaseException:
        pass
    _finish(status)


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


# A returned value is compared as LiveCodeBench compares it, `value == expected` with
# `expected` from json.loads, but never by running the program's own code: a value of a
# subclass of a built-in type (an IntEnum, a namedtuple, a Counter) is encoded as that type
# only where its `==` and hash are the built-in type's (or a standard `==` that defers to it
# for a built-in operand: Counter's, OrderedDict's), read through the built-in type's own
# methods; numpy's scalars as the Python number they hold. Anything else (an object whose
# `==` says yes to everything) is outside the encoding.
_mro = type.__dict__["__mro__"].__get__
_class_dict = type.__dict__["__dict__"].__get__
_BASES = (int, float, str, list, tuple, dict, set, frozenset)
_DEFERS_TO_DICT = (
    _class_dict(collections.Counter)["__eq__"],
    _class_dict(collections.OrderedDict)["__eq__"],
)
_NUMPY_SCALARS = tuple(set(numpy.sctypeDict.values()))


def _lookup(t, name):
    """`name` as Python finds it on class `t` (its MRO's dicts; no metaclass is asked)."""
    for k in _mro(t):
        d = _class_dict(k)
        if name in d:
            return d[name]
    return None


def _base_of(t):
    """The built-in type of `_BASES` that values of `t` compare as, or None."""
    for base in _BASES:
        if t is base:
            return base
    for base in _BASES:
        if any(k is base for k in _mro(t)):
            eq, hashed = _lookup(t, "__eq__"), _lookup(t, "__hash__")
            same_eq = eq is _class_dict(base)["__eq__"] or any(eq is d for d in _DEFERS_TO_DICT)
            return base if same_eq and hashed is _class_dict(base)["__hash__"] else None
    return None


def _number(v):
    """A complex or numpy scalar as the Python value it equals, or `_Unencodable`."""
    if type(v) is complex:
        # equal to a real number only when its imaginary part is 0; else to nothing (NaN)
        return v.real if v.imag == 0 else float("nan")
    t = type(v)
    if not any(t is n for n in _NUMPY_SCALARS):
        raise _Unencodable(t.__name__)
    if issubclass(t, numpy.bool_):
        return bool(v)
    if issubclass(t, numpy.integer):
        return int(v)
    if issubclass(t, numpy.floating):
        if t is numpy.longdouble and t is not numpy.float64 and numpy.isfinite(v):
            return _Ratio(*v.as_integer_ratio())
        return float(v)
    if issubclass(t, numpy.complexfloating):
        return _number(complex(v))
    if issubclass(t, numpy.str_):
        return str.__str__(v)
    raise _Unencodable(t.__name__)


class _Ratio:
    """An exact rational (a long double's value), encoded as a Fraction is."""

    def __init__(self, p, q):
        self.text = "%d/%d" % (p, q)


def _encode(v):
    t = type(v)
    if v is None or t is bool:
        return v
    base = _base_of(t)
    if base is int:
        return {"i": str(int.__int__(v))}
    if base is float:
        return {"f": float.__repr__(float.__float__(v))}
    if base is str:
        return str.__str__(v)
    if base is list:
        return [_encode(x) for x in list.__iter__(v)]
    if base is tuple:
        return {"t": [_encode(x) for x in tuple.__iter__(v)]}
    if base is dict:
        flat = []
        for k, x in dict.items(v):
            flat.append(_encode(k))
            flat.append(_encode(x))
        return {"d": flat}
    if base is set or base is frozenset:
        return {"e": [_encode(x) for x in base.__iter__(v)]}
    if t is _Ratio:
        return {"q": v.text}
    # Exact numbers compare with Python's == by value (Fraction(1, 2) == 0.5): the host
    # reduces and compares them, trusting nothing of this text but its digits. A program
    # that returns one imported its module (not imported here: the snapshot stays small).
    fractions, decimal = sys.modules.get("fractions"), sys.modules.get("decimal")
    if fractions is not None and t is fractions.Fraction:
        return {"q": "%d/%d" % (v.numerator, v.denominator)}
    if decimal is not None and t is decimal.Decimal:
        return {"m": str(v)}
    return _encode(_number(v))


def _marshalled(code):
    """`code` marshalled for the program's later tests, or None where loading it back would
    not give exactly this code: unmarshalling rebuilds a frozenset constant (`for x in {7,
    15}`, `x in {...}`, a set display of three or more constants) by adding its members in
    the order they iterate, which can change that order; marshal refuses code nested too
    deep; and the host takes at most COMPILED_MAX bytes."""
    try:
        todo = [code]
        while todo:
            c = todo.pop()
            t = type(c)
            if t is types.CodeType:
                todo.extend(c.co_consts)
            elif t is tuple:
                todo.extend(c)
            elif t is frozenset:
                if len(c) > 1:
                    return None
                todo.extend(c)
        blob = marshal.dumps(code)
    except BaseException:
        return None
    return blob if len(blob) <= COMPILED_MAX else None


def _compiled_program(header, code):
    """The stdin program compiled, the warnings compiling it raised, and its code marshalled
    for the host (or None): from the host (what an earlier test wrote, exactly the code this
    text compiles to), or compiled here. The program is None when it does not compile."""
    try:
        blob = _read_exact(int(header.get("compiled") or 0))
    except BaseException:
        _fail(2)
    if blob:
        try:
            return (marshal.loads(blob), bool(header.get("as_function"))), (), None
        except BaseException:
            pass  # compiled again below: the same code
    with warnings.catch_warnings(record=True) as warned:
        try:
            program = compile_program(code, "<solution>", _KNOWN)  # noqa: F821
        except BaseException:
            return None, (), None
    return program, warned, _marshalled(program[0])


def areal_main():
    try:
        header = json.loads(_read_line())
        kind = header["kind"]
        code = _read_exact(int(header["code"])).decode("utf-8", "replace")
    except BaseException:
        _fail(2)
    # The snapshot froze the random module's state: draw fresh seeds from this run's source
    # (the OS in fast mode, the seeded one in deterministic mode).
    random.seed()
    # numpy's global generator likewise, from 32 bits of that source: seeding it from a
    # whole entropy pool (`numpy.random.seed()`) costs 0.5 ms, a test's start-up twice over
    numpy.random.seed(random.getrandbits(32))
    # and sympy's two generators (each a `random.Random` of its own)
    sympy.core.random.rng.seed(random.getrandbits(64))
    sympy.core.random._assumptions_rng.seed(random.getrandbits(64))
    g = _TEMPLATE  # every run is a fresh instance: no copy needed (a copy touches every value)
    if kind == "stdin":
        g["__name__"] = "__main__"
        program, warned, blob = _compiled_program(header, code)
        _start(program is not None and program[1], blob, warned)
        try:
            if program is None:  # it does not compile: raise that as the program's error
                program = compile_program(code, "<solution>", _KNOWN)  # noqa: F821
            run_program(program, g)  # noqa: F821
        except SystemExit:
            pass
        except MemoryError:
            _fail(3)
        except BaseException:
            _fail(1)
        _finish(0)
    if kind != "call":
        _fail(2)
    func = header.get("func") or ""
    try:
        args = [json.loads(line) for line in sys.stdin.read().split("\n") if line.strip()]
    except BaseException:
        _fail(2)
    g["__name__"] = "__solution__"
    sys.stdout = _Sink()
    _start()
    try:
        exec(compile(code, "<solution>", "exec"), g)
        if "class Solution" in code:
            target = getattr(g["Solution"](), func, None)
        else:
            target = g.get(func)
        if target is None:
            sys.stdout = _stdout
            sys.__stderr__.write("function %r not found\n" % func)
            _finish(4)
        result = target(*args)
    except MemoryError:
        _fail(3)
    except BaseException:
        _fail(1)
    sys.stdout = _stdout
    if _base_of(type(result)) is tuple:  # LiveCodeBench: isinstance(prediction, tuple)
        result = list(tuple.__iter__(result))
    try:
        sys.set_int_max_str_digits(0)
        text = json.dumps(_encode(result), ensure_ascii=True, allow_nan=False)
    except BaseException as e:
        sys.__stderr__.write("return value not encodable: %s\n" % (e,))
        _finish(5)
    sys.stdout.flush()
    os.write(1, MARK + text.encode() + b"\n")
    _finish(0)


# Everything above lives in the snapshot, mapped copy-on-write into each run. A full garbage
# collection would write to every object header and copy every page of it: freeze them.
import gc  # noqa: E402

gc.collect()
gc.freeze()
