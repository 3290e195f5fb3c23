//! Sessions of Python cells: state kept between the calls of one session and never seen by
//! another, errors and output caps that cost one call, limits that end the session.
//!
//! Needs the WASI interpreter (`make python-wasi`); `make test` builds it first.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use areal_sandbox::{
    CellReport, Limits, MemoryBudget, Mode, Outcome, PYTHON_CELLS, Sandbox, Session, Settings,
};

fn sandbox(mode: Mode) -> Arc<Sandbox> {
    static FAST: OnceLock<Arc<Sandbox>> = OnceLock::new();
    static DETERMINISTIC: OnceLock<Arc<Sandbox>> = OnceLock::new();
    let cell = match mode {
        Mode::Fast => &FAST,
        Mode::Deterministic => &DETERMINISTIC,
    };
    cell.get_or_init(|| {
        Arc::new(
            Sandbox::new(&Settings {
                mode,
                preinit: Some(PYTHON_CELLS.into()),
                ..Settings::default()
            })
            .expect("the WASI interpreter: run `make python-wasi`"),
        )
    })
    .clone()
}

fn limits() -> Limits {
    Limits {
        cpu: Duration::from_secs(2),
        wall: Duration::from_secs(60),
        memory_bytes: 128 << 20,
        stdout_bytes: 4096,
        ..Limits::default()
    }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f)
}

fn text(report: &CellReport) -> String {
    String::from_utf8_lossy(&report.stdout).into_owned()
}

async fn cell(session: &mut Session, source: &str) -> CellReport {
    session
        .call(source.as_bytes())
        .await
        .expect("the host runs the cell")
}

/// A session can live in a task that moves between threads (an episode on tokio).
#[test]
fn a_session_is_send() {
    fn send<T: Send>() {}
    send::<Session>();
}

#[test]
fn a_session_keeps_its_names_between_calls_and_shows_the_last_value() {
    let sb = sandbox(Mode::Fast);
    block_on(async {
        let mut s = Session::start(&sb, &limits(), 0).await.unwrap();
        let first = cell(
            &mut s,
            "import math\nx = 41\ndef twice(v):\n    return 2 * v\n",
        )
        .await;
        assert_eq!(first.outcome, Outcome::Exited(0));
        assert_eq!(text(&first), "", "assignments show nothing");
        let second = cell(&mut s, "print('x is', x)\ntwice(x) + math.floor(0.5)").await;
        assert_eq!(text(&second), "x is 41\n82\n");
        let third = cell(&mut s, "x += 1\nx").await;
        assert_eq!(text(&third), "42\n");
        assert_eq!(text(&cell(&mut s, "None").await), "", "None is not shown");
        assert!(s.is_alive());
        assert_eq!(s.calls(), 4);
    });
}

#[test]
fn sessions_share_nothing() {
    let sb = sandbox(Mode::Fast);
    block_on(async {
        let mut a = Session::start(&sb, &limits(), 0).await.unwrap();
        let mut b = Session::start(&sb, &limits(), 0).await.unwrap();
        cell(&mut a, "secret = 'a'\nimport json\njson.answer = 1").await;
        let seen = cell(&mut b, "print(secret)").await;
        assert!(text(&seen).contains("NameError"), "{}", text(&seen));
        let module = cell(&mut b, "import json\nhasattr(json, 'answer')").await;
        assert_eq!(
            text(&module),
            "False\n",
            "a module patched in one session is not in another"
        );
        assert_eq!(text(&cell(&mut a, "secret").await), "'a'\n");
    });
}

#[test]
fn an_exception_is_the_cells_traceback_and_the_session_goes_on() {
    let sb = sandbox(Mode::Fast);
    block_on(async {
        let mut s = Session::start(&sb, &limits(), 0).await.unwrap();
        cell(&mut s, "y = 3").await;
        let error = cell(&mut s, "def f(v):\n    return 1 / v\nprint('before')\nf(0)").await;
        assert_eq!(error.outcome, Outcome::Exited(2), "a cell that raised");
        assert!(
            error.stderr.is_empty(),
            "{:?}",
            String::from_utf8_lossy(&error.stderr)
        );
        let out = text(&error);
        assert!(out.starts_with("before\nTraceback"), "{out}");
        assert!(out.contains("ZeroDivisionError: division by zero"), "{out}");
        assert!(out.contains("File \"<cell>\", line 2, in f"), "{out}");
        assert!(!out.contains("areal_main"), "only the cell's frames: {out}");
        let syntax = cell(&mut s, "def broken(:\n").await;
        assert!(text(&syntax).contains("SyntaxError"), "{}", text(&syntax));
        assert_eq!(syntax.outcome, Outcome::Exited(2));
        let exit = cell(&mut s, "import sys\nsys.exit(3)").await;
        assert_eq!(
            exit.outcome,
            Outcome::Exited(0),
            "exit() ends the cell, not the session"
        );
        assert_eq!(text(&cell(&mut s, "y").await), "3\n");
        assert!(s.is_alive());
    });
}

#[test]
fn a_cell_that_exits_or_closes_its_streams_ends_itself_not_the_session() {
    let sb = sandbox(Mode::Fast);
    block_on(async {
        let mut s = Session::start(&sb, &limits(), 0).await.unwrap();
        cell(&mut s, "kept = 41").await;
        // `exit()` and `quit()` close sys.stdin before they raise SystemExit
        let cells = [
            "print('bye')\nexit()",
            "quit()",
            "exit(5)",
            "import sys\nsys.exit('why')",
            "import sys\nsys.stdin.close()",
            "import sys\nsys.stdout.close()",
            "import sys\nsys.stderr.close()",
            "import sys, io\nsys.stdout = io.StringIO()",
            "import sys\nsys.stdin = None\nsys.stdout = None",
            "import sys\nsys.stdout.close()\nraise ValueError('after closing')",
        ];
        for (i, source) in cells.iter().enumerate() {
            let report = cell(&mut s, source).await;
            if source.contains("raise") {
                assert_eq!(report.outcome, Outcome::Exited(2), "{source}");
                assert!(
                    text(&report).contains("ValueError: after closing"),
                    "{source}: {}",
                    text(&report)
                );
            } else {
                assert_eq!(
                    report.outcome,
                    Outcome::Exited(0),
                    "{source}: {}",
                    text(&report)
                );
            }
            if i == 0 {
                assert_eq!(text(&report), "bye\n");
            }
            let after = cell(&mut s, &format!("kept += 1\nprint('still', {i})\nkept")).await;
            assert_eq!(
                after.outcome,
                Outcome::Exited(0),
                "after {source}: {} {}",
                text(&after),
                String::from_utf8_lossy(&after.stderr)
            );
            assert_eq!(
                text(&after),
                format!("still {i}\n{}\n", 42 + i),
                "after {source}"
            );
            let input = cell(&mut s, "input()").await;
            assert!(
                text(&input).contains("EOFError"),
                "after {source}: {}",
                text(&input)
            );
            let raised = cell(&mut s, "1 / 0").await;
            assert!(
                text(&raised).contains("ZeroDivisionError"),
                "after {source}: {}",
                text(&raised)
            );
        }
        assert!(s.is_alive());
        assert_eq!(s.calls(), 1 + 4 * cells.len() as u64);
    });
}

#[test]
fn output_past_the_cap_is_cut_and_the_session_goes_on() {
    let sb = sandbox(Mode::Fast);
    block_on(async {
        let mut s = Session::start(&sb, &limits(), 0).await.unwrap();
        let flood = cell(&mut s, "print('x' * 1_000_000)\nz = 5").await;
        assert_eq!(flood.outcome, Outcome::Exited(0));
        assert!(flood.truncated);
        assert_eq!(flood.stdout.len(), 4096);
        let next = cell(&mut s, "z").await;
        assert!(!next.truncated);
        assert_eq!(text(&next), "5\n");
    });
}

#[test]
fn memory_past_the_cap_ends_the_session() {
    let sb = sandbox(Mode::Fast);
    block_on(async {
        let mut s = Session::start(&sb, &limits(), 0).await.unwrap();
        cell(&mut s, "kept = [1, 2, 3]").await;
        let hoard = cell(&mut s, "big = bytearray(512 << 20)").await;
        assert_eq!(hoard.outcome, Outcome::MemoryLimit);
        assert!(hoard.peak_memory <= 128 << 20);
        assert_eq!(hoard.over_budget, None, "its own cap stopped it");
        assert!(!s.is_alive());
        let mut fresh = Session::start(&sb, &limits(), 0).await.unwrap();
        assert_eq!(text(&cell(&mut fresh, "len([1, 2])").await), "2\n");
    });
}

/// Sessions charged to one budget hold no more than it together: one more is refused and a
/// session's growth past what is left ends it, both naming the budget; what a session held
/// goes back when it drops.
#[test]
fn the_sessions_of_a_budget_hold_no_more_than_it_together() {
    let sb = sandbox(Mode::Fast);
    let roomy = Limits {
        memory_bytes: 256 << 20,
        ..limits()
    };
    block_on(async {
        let budget = MemoryBudget::new(320 << 20, "the test's");
        let mut open = Vec::new();
        let refused = loop {
            match Session::start_within(&sb, &roomy, 0, &budget).await {
                Ok(s) => open.push(s),
                Err(e) => break e.to_string(),
            }
            assert!(open.len() < 10, "10 sessions in 320 MiB");
        };
        assert!(open.len() >= 2, "{refused}");
        assert!(
            refused.contains("no memory left for another session"),
            "{refused}"
        );
        assert!(
            refused.contains("320 MiB") && refused.contains("the test's"),
            "{refused}"
        );
        // what the budget holds is the sessions' memory, to the byte
        let mut held = 0;
        for s in &mut open {
            let report = cell(s, "0").await;
            assert_eq!(report.outcome, Outcome::Exited(0));
            held += report.peak_memory;
        }
        assert_eq!(budget.held(), held);
        let left = (320 << 20) - held;
        assert!(left < held / open.len(), "one more would have fit");
        // a session growing past what is left is stopped, naming the budget; the others go on
        let grown = cell(
            &mut open[0],
            &format!("big = bytearray({})", left + (1 << 20)),
        )
        .await;
        assert_eq!(grown.outcome, Outcome::MemoryLimit);
        let why = grown.over_budget.expect("the budget stopped it");
        assert!(
            why.contains("320 MiB") && why.contains("the test's"),
            "{why}"
        );
        assert!(!open[0].is_alive());
        assert_eq!(text(&cell(&mut open[1], "1 + 1").await), "2\n");
        open.clear();
        assert_eq!(budget.held(), 0, "every byte given back");
        let mut fresh = Session::start_within(&sb, &roomy, 0, &budget)
            .await
            .unwrap();
        assert_eq!(text(&cell(&mut fresh, "len([1, 2])").await), "2\n");
    });
}

#[test]
fn a_memory_limit_below_the_snapshot_is_refused_clearly() {
    let sb = sandbox(Mode::Fast);
    block_on(async {
        let tiny = Limits {
            memory_bytes: 8 << 20,
            ..limits()
        };
        let error = Session::start(&sb, &tiny, 0).await.unwrap_err().to_string();
        assert!(error.contains("memory limit of 8 MiB"), "{error}");
    });
}

#[test]
fn a_cell_out_of_time_ends_the_session() {
    let sb = sandbox(Mode::Fast);
    block_on(async {
        let quick = Limits {
            cpu: Duration::from_millis(300),
            ..limits()
        };
        let mut s = Session::start(&sb, &quick, 0).await.unwrap();
        cell(&mut s, "n = 1").await;
        // each call has its own limit: three calls of ~0.15 s each pass
        for _ in 0..3 {
            let busy = cell(
                &mut s,
                "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.15: pass",
            )
            .await;
            assert_eq!(busy.outcome, Outcome::Exited(0), "{}", text(&busy));
        }
        let spin = cell(&mut s, "print('spinning')\nwhile True:\n    n += 1").await;
        assert_eq!(spin.outcome, Outcome::TimeLimit);
        assert_eq!(
            text(&spin),
            "spinning\n",
            "what it printed before it was stopped"
        );
        assert!(!s.is_alive());
        let after = cell(&mut s, "n").await;
        assert_eq!(
            after.outcome,
            Outcome::TimeLimit,
            "an ended session runs nothing"
        );
        assert!(after.stdout.is_empty());
        // a fresh session is fine
        let mut fresh = Session::start(&sb, &quick, 0).await.unwrap();
        assert_eq!(text(&cell(&mut fresh, "1 + 1").await), "2\n");
    });
}

#[test]
fn deterministic_sessions_repeat_bit_for_bit() {
    let sb = sandbox(Mode::Deterministic);
    block_on(async {
        let run = || async {
            let mut s = Session::start(&sb, &limits(), 7).await.unwrap();
            let mut outs = Vec::new();
            for source in [
                "import random\nrandom.random()",
                "{(i, -i) for i in range(5)}",
                "import time\ntime.time() > 0",
            ] {
                let r = cell(&mut s, source).await;
                outs.push((text(&r), r.fuel));
            }
            outs
        };
        let (a, b) = (run().await, run().await);
        assert_eq!(a, b);
        assert!(a.iter().all(|(_, fuel)| fuel.is_some_and(|f| f > 0)));
    });
}

/// The compiled snapshot is cached in the user's own folder (`module_cache_dir`,
/// `$AREAL_MODULE_CACHE`), never beside the interpreter, which may be installed read-only or
/// shared by users.
#[test]
fn the_compiled_snapshot_is_cached_in_the_users_folder_not_beside_the_interpreter() {
    let _ = sandbox(Mode::Fast);
    let interpreter = areal_sandbox::Interpreter::locate().unwrap();
    let folder = interpreter.wasm().parent().unwrap().to_owned();
    assert!(!folder.join("compiled").exists(), "{}", folder.display());
    let cache = areal_sandbox::module_cache_dir();
    let cached: Vec<String> = std::fs::read_dir(&cache)
        .unwrap_or_else(|e| panic!("{}: {e}", cache.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snapshot-") && n.ends_with(".cwasm"))
        .collect();
    assert!(!cached.is_empty(), "nothing cached in {}", cache.display());
}
