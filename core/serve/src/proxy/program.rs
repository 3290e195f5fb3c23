//! The user's agent program, one per episode: started with the session's address and key, the
//! item on its standard input, under a launcher that keeps every process it starts in its tree
//! (`warden.rs`), bounded in processes and memory, killed with everything it started.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::warden::{Bounds, Tree};

/// How much of the program's output is kept (its end), for the message of a failure.
const TAIL_BYTES: usize = 4096;

/// The end of what a program wrote, and how much it wrote.
#[derive(Default)]
pub(crate) struct Tail {
    bytes: Vec<u8>,
    pub(crate) total: u64,
    /// Its output pipes not yet at their end.
    open: usize,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > 2 * TAIL_BYTES {
            let cut = self.bytes.len() - TAIL_BYTES;
            self.bytes.drain(..cut);
        }
    }

    /// The last bytes written, as text.
    pub(crate) fn text(&self) -> String {
        let start = self.bytes.len().saturating_sub(TAIL_BYTES);
        String::from_utf8_lossy(&self.bytes[start..])
            .trim()
            .to_owned()
    }
}

/// The end of what a program that has exited wrote: once its pipes are read to their end, or
/// after a second (a process it started may hold them open).
pub(crate) fn final_output(output: &Mutex<Tail>) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        {
            let tail = output.lock().expect("output lock poisoned");
            if tail.open == 0 || std::time::Instant::now() >= deadline {
                return tail.text();
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A running agent program.
pub(crate) struct Program {
    tree: Tree,
    output: Arc<Mutex<Tail>>,
}

/// The launcher: a child subreaper (set before it runs, and kept across `exec`) that bounds
/// its address space when asked (`$1` KiB, 0: none), runs the program (`$2...`) with
/// descriptor 3 closed, writes its exit status to descriptor 3 and then becomes a `sleep`
/// holding the program's tree until it is killed after it. (A `sleep` it would start would
/// be a child that killing the tree only replaces.)
const LAUNCHER: &str = r#"if [ "$1" != 0 ]; then ulimit -v "$1" || exit 126; fi
shift
"$@" 3>&-
echo "$?" >&3
exec sleep 2147483647 3>&- </dev/null >/dev/null 2>/dev/null"#;

/// Resolves when a program exits, with how.
pub(crate) type Exit = oneshot::Receiver<std::io::Result<ExitStatus>>;

/// What a program is started with.
pub(crate) struct Launch<'a> {
    pub(crate) command: &'a [String],
    pub(crate) env: Vec<(String, String)>,
    pub(crate) stdin: Vec<u8>,
    pub(crate) memory_mb: Option<u64>,
    pub(crate) max_processes: usize,
    pub(crate) workdir: Option<&'a Path>,
}

impl Program {
    /// Start `launch.command` under its launcher, its tree watched: each process's address
    /// space bounded by `memory_mb` (`ulimit -v`), the resident memory of all of them
    /// together by `memory_mb` too, and their number by `max_processes`.
    pub(crate) fn start(launch: Launch<'_>) -> std::io::Result<(Self, Exit)> {
        let kib = launch.memory_mb.map_or(0, |mb| mb.saturating_mul(1024));
        let mut command = Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(LAUNCHER)
            .arg("areal-agent")
            .arg(kib.to_string())
            .args(launch.command)
            .envs(launch.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // its own process group too, so that a terminal's signals reach it as one
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        if let Some(dir) = launch.workdir {
            command.current_dir(dir);
        }
        let (mut status_read, status_write) = std::io::pipe()?;
        let status_fd = std::os::fd::AsRawFd::as_raw_fd(&status_write);
        #[expect(unsafe_code, reason = "pre_exec, to make the launcher a subreaper")]
        // SAFETY: between fork and exec only async-signal-safe calls are made (prctl, dup2,
        // fcntl), on integers prepared before the fork
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // the status's descriptor as 3, open across exec
                if status_fd == 3 {
                    if libc::fcntl(3, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(status_fd, 3) != 3 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        drop(status_write);
        let output = Arc::new(Mutex::new(Tail::default()));
        for pipe in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let output = output.clone();
            output.lock().expect("output lock poisoned").open += 1;
            std::thread::Builder::new()
                .name("areal-agent-out".into())
                .spawn(move || drain(pipe, &output))?;
        }
        if let Some(mut stdin) = child.stdin.take() {
            let bytes = launch.stdin;
            // (a program that never reads its input must not hold this side up)
            std::thread::Builder::new()
                .name("areal-agent-in".into())
                .spawn(move || {
                    let _ = stdin.write_all(&bytes);
                })?;
        }
        let bounds = Bounds {
            processes: launch.max_processes,
            memory_bytes: launch.memory_mb.map(|mb| mb.saturating_mul(1 << 20)),
        };
        let tree = Tree::watch(child, bounds);
        let (tx, exited) = oneshot::channel();
        std::thread::Builder::new()
            .name("areal-agent-wait".into())
            .spawn(move || {
                // the program's status, as the launcher's shell says it; nothing when the
                // launcher itself was killed (with the tree)
                let mut said = String::new();
                let _ = status_read.read_to_string(&mut said);
                let _ = tx.send(Ok(exit_status(said.trim())));
            })?;
        Ok((Self { tree, output }, exited))
    }

    /// Kill the program and every process it started.
    pub(crate) fn kill(&self) {
        self.tree.kill();
    }

    /// What the program passed, when the warden killed it for that.
    pub(crate) fn breach(&self) -> Option<String> {
        self.tree.breach()
    }

    /// The same, for whoever waits for its end.
    pub(crate) fn breaches(&self) -> super::warden::Breaches {
        self.tree.breaches()
    }

    /// What it writes, as it writes it.
    pub(crate) fn output_handle(&self) -> Arc<Mutex<Tail>> {
        self.output.clone()
    }

    /// The end of what it wrote, once it has exited ([`final_output`]).
    pub(crate) fn output(&self) -> String {
        final_output(&self.output)
    }
}

fn drain(mut pipe: Box<dyn Read + Send>, output: &Mutex<Tail>) {
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => output.lock().expect("output lock poisoned").push(&buf[..n]),
        }
    }
    output.lock().expect("output lock poisoned").open -= 1;
}

/// A shell's `$?` as an exit status: 128 + n for a program killed by signal n; a launcher
/// that said nothing was killed itself.
fn exit_status(said: &str) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match said.parse::<i32>() {
        Ok(code @ 0..=128) => ExitStatus::from_raw(code << 8),
        Ok(code @ 129..=255) => ExitStatus::from_raw(code - 128),
        _ => ExitStatus::from_raw(libc::SIGKILL),
    }
}

/// How a program ended, in words.
pub(crate) fn describe(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".into(),
    }
}
