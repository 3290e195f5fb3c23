//! What a run shows while it trains: a bar on a terminal, a line every few steps otherwise.

use std::io::IsTerminal;

use areal_core::{EvalMetrics, Observer, StepMetrics};
use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar on a terminal; a line every few steps otherwise (logs, CI). The bar counts
/// warm-up steps (up to `warmup.max_steps`; it may stop earlier at its plateau), then RL steps.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    every: u64,
    steps: u64,
}

impl Progress {
    pub(crate) fn new(steps: u64, warmup_steps: Option<u64>) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(warmup_steps.unwrap_or(steps));
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>7} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
                )
                .expect("valid template"),
            );
            bar.set_prefix(if warmup_steps.is_some() {
                "warm-up"
            } else {
                "RL"
            });
            bar.enable_steady_tick(std::time::Duration::from_millis(500));
            bar
        });
        Self {
            bar,
            every: (steps / 20).max(1),
            steps,
        }
    }

    /// Switch the bar from warm-up to RL steps (idempotent).
    fn rl_phase(&self) {
        if let Some(bar) = &self.bar
            && bar.prefix() != "RL"
        {
            bar.set_prefix("RL");
            bar.set_length(self.steps);
            bar.set_position(0);
            bar.set_message("");
        }
    }

    #[allow(clippy::print_stderr, reason = "messages for the user, on stderr")]
    fn line(&self, text: String) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}

impl Observer for Progress {
    fn on_step(&self, m: &StepMetrics) {
        // What a step costs on each side: generation, verification, training.
        let msg = format!(
            "v{} reward {:.3} lag≤{} gen {:.0} tok/s, reward p50 {:.0} ms, train {:.0} ms",
            m.policy_version,
            m.reward_mean,
            m.staleness.token_lag_max,
            m.gen_tokens_per_s,
            m.reward_latency_p50_ms,
            m.train_ms
        );
        self.rl_phase();
        match &self.bar {
            Some(bar) => {
                bar.set_position(m.step);
                bar.set_message(msg);
            }
            None if m.step.is_multiple_of(self.every) => {
                self.line(format!("step {} {msg}", m.step))
            }
            None => {}
        }
    }

    fn on_warmup(&self, m: &areal_core::WarmupMetrics) {
        if let Some(bar) = &self.bar {
            bar.set_position(m.step);
            bar.set_message(format!("validation accuracy {:.3}", m.validation_accuracy));
        }
        self.line(format!(
            "warm-up step {}: loss {:.3}, validation loss {:.3}, accuracy {:.3} ({:.0} s, {:.0} tokens/s)",
            m.step, m.loss, m.validation_loss, m.validation_accuracy, m.seconds, m.tokens_per_s
        ));
    }

    fn on_eval(&self, m: &EvalMetrics) {
        self.rl_phase();
        self.line(format!(
            "eval after step {} (v{}): accuracy {:.3}, reward {:.3} on {} held-out items",
            m.step, m.policy_version, m.accuracy, m.reward_mean, m.items
        ));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
