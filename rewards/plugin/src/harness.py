# areal-rs reward harness: calls a user's reward function, from a Python file, inside the
# sandbox.
#
# The host prepends `SOURCE`, `FILE`, `MODULE`, `FUNCTION` and `SIGNATURE`. Everything at
# module level runs once, when the sandbox is built, and is snapshotted: the user's file is
# imported then (its imports and module-level work are paid once), and each sample's run
# calls `areal_main()` in a fresh instance of that snapshot.
#
# stdin of a run: one JSON object, the sample (see `_call`) and this run's `nonce`. The
# function's prints go to stdout, which is capped; after them the harness writes MARK, the
# nonce, RS and one JSON line:
#   {"score": <float>, "details": {...}, "verdict": <str or null>}   the function returned
#   {"error": <traceback or message>}                                it raised or returned junk
# The nonce is the host's, new every run, and is taken out of the job before the function is
# called, so that a function that prints what it is given (or runs a completion's code that
# prints a reply of its own) does not write a reply the host accepts; the host also refuses a
# run that wrote more than one. (Code the function runs in this interpreter could still find
# the nonce in the harness's memory: a reward that executes a completion's code should not
# trust that code with its own process: docs/writing-a-reward.md.)
import json
import os
import random
import sys
import traceback
import types

MARK = b"\x1eareal-reward\x1e"

# The file is a module of its own name, unless that name is another module's (a `types.py`
# would replace the standard `types` in sys.modules, and numpy's import would then fail):
# then it is registered as `areal_reward_<name>`.
def _own_name(name):
    import importlib.util

    try:
        taken = name in sys.modules or name in sys.stdlib_module_names or (
            importlib.util.find_spec(name) is not None
        )
    except (ImportError, ValueError):
        taken = True
    return "areal_reward_" + name if taken else name


MODULE = _own_name(MODULE)  # noqa: F821 (prepended by the host)
_module = types.ModuleType(MODULE)
_module.__file__ = FILE  # noqa: F821
sys.modules[MODULE] = _module
exec(compile(SOURCE, FILE, "exec"), _module.__dict__)  # noqa: F821
_function = getattr(_module, FUNCTION, None)  # noqa: F821
if not callable(_function):
    raise LookupError(
        "%s defines no function %r (set `function` in [reward])" % (FILE, FUNCTION)  # noqa: F821
    )
del SOURCE  # noqa: F821


def _read_all():
    parts = []
    while True:
        b = os.read(0, 1 << 16)
        if not b:
            return b"".join(parts)
        parts.append(b)


def _say(obj, nonce=b""):
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    try:
        text = json.dumps(obj, allow_nan=False, default=repr)
    except ValueError:
        text = json.dumps({"error": "the details hold a number that is not finite (NaN or inf)"})
    os.write(1, MARK + nonce + b"\x1e" + text.encode() + b"\n")
    os._exit(0)


def _call(job):
    if SIGNATURE == "verl":  # noqa: F821
        # verl's `custom_reward_function`: compute_score(data_source, solution_str,
        # ground_truth, extra_info, **reward_kwargs)
        return _function(
            data_source=job["data_source"],
            solution_str=job["completion"],
            ground_truth=job["reference"],
            extra_info=job["metadata"],
            **job["options"],
        )
    # AReaL's reward functions: fn(prompt, completions, prompt_ids, completion_ids, **data),
    # positionally,
    # where `data` are the dataset's fields (here: the reference's, when it is an object).
    fields = job["reference"] if isinstance(job["reference"], dict) else {"answer": job["reference"]}
    kwargs = dict(job["options"])
    kwargs.update(fields)
    return _function(job["prompt"], job["completion"], None, job["completion_ids"], **kwargs)


def _number(x):
    # numpy's numbers (np.float32(0.5), np.int64(1), np.sum of an array, a 0-d array) are the
    # Python numbers they hold, as verl takes them; a bool is refused either way
    if type(x).__module__ == "numpy" and getattr(x, "shape", None) == ():
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError
    return float(x)


def areal_main():
    try:
        job = json.loads(_read_all())
        nonce = job.pop("nonce").encode()
    except BaseException:
        _say({"error": "the harness got no sample: " + traceback.format_exc()[-2000:]})
    # The snapshot froze the random module's state: draw this run's own seed (the OS's in
    # fast mode, the seeded source's in deterministic mode).
    random.seed()
    # numpy's global generator was frozen in the snapshot too: it draws from this run's seed
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(random.getrandbits(32))
    # os.environ was read when the snapshot was taken: the environment is what the config
    # grants (`env`), nothing else.
    os.environ.clear()
    os.environ.update(job.get("env") or {})
    try:
        result = _call(job)
    except BaseException as e:
        # The traceback from the user's own frames on: the harness's are noise to them.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(e), e, tb))
        _say({"error": text[-8000:]}, nonce)
    try:
        if isinstance(result, dict):
            if "score" not in result:
                raise TypeError
            score = _number(result["score"])
            details = {k: v for k, v in result.items() if k not in ("score", "verdict")}
            verdict = result.get("verdict")
            if verdict is not None and not isinstance(verdict, str):
                raise TypeError
        else:
            score, details, verdict = _number(result), {}, None
    except BaseException:
        _say(
            {
                "error": "%s returned %s, not a number or a dict with a number `score`"
                % (FUNCTION, repr(result)[:200])  # noqa: F821
            },
            nonce,
        )
    if score != score or score in (float("inf"), float("-inf")):
        _say({"error": "returned a score of %r, which is not finite" % score}, nonce)
    _say({"score": score, "details": details, "verdict": verdict}, nonce)


# Everything above lives in the snapshot, mapped copy-on-write into each run: freeze it so that
# a garbage collection does not write to (and copy) every page of it.
import gc  # noqa: E402

gc.collect()
gc.freeze()
