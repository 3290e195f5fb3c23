//! The guest's clocks and random source: real ones in fast mode; in deterministic mode a
//! clock that never moves and a seeded source, so that the same input gives the same run.

use std::time::{Duration, Instant};

use crate::run::Mode;

/// The guest's clocks. Fast mode: real time, monotonic from the run's start. Deterministic
/// mode: a clock that never moves (2024-01-01T00:00:00Z, monotonic 0).
#[derive(Clone, Copy)]
pub(crate) struct GuestClock {
    start: Option<Instant>,
}

impl GuestClock {
    pub(crate) fn new(mode: Mode) -> Self {
        Self {
            start: (mode == Mode::Fast).then(Instant::now),
        }
    }

    pub(crate) fn monotonic_ns(&self) -> u64 {
        self.start.map_or(0, |t| {
            u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
        })
    }

    pub(crate) fn wall(&self) -> Duration {
        match self.start {
            Some(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
            None => Duration::from_secs(1_704_067_200),
        }
    }
}

impl wasmtime_wasi::HostWallClock for GuestClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        self.wall()
    }
}

impl wasmtime_wasi::HostMonotonicClock for GuestClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        self.monotonic_ns()
    }
}

/// splitmix64: a seeded random source for deterministic mode.
pub(crate) struct SeededRandom(u64);

impl SeededRandom {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }
}

impl rand::TryRng for SeededRandom {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Ok(z ^ (z >> 31))
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dest.chunks_mut(8) {
            let v = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}
