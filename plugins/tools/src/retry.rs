//! The `retry` episode (AReaL's multi-turn workflow): answer; while the answer is wrong and
//! turns are left, hear that it is wrong and answer again. A right answer at turn `t` is worth
//! its reward × `turn_discount`^(t − 1), so that a policy is paid more for being right sooner.

use std::sync::Arc;

use areal_sdk::{
    BuildContext, Episode, EpisodeContext, PluginConfig, PluginError, Reward, Verdict,
};
use serde::Deserialize;

/// The registered name.
pub const RETRY: &str = "retry";

/// Options of the `retry` episode (`[episode] kind = "retry"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryOptions {
    /// Answers at most. By default 3.
    pub max_turns: usize,
    /// The factor a right answer's reward takes for each answer before it. By default 0.9.
    pub turn_discount: f64,
    /// The environment's text after a wrong answer, opening the next. By default Qwen's and
    /// Hermes' chat markup: the answer ended with `<|im_end|>`; a `user` turn says it was wrong.
    pub feedback: String,
}

impl Default for RetryOptions {
    fn default() -> Self {
        Self {
            max_turns: 3,
            turn_discount: 0.9,
            feedback: "\n<|im_start|>user\nYour answer is wrong. Think again and give another \
                       answer.<|im_end|>\n<|im_start|>assistant\n"
                .into(),
        }
    }
}

/// The episode (see the module's documentation).
#[derive(Clone, Debug)]
pub struct Retry {
    options: RetryOptions,
}

impl Retry {
    /// The episode with `options`.
    pub fn new(options: RetryOptions) -> Self {
        Self { options }
    }
}

#[areal_sdk::async_trait]
impl Episode for Retry {
    fn name(&self) -> &str {
        RETRY
    }

    async fn run(&self, ctx: &mut dyn EpisodeContext) -> Result<Reward, PluginError> {
        let mut scale = 1.0;
        for turn in 1..=self.options.max_turns {
            let answer = ctx.generate().await?;
            let mut reward = ctx.verify(&answer.text).await?;
            let last = turn == self.options.max_turns || ctx.tokens_left() == 0;
            if reward.verdict == Verdict::Accepted || last {
                reward.value *= scale;
                reward
                    .provenance
                    .details
                    .insert("turns".into(), serde_json::Value::from(turn));
                return Ok(reward);
            }
            ctx.append(&self.options.feedback)?;
            scale *= self.options.turn_discount;
        }
        unreachable!("max_turns is at least 1: the last turn returns")
    }
}

pub(crate) fn build(
    config: &PluginConfig,
    _: &BuildContext,
) -> Result<Arc<dyn Episode>, PluginError> {
    let options: RetryOptions = config.parse()?;
    if options.max_turns == 0 {
        return Err(config.invalid("max_turns", "must be at least 1, found 0"));
    }
    if !(options.turn_discount > 0.0 && options.turn_discount <= 1.0) {
        return Err(config.invalid(
            "turn_discount",
            format!("must be in (0, 1], found {}", options.turn_discount),
        ));
    }
    Ok(Arc::new(Retry::new(options)))
}
