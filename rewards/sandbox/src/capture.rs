//! Captured stdout and stderr, with a byte cap, and a stdin that can be fed again (a
//! session's next call).

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

    /// The captured bytes, and whether more was written than the cap; the capture starts
    /// again empty.
    pub(crate) fn take(&self) -> (Vec<u8>, bool) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (
            std::mem::take(&mut s.bytes),
            std::mem::take(&mut s.overflowed),
        )
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

/// The guest's stdin, fed by the host: what [`feed`](Feed::feed) put there, then end of file
/// until it is fed again (a session's guest reads each call's input to its end).
#[derive(Clone, Default)]
pub(crate) struct Feed(Arc<Mutex<Bytes>>);

impl Feed {
    /// A stdin that holds `bytes`.
    pub(crate) fn new(bytes: Vec<u8>) -> Self {
        let feed = Self::default();
        feed.feed(bytes);
        feed
    }

    /// Replace what is left to read with `bytes`.
    pub(crate) fn feed(&self, bytes: Vec<u8>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Bytes::from(bytes);
    }

    fn read(&self, size: usize) -> Bytes {
        let mut buffer = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let size = size.min(buffer.len());
        buffer.split_to(size)
    }
}

impl IsTerminal for Feed {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdinStream for Feed {
    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::InputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncRead + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for Feed {
    async fn ready(&mut self) {}
}

impl wasmtime_wasi::p2::InputStream for Feed {
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        let read = Feed::read(self, size);
        if read.is_empty() && size > 0 {
            return Err(StreamError::Closed);
        }
        Ok(read)
    }
}

impl tokio::io::AsyncRead for Feed {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let read = Feed::read(&self, buf.remaining());
        buf.put_slice(&read);
        Poll::Ready(Ok(()))
    }
}
