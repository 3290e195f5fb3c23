//! The user's agent program, one process per episode: started with the session's address and
//! key, the item on its standard input, bounded in memory, killed with everything it started.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

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
    pid: u32,
    output: Arc<Mutex<Tail>>,
}

/// Resolves when a program exits, with how.
pub(crate) type Exit = oneshot::Receiver<std::io::Result<ExitStatus>>;

/// What a program is started with.
pub(crate) struct Launch<'a> {
    pub(crate) command: &'a [String],
    pub(crate) env: Vec<(String, String)>,
    pub(crate) stdin: Vec<u8>,
    pub(crate) memory_mb: Option<u64>,
    pub(crate) workdir: Option<&'a Path>,
}

impl Program {
    /// Start `launch.command` in a process group of its own (so that what it starts is
    /// killed with it), its address space bounded by `memory_mb` (`ulimit -v`).
    pub(crate) fn start(launch: Launch<'_>) -> std::io::Result<(Self, Exit)> {
        let mut command = match launch.memory_mb {
            Some(mb) => {
                let mut c = Command::new("/bin/sh");
                c.arg("-c")
                    .arg("ulimit -v \"$0\" || exit 126; exec \"$@\"")
                    .arg((mb.saturating_mul(1024)).to_string())
                    .args(launch.command);
                c
            }
            None => {
                let mut c = Command::new(&launch.command[0]);
                c.args(&launch.command[1..]);
                c
            }
        };
        command
            .envs(launch.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        if let Some(dir) = launch.workdir {
            command.current_dir(dir);
        }
        let mut child = command.spawn()?;
        let pid = child.id();
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
        let (tx, exited) = oneshot::channel();
        std::thread::Builder::new()
            .name("areal-agent-wait".into())
            .spawn(move || {
                let _ = tx.send(child.wait());
            })?;
        Ok((Self { pid, output }, exited))
    }

    /// Kill the program and every process of its group.
    pub(crate) fn kill(&self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pid)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
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

impl Drop for Program {
    fn drop(&mut self) {
        // whatever it started dies with its episode (a no-op once the group is gone)
        self.kill();
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

/// How a program ended, in words.
pub(crate) fn describe(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".into(),
    }
}
