//! Hostile programs: each gets the verdict it must get, and the host is unharmed, alone and
//! all at once on parallel threads.

use std::collections::BTreeMap;
use std::path::Path;

use areal_reward_code::{Grade, grade_code};
use areal_sandbox::Pool;
use areal_sdk::Verdict;

use crate::{call_problem, quick, sandbox, stdin_problem};

use Verdict::{
    Accepted as AC, MemoryLimit as MLE, OutputLimit as OLE, RuntimeError as RE, TimeLimit as TLE,
    WrongAnswer as WA,
};

/// Host paths the programs go after; none may exist, change or vanish afterwards.
const HOST_TARGET: &str = "/tmp/areal-hostile-written";

#[derive(Clone, Copy)]
enum Kind {
    /// Read two integers from stdin, print their sum ("1 2" → 3, "5 7" → 12).
    Stdin,
    /// `add(a, b)` returns their sum.
    Call,
}

use Kind::{Call, Stdin};

/// (name, kind, program, verdict it must get)
const PROGRAMS: &[(&str, Kind, &str, Verdict)] = &[
    // CPU and wall time
    ("infinite loop", Stdin, "while True:\n    pass", TLE),
    ("sleep", Stdin, "import time\ntime.sleep(1000)", TLE),
    (
        "busy wait on the clock",
        Stdin,
        "import time\nt = time.time()\nwhile time.time() - t < 1000:\n    pass",
        TLE,
    ),
    // The watchdog stops a guest wherever it is: in CPython's C too (the regex engine).
    (
        "catastrophic regex backtracking",
        Stdin,
        "import re\nprint(re.match('(a*)*b', 'a' * 40))",
        TLE,
    ),
    (
        "infinite loop in a call",
        Call,
        "def add(a, b):\n    while True:\n        a += 1",
        TLE,
    ),
    (
        "sleep in a call",
        Call,
        "import time\ndef add(a, b):\n    time.sleep(1000)",
        TLE,
    ),
    (
        "select with no fds",
        Stdin,
        "import select\nselect.select([], [], [], 1000)",
        TLE,
    ),
    (
        "select on stdin",
        Stdin,
        "import select, sys\nselect.select([sys.stdin], [], [], 1000)\nprint(3)",
        RE,
    ),
    // memory
    (
        "one huge allocation",
        Stdin,
        "x = bytearray(2 * 10**9)",
        MLE,
    ),
    (
        "growing list",
        Stdin,
        "l = []\nwhile True:\n    l.append(bytearray(10**6))",
        MLE,
    ),
    (
        "string doubling",
        Stdin,
        "s = 'x'\nwhile True:\n    s += s",
        MLE,
    ),
    (
        "memory bomb in a call",
        Call,
        "def add(a, b):\n    return [0] * (10**9)",
        MLE,
    ),
    (
        "numpy: one huge array",
        Stdin,
        "import numpy as np\nx = np.ones(2 * 10**8)",
        MLE,
    ),
    (
        "numpy: arrays that keep coming",
        Stdin,
        "import numpy as np\nl = []\nwhile True:\n    l.append(np.ones(10**6))",
        MLE,
    ),
    (
        "numpy: an array that doubles",
        Stdin,
        "import numpy as np\na = np.ones(1)\nwhile True:\n    a = np.concatenate([a, a])",
        MLE,
    ),
    // Running out of linear memory traps the guest: there is no MemoryError to catch.
    (
        "catching MemoryError",
        Stdin,
        "try:\n    x = bytearray(2 * 10**9)\nexcept MemoryError:\n    print(3)",
        MLE,
    ),
    // recursion
    (
        "unbounded recursion",
        Stdin,
        "def f(n):\n    return f(n + 1)\nf(0)",
        RE,
    ),
    // Python frames live on the heap: lifting the limit runs out of memory.
    (
        "unbounded recursion, limit lifted",
        Stdin,
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1) + 1\nf(0)",
        MLE,
    ),
    (
        "unbounded C recursion",
        Stdin,
        "import functools\n@functools.lru_cache(None)\ndef f(n):\n    return f(n + 1)\nimport sys\nsys.setrecursionlimit(10**8)\nf(0)",
        RE,
    ),
    // CPython's parser reports its own stack overflow as MemoryError.
    (
        "parser bomb",
        Stdin,
        "eval('(' * 1000000 + ')' * 1000000)",
        MLE,
    ),
    // output
    (
        "stdout flood",
        Stdin,
        "while True:\n    print('x' * 1000)",
        OLE,
    ),
    (
        "one giant line",
        Stdin,
        "import sys\nsys.stdout.write('y' * (1 << 22))",
        OLE,
    ),
    (
        "stdout flood through os.write",
        Stdin,
        "import os\nwhile True:\n    os.write(1, b'z' * 65536)",
        OLE,
    ),
    // stderr past its cap is dropped, so this one runs until its time is up.
    (
        "stderr flood",
        Stdin,
        "import sys\nwhile True:\n    sys.stderr.write('e' * 1000)",
        TLE,
    ),
    // processes and threads
    // Threads run to completion inside start() (there are no threads in the guest).
    (
        "thread bomb",
        Stdin,
        "import threading, time\nfor _ in range(10**6):\n    threading.Thread(target=time.sleep, args=(10,)).start()",
        TLE,
    ),
    (
        "_thread",
        Stdin,
        "import _thread\n_thread.start_new_thread(print, (1,))\nprint(3)",
        RE,
    ),
    ("fork", Stdin, "import os\nos.fork()\nprint(3)", RE),
    (
        "subprocess",
        Stdin,
        "import subprocess\nprint(subprocess.check_output(['cat', '/etc/passwd']))",
        RE,
    ),
    (
        "os.system",
        Stdin,
        "import os\nos.system('touch /tmp/areal-hostile-written')",
        RE,
    ),
    (
        "exec a shell",
        Stdin,
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'touch /tmp/areal-hostile-written'])",
        RE,
    ),
    (
        "multiprocessing",
        Stdin,
        "import multiprocessing\nmultiprocessing.Pool(2).map(print, [1])",
        RE,
    ),
    (
        "kill the parent",
        Stdin,
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        RE,
    ),
    // host files
    (
        "read /etc/passwd",
        Stdin,
        "print(open('/etc/passwd').read())",
        RE,
    ),
    (
        "list the root",
        Stdin,
        "import os\nprint(os.listdir('/'))",
        RE,
    ),
    (
        "climb out of the stdlib mount",
        Stdin,
        "print(open('/usr/local/lib/python3.11/../../../../etc/passwd').read())",
        RE,
    ),
    (
        "write a host file",
        Stdin,
        "open('/tmp/areal-hostile-written', 'w').write('owned')",
        RE,
    ),
    (
        "write into the stdlib",
        Stdin,
        "open('/usr/local/lib/python3.11/areal_evil.py', 'w').write('x')",
        RE,
    ),
    (
        "delete from the stdlib",
        Stdin,
        "import os\nos.remove('/usr/local/lib/python3.11/this.py')",
        RE,
    ),
    (
        "symlink out",
        Stdin,
        "import os\nos.symlink('/etc/passwd', '/usr/local/lib/python3.11/pw')",
        RE,
    ),
    (
        "read /proc",
        Stdin,
        "print(open('/proc/self/environ').read())",
        RE,
    ),
    // network, environment, native code
    (
        "socket",
        Stdin,
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
        RE,
    ),
    (
        "DNS",
        Stdin,
        "import socket\nprint(socket.gethostbyname('example.com'))",
        RE,
    ),
    (
        "urllib",
        Stdin,
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1/')",
        RE,
    ),
    (
        "host environment",
        Stdin,
        "import os\na, b = map(int, input().split())\nprint(a + b if not ({'PATH', 'HOME', 'USER', 'CARGO'} & set(os.environ)) else os.environ)",
        AC,
    ),
    (
        "ctypes",
        Stdin,
        "import ctypes\nctypes.CDLL(None).system(b'id')",
        RE,
    ),
    // cheating
    (
        "search memory for the answers",
        Stdin,
        "import gc\nfound = [o for o in gc.get_objects() if isinstance(o, (str, bytes)) and ('output' in str(o) or 'expected' in str(o))]\nprint(len(found))",
        WA,
    ),
    (
        "__eq__ always true",
        Call,
        "class Any:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Any()",
        WA,
    ),
    (
        "int subclass equal to all",
        Call,
        "class Int(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Int(0)",
        WA,
    ),
    (
        "forged result then crash",
        Call,
        "import os\ndef add(a, b):\n    os.write(1, b'\\x1eareal-result\\x1e{\"i\": \"999\"}\\n')\n    os._exit(0)",
        WA,
    ),
    (
        "os._exit(0) before printing",
        Stdin,
        "import os\nos._exit(0)\nprint(3)",
        WA,
    ),
    (
        "sys.exit(0) before printing",
        Stdin,
        "import sys\nsys.exit(0)\nprint(3)",
        WA,
    ),
    (
        "exit in a call",
        Call,
        "import sys\ndef add(a, b):\n    sys.exit(0)",
        RE,
    ),
    // The harness's own exit statuses, forged: none may reach `error`, the grader-failure
    // verdict training drops without penalty (a policy would learn to exit on hard problems).
    ("os._exit(2)", Stdin, "import os\nos._exit(2)", RE),
    (
        "os._exit(2) in a call",
        Call,
        "import os\ndef add(a, b):\n    os._exit(2)",
        RE,
    ),
    (
        "os._exit(2) at import in a call",
        Call,
        "import os\nos._exit(2)\ndef add(a, b):\n    return a + b",
        RE,
    ),
    (
        "os._exit(2) after a forged harness message",
        Stdin,
        "import os\nos.write(2, b'the harness was misused')\nos._exit(2)",
        RE,
    ),
    ("os._exit(4)", Stdin, "import os\nos._exit(4)", RE),
    (
        "os._exit(5)",
        Call,
        "import os\ndef add(a, b):\n    os._exit(5)",
        WA,
    ),
    ("os._exit(3)", Stdin, "import os\nos._exit(3)", MLE),
    ("os._exit(-1)", Stdin, "import os\nos._exit(-1)", RE),
    // Host file descriptors: a guest may hold 64 open resources; more traps it, and the
    // guests grading beside it (the `together` pass) still get theirs.
    (
        "open files until the host runs out",
        Stdin,
        "fs = []\nwhile True:\n    fs.append(open('/usr/local/lib/python3.11/os.py'))",
        RE,
    ),
    (
        "open directories until the host runs out",
        Stdin,
        "import os\nfs = []\nwhile True:\n    fs.append(os.open('/usr/local/lib/python3.11', os.O_RDONLY))",
        RE,
    ),
    (
        "open files, catching the failure",
        Stdin,
        "fs = []\ntry:\n    while True:\n        fs.append(open('/usr/local/lib/python3.11/os.py'))\nexcept BaseException:\n    pass\nprint(3)",
        RE,
    ),
    (
        "a few open files are fine",
        Stdin,
        "fs = [open('/usr/local/lib/python3.11/os.py') for _ in range(20)]\na, b = map(int, input().split())\nprint(a + b)",
        AC,
    ),
    ("hard-coded first answer", Stdin, "print(3)", WA),
    ("syntax error", Stdin, "def f(:\n    pass", RE),
    (
        "patch the harness",
        Stdin,
        "import sys\nm = sys.modules['__main__']\nm.stdout_matches = lambda *a: True\nprint('wrong')",
        WA,
    ),
    // honest programs that must still pass amid all this
    (
        "honest stdin",
        Stdin,
        "a, b = map(int, input().split())\nprint(a + b)",
        AC,
    ),
    ("honest call", Call, "def add(a, b):\n    return a + b", AC),
];

fn grade_one(sb: &areal_sandbox::Sandbox, kind: Kind, code: &str) -> Grade {
    let problem = match kind {
        Stdin => stdin_problem(&[("1 2\n", "3\n"), ("5 7\n", "12\n")]),
        Call => call_problem("add", &[("1\n2", "3"), ("5\n7", "12")]),
    };
    grade_code(sb, &problem, code, &quick())
}

/// Everything on the host a program could have touched.
fn host_state(stdlib: &Path) -> BTreeMap<String, u64> {
    let mut files = BTreeMap::new();
    let mut stack = vec![stdlib.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                files.insert(entry.path().display().to_string(), meta.len());
            }
        }
    }
    files
}

fn check(results: &[(usize, Grade)]) {
    let mut wrong = Vec::new();
    for (i, grade) in results {
        let (name, _, _, want) = PROGRAMS[*i];
        if grade.verdict != want {
            wrong.push(format!(
                "{name}: got {} (message {:?}), want {}",
                grade.verdict.as_str(),
                grade.message,
                want.as_str()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong verdicts:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn hostile_programs_get_their_verdicts_and_the_host_is_unharmed() {
    assert!(PROGRAMS.len() >= 60);
    let sb = sandbox();
    let stdlib = sb.interpreter().stdlib();
    let before = host_state(&stdlib);
    let _ = std::fs::remove_file(HOST_TARGET);

    // One at a time.
    let alone: Vec<(usize, Grade)> = PROGRAMS
        .iter()
        .enumerate()
        .map(|(i, (_, kind, code, _))| (i, grade_one(&sb, *kind, code)))
        .collect();
    check(&alone);

    // All at once on two threads, twice over: one guest never disturbs another.
    let pool = Pool::new(sb.clone(), 2);
    let jobs: Vec<usize> = (0..PROGRAMS.len()).chain(0..PROGRAMS.len()).collect();
    let together: Vec<(usize, Grade)> = pool
        .map(jobs.clone(), |sb, i| {
            let (_, kind, code, _) = PROGRAMS[i];
            grade_one(sb, kind, code)
        })
        .into_iter()
        .zip(jobs)
        .map(|(g, i)| (i, g.expect("a worker finished the job")))
        .collect();
    check(&together);

    assert!(
        !Path::new(HOST_TARGET).exists(),
        "a guest wrote {HOST_TARGET}"
    );
    assert_eq!(host_state(&stdlib), before, "the stdlib mount changed");
    // The sandbox still grades normally afterwards.
    assert_eq!(
        grade_one(&sb, Stdin, "print(sum(map(int, input().split())))").verdict,
        AC
    );
}

/// Verdicts do not depend on how busy the machine is: the time limit counts the guest's own
/// CPU time and sleeps, not the wall time it spends waiting for a core. (A fresh clone's test
/// run once failed here while other work ran: unbounded recursion got `time_limit`.)
#[test]
fn verdicts_do_not_depend_on_load() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let sb = sandbox();
    let options = areal_reward_code::GradeOptions {
        timeout_s: 2.0,
        time_scale: 1.5,
        ..quick()
    };
    // ~1 s of CPU in the guest: well inside its 3 s, far from it in wall time on a busy machine
    let counting = "n = 0\nfor i in range(4_000_000):\n    n += i & 1\na, b = map(int, input().split())\nprint(a + b if n else 0)";
    let cases: [(&str, &str, Verdict); 3] = [
        (
            "unbounded recursion",
            "def f(n):\n    return f(n + 1)\nf(0)",
            RE,
        ),
        ("a second of counting", counting, AC),
        ("sleep", "import time\ntime.sleep(1000)", TLE),
    ];
    let busy = Arc::new(AtomicBool::new(true));
    let hogs: Vec<_> = (0..6)
        .map(|_| {
            let busy = busy.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while busy.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    let problem = stdin_problem(&[("1 2\n", "3\n")]);
    let verdicts: Vec<(&str, Verdict, Verdict)> = cases
        .iter()
        .map(|(name, code, want)| {
            (
                *name,
                grade_code(&sb, &problem, code, &options).verdict,
                *want,
            )
        })
        .collect();
    busy.store(false, Ordering::Relaxed);
    for hog in hogs {
        hog.join().unwrap();
    }
    for (name, got, want) in verdicts {
        assert_eq!(got, want, "{name} on a busy machine");
    }
}
