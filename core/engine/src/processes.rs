//! Servers started as child processes (`areal serve ...` on loopback), for reward worker
//! processes, `areal launch local` and the benches: each one's address once it listens, its
//! log, and a stop that leaves none behind.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The environment variable holding the shared token of servers and clients.
pub const TOKEN_ENV: &str = "AREAL_TOKEN";

/// Why a server process could not be started, or did not come up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// Its log file cannot be made.
    #[error("cannot create {}", path.display())]
    Log {
        /// The log file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The program cannot be started.
    #[error("cannot start {}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A thread to read its output cannot be started.
    #[error("cannot start a thread")]
    Thread(#[source] std::io::Error),
    /// It was started but does not listen: it exited, printed something else, or took too
    /// long. Its log's last lines are in the message.
    #[error("the {kind} server {index} failed to start: {why}; its log {}:\n{tail}", log.display())]
    NotListening {
        /// What it serves.
        kind: &'static str,
        /// Its index among the servers started.
        index: usize,
        /// What happened.
        why: String,
        /// Its log.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
}

/// `urls` as the TOML list of an `endpoints` key.
pub fn endpoints(urls: &[&str]) -> String {
    let quoted: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

/// A started server.
struct Server {
    kind: &'static str,
    log: PathBuf,
    child: Child,
    /// Its standard input: closing it stops the server.
    stdin: Option<ChildStdin>,
    /// How it was started, to start it again: the program, the arguments before `serve`, the
    /// options after `serve KIND`.
    exe: PathBuf,
    before: Vec<std::ffi::OsString>,
    config: Vec<std::ffi::OsString>,
    /// Where it listens, once it does.
    addr: Option<String>,
}

/// A server's index and its address, or why it has none.
type Listening = (usize, Result<String, String>);

/// Servers started as child processes; dropped, they are stopped.
#[derive(Default)]
pub struct ServerProcesses {
    started: Vec<Server>,
    /// Each server's address once it listens, or why it does not.
    listening: Option<(mpsc::Sender<Listening>, mpsc::Receiver<Listening>)>,
    /// The shared token every server is started with (in its environment), if any.
    token: Option<String>,
}

impl ServerProcesses {
    /// Start every server from now on with `token` (in its environment): calls without it
    /// are refused.
    pub fn with_token(mut self, token: String) -> Self {
        self.token = Some(token);
        self
    }

    /// Start `exe serve KIND` on a free loopback port with `config` (command-line options),
    /// logging to `logs/KIND-N.log`.
    pub fn start(
        &mut self,
        exe: &Path,
        kind: &'static str,
        config: &[std::ffi::OsString],
        logs: &Path,
    ) -> Result<(), ProcessError> {
        self.start_command(exe, &[], kind, config, logs)
    }

    /// [`start`](Self::start) as `exe BEFORE... serve KIND`: a program given as a command
    /// whose first arguments come before areal's own (a wrapper, say).
    pub fn start_command(
        &mut self,
        exe: &Path,
        before: &[std::ffi::OsString],
        kind: &'static str,
        config: &[std::ffi::OsString],
        logs: &Path,
    ) -> Result<(), ProcessError> {
        let same_kind = self.started.iter().filter(|s| s.kind == kind).count();
        let log = logs.join(format!("{kind}-{same_kind}.log"));
        let index = self.started.len();
        let how = (exe.to_owned(), before.to_vec(), config.to_vec());
        let server = self.spawn(index, how, kind, log, "127.0.0.1:0")?;
        self.started.push(server);
        Ok(())
    }

    fn spawn(
        &mut self,
        index: usize,
        (exe, before, config): (PathBuf, Vec<std::ffi::OsString>, Vec<std::ffi::OsString>),
        kind: &'static str,
        log: PathBuf,
        listen: &str,
    ) -> Result<Server, ProcessError> {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|source| ProcessError::Log {
                path: log.clone(),
                source,
            })?;
        let mut command = Command::new(&exe);
        command
            .args(&before)
            .args([
                "-v",
                "serve",
                kind,
                "--listen",
                listen,
                "--until-stdin-closes",
            ])
            .args(&config)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file.try_clone().map_err(|source| ProcessError::Log {
                path: log.clone(),
                source,
            })?);
        if let Some(token) = &self.token {
            command.env(TOKEN_ENV, token);
        }
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn().map_err(|source| ProcessError::Spawn {
            program: exe.clone(),
            source,
        })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stdin = child.stdin.take();
        let (tx, _) = self.listening.get_or_insert_with(mpsc::channel);
        let tx = tx.clone();
        // the first line says where it listens; the rest joins its log
        std::thread::Builder::new()
            .name(format!("areal-{kind}-{index}"))
            .spawn(move || {
                let mut lines = BufReader::new(stdout).lines();
                let first = match lines.next() {
                    Some(Ok(line)) => line,
                    _ => {
                        let _ = tx.send((index, Err("it exited before listening".into())));
                        return;
                    }
                };
                let addr = first
                    .split_whitespace()
                    .skip_while(|w| *w != "on")
                    .nth(1)
                    .map(str::to_owned);
                let _ = tx.send((
                    index,
                    addr.ok_or_else(|| format!("it printed {first:?} instead of its address")),
                ));
                let mut log = log_file;
                for line in lines.map_while(Result::ok) {
                    let _ = writeln!(log, "{line}");
                }
            })
            .map_err(ProcessError::Thread)?;
        Ok(Server {
            kind,
            log,
            child,
            stdin,
            exe,
            before,
            config,
            addr: None,
        })
    }

    /// Start again, at the address it had, every server that has exited; each one's index
    /// and how that went.
    pub(crate) fn restart_exited(
        &mut self,
        timeout: Duration,
    ) -> Vec<(usize, Result<(), ProcessError>)> {
        let mut done = Vec::new();
        for index in 0..self.started.len() {
            let server = &mut self.started[index];
            let status = match server.child.try_wait() {
                Ok(Some(status)) => status,
                _ => continue,
            };
            let Some(addr) = server.addr.clone() else {
                continue;
            };
            tracing::warn!(
                target: "areal::launch",
                kind = server.kind,
                index,
                %status,
                log = %server.log.display(),
                "a server exited; starting it again at {addr}"
            );
            let how = (
                server.exe.clone(),
                server.before.clone(),
                server.config.clone(),
            );
            let (kind, log) = (server.kind, server.log.clone());
            let listen = addr.trim_start_matches("http://").to_owned();
            let result = self
                .spawn(index, how, kind, log, &listen)
                .and_then(|mut fresh| {
                    fresh.addr = Some(addr.clone());
                    self.started[index] = fresh;
                    self.wait_one(index, timeout)
                });
            done.push((index, result));
        }
        done
    }

    /// Wait until server `index` (just started again) listens.
    fn wait_one(&mut self, index: usize, timeout: Duration) -> Result<(), ProcessError> {
        let deadline = Instant::now() + timeout;
        let Some((_, rx)) = &self.listening else {
            return Err(self.not_listening(index, "it was never started".into()));
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, Ok(_))) if i == index => return Ok(()),
                Ok((i, Err(why))) if i == index => return Err(self.not_listening(index, why)),
                Ok(_) => {}
                Err(_) => {
                    let why = format!("it did not listen within {:.0} s", timeout.as_secs_f64());
                    return Err(self.not_listening(index, why));
                }
            }
        }
    }

    /// Server `index` does not listen, for `why`.
    fn not_listening(&self, index: usize, why: String) -> ProcessError {
        let server = &self.started[index];
        ProcessError::NotListening {
            kind: server.kind,
            index,
            why,
            log: server.log.clone(),
            tail: tail(&server.log),
        }
    }

    /// Wait until every server listens; `(kind, url)` of each, in order.
    pub fn wait_listening(
        &mut self,
        timeout: Duration,
    ) -> Result<Vec<(&'static str, String)>, ProcessError> {
        let deadline = Instant::now() + timeout;
        let mut urls: Vec<Option<String>> = vec![None; self.started.len()];
        let Some((_, rx)) = &self.listening else {
            return Ok(Vec::new());
        };
        while urls.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            let waiting = urls
                .iter()
                .position(Option::is_none)
                .expect("one is waiting");
            let (index, line) = match rx.recv_timeout(left) {
                Ok(got) => got,
                Err(_) => (
                    waiting,
                    Err(format!(
                        "it did not listen within {:.0} s",
                        timeout.as_secs_f64()
                    )),
                ),
            };
            match line {
                Ok(addr) => {
                    let url = format!("http://{addr}");
                    self.started[index].addr = Some(url.clone());
                    urls[index] = Some(url);
                }
                Err(why) => return Err(self.not_listening(index, why)),
            }
        }
        Ok(self
            .started
            .iter()
            .zip(urls)
            .map(|(s, url)| (s.kind, url.expect("every server listens")))
            .collect())
    }

    /// Stop every server: close its input, give it a few seconds, then kill it.
    pub fn stop(&mut self) {
        for server in &mut self.started {
            server.stdin.take();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for server in &mut self.started {
            loop {
                match server.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        tracing::warn!(target: "areal::launch", kind = server.kind, "a server did not stop; killing it");
                        let _ = server.child.kill();
                        let _ = server.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        self.started.clear();
    }
}

impl Drop for ServerProcesses {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last lines of a log, for an error.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
