//! The probe of each server: one that takes work is checked (its statistics recorded) or
//! taken out; one that does not is asked what it holds, caught up and put to work. The
//! servers' own statistics are summed across their restarts.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use areal_sdk::GeneratorStats;

use super::api::{CallError, Joining};
use super::{Servers, bounded};

/// A server's own statistics, across its restarts.
#[derive(Default)]
pub(super) struct Reported {
    /// Sums of the server's earlier lives.
    before: GeneratorStats,
    last: GeneratorStats,
}

/// Watch server `index` every `interval`: one that takes work is checked (its statistics
/// recorded) or taken out; one that does not is asked what it holds, caught up and put to
/// work.
pub(super) async fn watch(servers: Arc<Servers>, index: usize, interval: Duration) {
    loop {
        let probe = servers.timeouts.probe;
        if servers.fleet.is_ready(index) {
            let paused = servers.gate.is_closed();
            match bounded(probe, servers.api.alive(index, paused)).await {
                Ok(Some(stats)) => servers.record(index, stats),
                Ok(None) => {}
                Err(e) => servers.fail(index, e),
            }
        } else {
            match bounded(probe, servers.api.joining(index)).await {
                Ok(joining) => catch_up(&servers, index, joining).await,
                Err(e) => servers.fail(index, e),
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// Bring server `index`, which said `joining`, to the current weights and put it to work: its
/// tokenizer checked, the current version loaded if it holds another, and resumed if a client
/// that is gone left it paused.
async fn catch_up(servers: &Servers, index: usize, joining: Joining) {
    let fleet = &servers.fleet;
    let _one_at_a_time = servers.sync.lock().await;
    if fleet.is_ready(index) {
        return;
    }
    let result = async {
        servers.check_server_tokenizer(index).await?;
        let held = match servers.current() {
            Some(current) if joining.version != Some(current.version) => {
                fleet.set_busy(index, format!("catching up to version {}", current.version));
                servers.load(index, &current).await?;
                Some(current.version)
            }
            _ => joining.version,
        };
        servers.set_held(index, held);
        if joining.paused != Some(false) && !servers.gate.is_closed() {
            // paused by a client that lost it: new work would wait there for ever
            match bounded(servers.timeouts.probe, servers.api.resume(index)).await {
                Ok(()) | Err(CallError::Unsupported(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok::<_, CallError>(held)
    }
    .await;
    match result {
        Ok(held) => {
            fleet.set_ready(index, held);
            servers.remove_unheld();
        }
        Err(e) => servers.fail(index, e),
    }
}

impl Servers {
    fn record(&self, index: usize, stats: GeneratorStats) {
        let mut sum = self.reported[index].lock().expect("stats lock");
        // counters that went back: the server restarted; keep what its earlier life did
        if stats.tokens < sum.last.tokens || stats.weight_loads < sum.last.weight_loads {
            sum.before = add(sum.before, &sum.last);
        }
        sum.last = stats;
    }

    /// The servers' own accounts of their time (where their API reports them), with the
    /// tokens and loads this side counted.
    pub(super) fn stats(&self) -> GeneratorStats {
        let n = self.count().max(1) as f64;
        let reported = self
            .reported
            .iter()
            .fold(GeneratorStats::default(), |acc, s| {
                let s = s.lock().expect("stats lock");
                add(add(acc, &s.before), &s.last)
            });
        let mut stats = GeneratorStats::default().with_resumes(
            self.weight_loads.load(Ordering::Relaxed),
            reported.resumes,
            reported.resume_seconds,
        );
        stats.tokens = self.tokens.load(Ordering::Relaxed);
        // the fraction of time the servers computed, on average
        stats.busy_seconds = reported.busy_seconds.map(|b| b / n);
        stats.with_faults(self.fleet.faults())
    }
}

fn add(a: GeneratorStats, b: &GeneratorStats) -> GeneratorStats {
    let busy = match (a.busy_seconds, b.busy_seconds) {
        (None, None) => None,
        (x, y) => Some(x.unwrap_or(0.0) + y.unwrap_or(0.0)),
    };
    let mut sum = GeneratorStats::default().with_resumes(
        a.weight_loads + b.weight_loads,
        a.resumes + b.resumes,
        a.resume_seconds + b.resume_seconds,
    );
    sum.busy_seconds = busy;
    sum.tokens = a.tokens + b.tokens;
    sum
}
