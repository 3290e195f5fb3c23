# `areal bench sandbox`'s baseline: unsandboxed native CPython, the way the field grades today.
# One process runs every test it is given in-process, like AReaL's local grader (a fresh
# process per problem) or LiveCodeBench's forked child; given one test, it is a fresh process
# per test. Not a sandbox: it exists only to be measured against.
#
# The host prepends program.py (`compile_program`, `run_program`): stdin programs are compiled
# and run exactly as the sandbox's harness runs them.
#
# stdin: {"kind": "stdin"|"call", "func": name, "code": text, "prelude": text, "inputs": [...]}
# stdout: {"ready": wall-clock seconds when the prelude was imported, "exec": [seconds per
#          test], "outputs": [stdout text, or the JSON of the return value, per test]}
import io
import json
import sys
import time

job = json.loads(sys.stdin.read())
g = {"__builtins__": __builtins__, "__name__": "__main__"}
exec(compile(job["prelude"], "<prelude>", "exec"), g)
if "numpy" in job["code"]:
    # LiveCodeBench's grader imports numpy before any program runs, and the sandbox's snapshot
    # has it imported: a program's `import numpy` is timed on neither side.
    try:
        import numpy  # noqa: F401
    except ImportError:
        sys.exit(
            "the program imports numpy, which %s lacks: pass --python an interpreter with numpy "
            "1.26.4 (rewards/code/scripts/setup-lcb-grader.sh makes one in .cache/lcb-grader)"
            % sys.executable
        )
known = known_names(g)  # noqa: F821 (program.py)
ready = time.time()
real_stdout = sys.stdout
outputs, exec_times = [], []
for text in job["inputs"]:
    t0 = time.perf_counter()
    # Compiled per test, as exec() of the source does in graders; the sandbox times the same.
    if job["kind"] == "stdin":
        program = compile_program(job["code"], "<solution>", known)  # noqa: F821
        sys.stdin = io.TextIOWrapper(io.BytesIO(text.encode()))
        sys.stdout = out = io.StringIO()
        env = dict(g)
        try:
            run_program(program, env)  # noqa: F821
        except SystemExit:
            pass
        sys.stdout = real_stdout
        outputs.append(out.getvalue())
    else:
        env = dict(g, __name__="__solution__")
        exec(compile(job["code"], "<solution>", "exec"), env)
        args = [json.loads(line) for line in text.split("\n") if line.strip()]
        target = getattr(env["Solution"](), job["func"]) if "class Solution" in job["code"] else env[job["func"]]
        result = target(*args)
        if isinstance(result, tuple):
            result = list(result)
        outputs.append(json.dumps(result))
    exec_times.append(time.perf_counter() - t0)
real_stdout.write(json.dumps({"ready": ready, "exec": exec_times, "outputs": outputs}))
