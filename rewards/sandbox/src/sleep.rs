//! Sleeping guests: WASI preview 1 with a `poll_oneoff` of our own, which sleeps on tokio
//! (so the wall-time limit stops a sleeping guest) and charges every sleep to the run's limits.

use std::time::{Duration, Instant};

use wasmtime::{Engine, Linker, Trap};

use crate::run::Mode;
use crate::store::Guest;

/// WASI preview 1, with a `poll_oneoff` of our own.
///
/// File access runs on the calling thread (`allow_blocking_current_thread`: start-up makes
/// hundreds of small reads, 5× faster than a hop to tokio's blocking pool each). With that
/// setting wasmtime-wasi answers a poll on a single relative timer — `select()` with a
/// timeout, `nanosleep` — with `std::thread::sleep`, which no timeout can interrupt. Our
/// `poll_oneoff` sleeps on tokio instead, so the wall-time limit stops a sleeping guest. It
/// serves what sleeping needs — one clock subscription, relative or absolute, on the guest's
/// own clocks — and answers every other poll (waiting on file descriptors) with `ENOTSUP`:
/// graded programs read stdin and write stdout, they do not multiplex.
pub(crate) fn guest_linker(engine: &Engine) -> wasmtime::Result<Linker<Guest>> {
    const ENOTSUP: i32 = 58;
    let mut linker: Linker<Guest> = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, |g: &mut Guest| &mut g.wasi)?;
    linker.allow_shadowing(true);
    linker.func_wrap_async(
        "wasi_snapshot_preview1",
        "poll_oneoff",
        |mut caller: wasmtime::Caller<'_, Guest>,
         (subs, events, nsubs, nevents): (i32, i32, i32, i32)| {
            Box::new(async move {
                let Some(timer) = single_timer(&mut caller, subs, nsubs)? else {
                    return Ok(ENOTSUP);
                };
                charge_sleep(&mut caller, timer.sleep).await?;
                // event: userdata u64, error u16 = 0, type u8 = clock (0), then zeros.
                let mut event = [0u8; 32];
                event[..8].copy_from_slice(&timer.userdata);
                let memory = guest_memory(&mut caller)?;
                memory.write(&mut caller, events as u32 as usize, &event)?;
                memory.write(&mut caller, nevents as u32 as usize, &1u32.to_le_bytes())?;
                Ok(0i32)
            })
        },
    )?;
    Ok(linker)
}

/// Fuel a sleep costs in deterministic mode, per second asked for: about what the interpreter
/// burns in a second of CPU time here (a test's default budget of 4 × 10¹⁰ is its 24 s).
pub(crate) const SLEEP_FUEL_PER_S: u64 = 1_000_000_000;
/// The least a sleep costs in deterministic mode, in fuel (a millisecond's worth): a loop of
/// `time.sleep(0)` runs out of fuel as a busy loop does.
pub(crate) const MIN_SLEEP_FUEL: u64 = SLEEP_FUEL_PER_S / 1000;

/// The fuel a sleep of `d` costs in deterministic mode.
pub(crate) fn sleep_fuel(d: Duration) -> u64 {
    let asked = d.as_nanos().saturating_mul(u128::from(SLEEP_FUEL_PER_S)) / 1_000_000_000;
    u64::try_from(asked).unwrap_or(u64::MAX).max(MIN_SLEEP_FUEL)
}

/// A guest's sleep, spent from its limits. Fast mode: it sleeps (on tokio, so the wall-time
/// limit can stop it) and is charged the time it took, at least what it asked for (every
/// sleep lasts a while, a zero one too: charged only what it asked, a loop of them would
/// run on past its limit); one past what is left sleeps out the rest and ends the run
/// (`time_limit`). Deterministic mode: the guest's clocks never move, so it does not sleep at
/// all; it is charged fuel for what it asked ([`sleep_fuel`]), so the same program spends
/// the same fuel and gets the same verdict every time. Either way the time counts against a
/// time limit the run has (the pre-initialisation's).
async fn charge_sleep(
    caller: &mut wasmtime::Caller<'_, Guest>,
    asked: Duration,
) -> wasmtime::Result<()> {
    let left = caller.data().watch.left();
    let charged = if caller.data().mode == Mode::Deterministic {
        let cost = sleep_fuel(asked);
        let fuel = caller.get_fuel()?;
        if cost > fuel {
            caller.set_fuel(0)?;
            return Err(Trap::OutOfFuel.into());
        }
        caller.set_fuel(fuel - cost)?;
        asked
    } else {
        let sleep = left.map_or(asked, |left| asked.min(left));
        let started = Instant::now();
        tokio::time::sleep(sleep).await;
        started.elapsed().max(sleep)
    };
    caller.data().watch.slept(charged);
    if left.is_some_and(|left| charged >= left) {
        return Err(Trap::Interrupt.into());
    }
    Ok(())
}

struct Timer {
    userdata: [u8; 8],
    sleep: Duration,
}

/// A poll on exactly one clock subscription (WASI p1 layout: 48-byte subscription, tag at 8,
/// clock id at 16, timeout at 24, flags at 40; flag 1 = absolute time).
fn single_timer(
    caller: &mut wasmtime::Caller<'_, Guest>,
    subs: i32,
    nsubs: i32,
) -> wasmtime::Result<Option<Timer>> {
    if nsubs != 1 {
        return Ok(None);
    }
    let memory = guest_memory(caller)?;
    let mut sub = [0u8; 48];
    memory.read(&*caller, subs as u32 as usize, &mut sub)?;
    if sub[8] != 0 {
        return Ok(None);
    }
    let clock_id = u32::from_le_bytes(sub[16..20].try_into().expect("4 bytes"));
    let timeout = u64::from_le_bytes(sub[24..32].try_into().expect("8 bytes"));
    let absolute = u16::from_le_bytes([sub[40], sub[41]]) & 1 != 0;
    let sleep = if absolute {
        let clock = caller.data().clock;
        let now = match clock_id {
            0 => u64::try_from(clock.wall().as_nanos()).unwrap_or(u64::MAX),
            _ => clock.monotonic_ns(),
        };
        timeout.saturating_sub(now)
    } else {
        timeout
    };
    Ok(Some(Timer {
        userdata: sub[..8].try_into().expect("8 bytes"),
        sleep: Duration::from_nanos(sleep),
    }))
}

fn guest_memory(caller: &mut wasmtime::Caller<'_, Guest>) -> wasmtime::Result<wasmtime::Memory> {
    caller
        .get_export("memory")
        .and_then(|e| e.into_memory())
        .ok_or_else(|| wasmtime::Error::msg("the guest exports no memory"))
}
