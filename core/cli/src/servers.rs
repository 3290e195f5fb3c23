//! Servers started as child processes (`areal serve ...` on loopback), for `launch local`,
//! reward worker processes and the benches: each one's address once it listens, its log, and
//! a stop that leaves none behind.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

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
    /// How it was started, to start it again.
    exe: PathBuf,
    config: Vec<std::ffi::OsString>,
    /// Where it listens, once it does.
    addr: Option<String>,
}

/// A server's index and its address, or why it has none.
type Listening = (usize, Result<String, String>);

/// Servers started as child processes; dropped, they are stopped.
#[derive(Default)]
pub struct Servers {
    started: Vec<Server>,
    /// Each server's address once it listens, or why it does not.
    listening: Option<(mpsc::Sender<Listening>, mpsc::Receiver<Listening>)>,
    /// The shared token every server is started with (in its environment), if any.
    token: Option<String>,
}

impl Servers {
    /// Start every server from now on with `token` (in its environment): calls without it
    /// are refused.
    pub(crate) fn with_token(mut self, token: String) -> Self {
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
    ) -> anyhow::Result<()> {
        let same_kind = self.started.iter().filter(|s| s.kind == kind).count();
        let log = logs.join(format!("{kind}-{same_kind}.log"));
        let index = self.started.len();
        let server = self.spawn(index, exe, kind, config, log, "127.0.0.1:0")?;
        self.started.push(server);
        Ok(())
    }

    fn spawn(
        &mut self,
        index: usize,
        exe: &Path,
        kind: &'static str,
        config: &[std::ffi::OsString],
        log: PathBuf,
        listen: &str,
    ) -> anyhow::Result<Server> {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut command = Command::new(exe);
        command
            .args([
                "-v",
                "serve",
                kind,
                "--listen",
                listen,
                "--until-stdin-closes",
            ])
            .args(config)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file.try_clone().context("cannot share the log file")?);
        if let Some(token) = &self.token {
            command.env(areal_serve::TOKEN_ENV, token);
        }
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
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
            .context("cannot start a thread")?;
        Ok(Server {
            kind,
            log,
            child,
            stdin,
            exe: exe.to_owned(),
            config: config.to_vec(),
            addr: None,
        })
    }

    /// Start again, at the address it had, every server that has exited; each one's index
    /// and how that went.
    pub(crate) fn restart_exited(&mut self, timeout: Duration) -> Vec<(usize, anyhow::Result<()>)> {
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
            let (exe, kind, config, log) = (
                server.exe.clone(),
                server.kind,
                server.config.clone(),
                server.log.clone(),
            );
            let listen = addr.trim_start_matches("http://").to_owned();
            let result = self
                .spawn(index, &exe, kind, &config, log, &listen)
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
    fn wait_one(&mut self, index: usize, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let Some((_, rx)) = &self.listening else {
            bail!("no server was started");
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, Ok(_))) if i == index => return Ok(()),
                Ok((i, Err(why))) if i == index => {
                    let server = &self.started[index];
                    bail!(
                        "it failed to start: {why}; its log {}:\n{}",
                        server.log.display(),
                        tail(&server.log)
                    )
                }
                Ok(_) => {}
                Err(_) => bail!("it did not listen within {:.0} s", timeout.as_secs_f64()),
            }
        }
    }

    /// Wait until every server listens; `(kind, url)` of each, in order.
    pub fn wait_listening(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<Vec<(&'static str, String)>> {
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
                Err(why) => {
                    let server = &self.started[index];
                    bail!(
                        "the {} server {} failed to start: {why}; its log {}:\n{}",
                        server.kind,
                        index,
                        server.log.display(),
                        tail(&server.log)
                    );
                }
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

impl Drop for Servers {
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
