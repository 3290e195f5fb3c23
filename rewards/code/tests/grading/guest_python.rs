//! Issue 37: the guest behaves as the 64-bit CPython that LiveCodeBench runs.

use areal_reward_code::GradeOptions;
use serde_json::Value;

use crate::second_pass::run_with;

/// Limits that only stop a runaway: these programs are checked for what they print.
fn roomy() -> GradeOptions {
    GradeOptions {
        timeout_s: 20.0,
        time_scale: 1.0,
        memory_mb: 1024,
        output_bytes: 1 << 20,
        ..GradeOptions::default()
    }
}

/// Sets and frozensets iterate in 64-bit CPython's order, and `hash()` gives its values: 5,000
/// random cases (`fixtures/hash_order.py`: sets of grid cells, tuples, large ints, floats,
/// strings, frozensets, mixed numbers and keys that collide in their low bits, built, thinned,
/// combined and popped), each line's checksum against what `PYTHONHASHSEED=0 python3.11`
/// printed (`scripts/hash_order_cases.py`).
#[test]
#[allow(clippy::print_stderr, reason = "the test prints what it measured")]
fn sets_iterate_and_hash_as_in_64_bit_cpython() {
    let program = std::fs::read_to_string(crate::fixture("hash_order.py")).unwrap();
    let expected = std::fs::read_to_string(crate::fixture("hash_order.jsonl")).unwrap();
    let (mut cases, mut mismatches) = (0, Vec::new());
    for line in expected.lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let seed = case["seed"].as_u64().unwrap();
        let native = case["output"].as_str().unwrap();
        let report = run_with(&program, &format!("{seed}\n"), &roomy());
        let printed = String::from_utf8_lossy(&report.stdout);
        assert_eq!(
            printed.lines().count(),
            native.lines().count(),
            "seed {seed}: {:?}\n{}",
            report.outcome,
            String::from_utf8_lossy(&report.stderr)
        );
        for (guest, native) in printed.lines().zip(native.lines()) {
            cases += 1;
            if guest != native {
                mismatches.push(format!("seed {seed}: {guest} (native: {native})"));
            }
        }
    }
    assert_eq!(cases, 5000);
    eprintln!("hash order: {cases} cases, {} mismatches", mismatches.len());
    assert!(
        mismatches.is_empty(),
        "{} of {cases} cases differ from 64-bit CPython (rerun a seed with \
         `echo SEED | PYTHONHASHSEED=0 python3.11 rewards/code/tests/fixtures/hash_order.py`):\n{}",
        mismatches.len(),
        mismatches[..mismatches.len().min(20)].join("\n")
    );
}

/// numpy computes as 64-bit Linux's numpy 1.26.4: the default integer is 64-bit (Python ints,
/// `dtype=int`, `arange`, sums and prefix sums of small integers), and sorting, linear algebra,
/// FFT, random streams and printing give the same text, line for line
/// (`fixtures/numpy_checks.py`, its native output in `numpy_checks.out`).
#[test]
fn numpy_computes_as_on_64_bit_linux() {
    let program = std::fs::read_to_string(crate::fixture("numpy_checks.py")).unwrap();
    let native = std::fs::read_to_string(crate::fixture("numpy_checks.out")).unwrap();
    assert_prints_as_natively(&program, &native);
}

/// Matrix products (`@`, `np.matmul` into a transposed `out=`, `np.dot` and `.dot` of two
/// matrices, over stacks, strided and Fortran-ordered operands, float32 and float64) are, bit
/// for bit, each element's products summed in order from zero, as numpy's loop without BLAS
/// sums them: the guest's blocked SIMD loop (`numpy-wasi.patch`) changes their speed, not
/// their values, over shapes that leave every remainder of its blocks
/// (`fixtures/matrix_products.py`; natively OpenBLAS sums in another order).
#[test]
fn matrix_products_are_numpys_sums_in_order() {
    let program = std::fs::read_to_string(crate::fixture("matrix_products.py")).unwrap();
    let report = run_with(&program, "", &roomy());
    let printed = String::from_utf8_lossy(&report.stdout);
    assert_eq!(
        printed,
        "products 2744 differ 0\n",
        "{:?}\n{}",
        report.outcome,
        String::from_utf8_lossy(&report.stderr)
    );
}

/// `program` run in the guest prints `native` (what it printed on 64-bit Linux), line for
/// line; the assertion names each line that differs.
fn assert_prints_as_natively(program: &str, native: &str) {
    let report = run_with(program, "", &roomy());
    let printed = String::from_utf8_lossy(&report.stdout);
    let differ: Vec<String> = printed
        .split("\n")
        .zip(native.split("\n"))
        .filter(|(guest, native)| guest != native)
        .map(|(guest, native)| format!("{guest}\n  (native: {native})"))
        .collect();
    assert!(
        differ.is_empty() && printed.lines().count() == native.lines().count(),
        "{} of {} lines differ from numpy on 64-bit Linux ({:?}):\n{}\n{}",
        differ.len(),
        native.lines().count(),
        report.outcome,
        differ.join("\n"),
        String::from_utf8_lossy(&report.stderr)
    );
}

/// Every integer numpy's index-returning API hands a program (argmax/argmin, argsort,
/// argpartition, searchsorted, digitize, nonzero, where, argwhere, flatnonzero, lexsort,
/// unique's indices, inverse and counts, bincount, histogram counts, count_nonzero,
/// ravel_multi_index, unravel_index and the index helpers, as functions and as methods) is
/// 64-bit, as on 64-bit Linux: each result's type, dtype, values, and arithmetic on it that
/// wraps past 2**31 in 32 bits, line for line against numpy 1.26.4 on 64-bit Linux
/// (`fixtures/numpy_indices.py`, its native output in `numpy_indices.out`).
#[test]
fn numpys_index_results_compute_as_on_64_bit_linux() {
    let program = std::fs::read_to_string(crate::fixture("numpy_indices.py")).unwrap();
    let native = std::fs::read_to_string(crate::fixture("numpy_indices.out")).unwrap();
    assert_prints_as_natively(&program, &native);
}

/// A returned value is judged as LiveCodeBench judges it, `value == json.loads(expected)`:
/// subclasses of built-in types that keep the built-in `==` (an IntEnum, a namedtuple, a
/// Counter, an OrderedDict), numpy's scalars and complex numbers are accepted where that is
/// true, read through the built-in type's own methods (a list subclass's own `__iter__` is
/// not asked). Every verdict below is LiveCodeBench's (checked natively with numpy 1.26.4)
/// but the last three, whose `==` or hash is the program's own: LiveCodeBench runs it and
/// accepts whatever it says, and a policy would learn that; here they are wrong answers.
#[test]
fn returned_subclasses_and_numpy_scalars_compare_as_in_livecodebench() {
    use areal_reward_code::grade_code;
    use areal_sdk::Verdict;
    let cases: &[(&str, &str, bool)] = &[
        ("class N(int): pass\nr = N(3)", "3", true),
        ("import enum\nr = enum.IntEnum('E', {'X': 3}).X", "3", true),
        ("class F(float): pass\nr = F(0.5)", "0.5", true),
        ("class S(str): pass\nr = S('ab')", "\"ab\"", true),
        ("class L(list): pass\nr = L([1, 2])", "[1, 2]", true),
        (
            "class L(list):\n    def __iter__(self): return iter([9])\nr = L([1, 2])",
            "[1, 2]",
            true,
        ),
        ("class D(dict): pass\nr = D(a=1)", "{\"a\": 1}", true),
        (
            "r = collections.Counter('aab')",
            "{\"a\": 2, \"b\": 1}",
            true,
        ),
        (
            "r = collections.Counter({'a': 2, 'b': 0})",
            "{\"a\": 2}",
            false,
        ),
        (
            "r = collections.OrderedDict([('b', 1), ('a', 2)])",
            "{\"a\": 2, \"b\": 1}",
            true,
        ),
        ("r = collections.defaultdict(int, a=1)", "{\"a\": 1}", true),
        (
            "P = collections.namedtuple('P', 'x y')\nr = P(1, 2)",
            "[1, 2]",
            true,
        ),
        (
            "r = [collections.namedtuple('P', 'x y')(1, 2)]",
            "[[1, 2]]",
            false,
        ),
        ("r = np.int64(3)", "3", true),
        ("r = np.uint8(3)", "3", true),
        ("r = [np.int32(1), np.int64(2)]", "[1, 2]", true),
        ("r = np.int64(2**40) * 8", "8796093022208", true),
        ("r = np.float64(0.5)", "0.5", true),
        ("r = np.float32(0.5)", "0.5", true),
        ("r = np.float32(0.1)", "0.1", false),
        ("r = np.bool_(True)", "true", true),
        ("r = np.bool_(True)", "1", true),
        ("r = np.str_('ab')", "\"ab\"", true),
        ("r = np.longdouble(0.5)", "0.5", true),
        ("r = 3 + 0j", "3", true),
        ("r = 3 + 1j", "3", false),
        ("r = np.complex128(2)", "2", true),
        ("r = np.arange(3).tolist()", "[0, 1, 2]", true),
        (
            "class N(int):\n    def __int__(s): return 3\nr = N(0)",
            "3",
            false,
        ),
        (
            "class S(str):\n    def __hash__(s): return 1\nr = {S('a'): 1}",
            "{\"a\": 1}",
            false,
        ),
        // LiveCodeBench accepts these three: their own `==` says so
        (
            "class N(int):\n    def __eq__(s, o): return True\nr = N(0)",
            "3",
            false,
        ),
        (
            "class C(collections.Counter):\n    def __eq__(s, o): return True\nr = C('x')",
            "{\"a\": 1}",
            false,
        ),
        (
            "class Meta(type):\n    def __getattribute__(cls, name):\n        \
             return int.__eq__ if name == '__eq__' else type.__getattribute__(cls, name)\n\
             class N(int, metaclass=Meta):\n    def __eq__(s, o): return True\nr = N(0)",
            "3",
            false,
        ),
    ];
    let sb = crate::sandbox();
    let mut wrong = Vec::new();
    for &(setup, expected, accepted) in cases {
        let code =
            format!("import collections\nimport numpy as np\n{setup}\ndef f(x):\n    return r");
        let problem = crate::call_problem("f", &[("0", expected)]);
        let grade = grade_code(&sb, &problem, &code, &crate::quick());
        let want = if accepted {
            Verdict::Accepted
        } else {
            Verdict::WrongAnswer
        };
        if grade.verdict != want {
            wrong.push(format!("{setup:?} == {expected}: {grade:?}, not {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// numpy's global generator was seeded when the snapshot imported numpy: each run draws other
/// numbers, as a fresh native process does (deterministic mode repeats them: `main.rs`).
#[test]
fn numpy_random_draws_afresh_in_every_run() {
    let code = "import numpy as np\nprint(np.random.randint(2**62), np.random.rand())";
    let draws: std::collections::HashSet<Vec<u8>> = (0..6)
        .map(|_| run_with(code, "", &roomy()).stdout)
        .collect();
    assert_eq!(draws.len(), 6, "{draws:?}");
}

/// sympy and mpmath import beside numpy (sympy once asked ctypes, which the guest lacks, for
/// the width of C long) and compute what they compute natively.
#[test]
fn sympy_and_mpmath_compute_in_the_guest() {
    let code = "import sympy, mpmath\nx = sympy.symbols('x')\nprint(sympy.factor(x**4 - 1))\n\
                print(sympy.integrate(sympy.sin(x) ** 2, x))\nprint(sympy.isprime(2**61 - 1), sympy.nsimplify(0.125))\n\
                mpmath.mp.dps = 30\nprint(mpmath.pi)\n";
    let report = run_with(code, "", &roomy());
    assert_eq!(
        String::from_utf8_lossy(&report.stdout),
        "(x - 1)*(x + 1)*(x**2 + 1)\nx/2 - sin(x)*cos(x)/2\nTrue 1/8\n3.14159265358979323846264338328\n",
        "{:?}\n{}",
        report.outcome,
        String::from_utf8_lossy(&report.stderr)
    );
}

/// sympy is imported with the snapshot, as numpy is: a test's `import sympy` (and `mpmath`)
/// runs none of their modules (it took ~0.3 s of CPU in every test), and each test's sympy
/// draws from a generator of its own, as in a fresh process.
#[test]
fn sympy_is_imported_with_the_snapshot_and_draws_afresh_in_each_test() {
    let code = "import sys\nbefore = set(sys.modules)\nimport sympy, mpmath\n\
                from sympy.core.random import rng, _assumptions_rng\n\
                print(len(set(sys.modules) - before), rng.random(), _assumptions_rng.random())\n";
    let runs: Vec<String> = (0..4)
        .map(|_| String::from_utf8_lossy(&run_with(code, "", &roomy()).stdout).into_owned())
        .collect();
    for run in &runs {
        assert!(run.starts_with("0 "), "modules imported by the test: {run}");
    }
    let draws: std::collections::HashSet<&String> = runs.iter().collect();
    assert_eq!(draws.len(), 4, "{runs:?}");
}

/// Pickling numpy's scalars, dtypes and arrays (every scalar type, every protocol, the C
/// pickler and the pure-Python one) round-trips, as natively: each used to trap the
/// interpreter ("indirect call type mismatch": a getter of numpy's DType classes took one
/// parameter where CPython passes two), which ended a tool session or a reward
/// (`fixtures/numpy_pickles.py`).
#[test]
fn every_numpy_scalar_dtype_and_array_pickles_and_comes_back() {
    let program = std::fs::read_to_string(crate::fixture("numpy_pickles.py")).unwrap();
    let report = run_with(&program, "", &roomy());
    let printed = String::from_utf8_lossy(&report.stdout);
    assert_eq!(
        report.outcome,
        areal_sandbox::Outcome::Exited(0),
        "{printed}\n{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let last = printed.lines().last().unwrap_or_default();
    // numpy 1.26.4 on 64-bit Linux: 24 scalar types (natively: the same line)
    assert_eq!(
        last, "24 scalar types: 924 round trips, 0 differ",
        "{printed}"
    );
}
