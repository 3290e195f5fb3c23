//! A deadline that stops a verification on whatever thread it runs.
//!
//! Verification is pure Rust with no blocking calls, so stopping it needs no signal and no
//! second thread: every loop and every recursion of the parser, the simplifier and the
//! comparison asks the deadline, and past it the whole call unwinds with [`Timeout`].

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The verification ran past its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("verification ran past its deadline")]
pub struct Timeout;

/// How deep expressions may nest before they are refused (a guard for the stack: each level
/// costs a few recursive calls).
pub(crate) const MAX_DEPTH: usize = 200;

/// When a verification must stop. Cheap to ask: the clock is read on one ask in 64.
#[derive(Debug)]
pub struct Deadline {
    at: Option<Instant>,
    asks: Cell<u32>,
    expired: Cell<bool>,
}

impl Deadline {
    /// A deadline `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        Self::at(Instant::now() + timeout)
    }

    /// A deadline at `at`.
    pub fn at(at: Instant) -> Self {
        Self {
            at: Some(at),
            asks: Cell::new(0),
            expired: Cell::new(false),
        }
    }

    /// No deadline (tests and benchmarks of pure speed).
    pub fn none() -> Self {
        Self {
            at: None,
            asks: Cell::new(0),
            expired: Cell::new(false),
        }
    }

    /// `Err(Timeout)` once the deadline has passed.
    pub fn check(&self) -> Result<(), Timeout> {
        if self.expired.get() {
            return Err(Timeout);
        }
        let Some(at) = self.at else { return Ok(()) };
        let asks = self.asks.get().wrapping_add(1);
        self.asks.set(asks);
        if asks.is_multiple_of(64) && Instant::now() >= at {
            self.expired.set(true);
            return Err(Timeout);
        }
        Ok(())
    }
}
