//! Captured stdout and stderr, with a byte cap.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// What the guest wrote, up to `cap` bytes. Past the cap a strict capture (stdout) traps the
/// guest at once — that is an output-limit outcome — and a lenient one (stderr) drops the
/// rest and lets the guest go on.
#[derive(Clone)]
pub(crate) struct Capture {
    state: Arc<Mutex<State>>,
    cap: usize,
    strict: bool,
}

#[derive(Default)]
struct State {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl Capture {
    pub(crate) fn new(cap: usize, strict: bool) -> Self {
        Self {
            state: Arc::default(),
            cap,
            strict,
        }
    }

    /// Append; `false` when a strict capture overflowed.
    fn push(&self, data: &[u8]) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let room = self.cap - s.bytes.len();
        if data.len() > room {
            s.bytes.extend_from_slice(&data[..room]);
            s.overflowed = true;
            return !self.strict;
        }
        s.bytes.extend_from_slice(data);
        true
    }

    /// Whether nothing was written yet.
    pub(crate) fn is_empty(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .bytes
            .is_empty()
    }

    /// The captured bytes, and whether more was written than the cap.
    pub(crate) fn take(&self) -> (Vec<u8>, bool) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut s.bytes), s.overflowed)
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

#[async_trait::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if self.push(&bytes) {
            Ok(())
        } else {
            Err(StreamError::trap("output limit"))
        }
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(1 << 20)
    }
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(if self.push(buf) {
            Ok(buf.len())
        } else {
            Err(io::Error::other("output limit"))
        })
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
