//! Advantages: rewards (with the overlong punishment and shaping), an optional per-token KL
//! penalty, returns-to-go or GAE, baselines, scales and whitening.

use areal_sdk::TrajectoryGroup;
use areal_sdk_train::advantages::{at_sampled, centre, only_sampled, sampled_masks, whiten};
use areal_sdk_train::{AdvantageInput, Advantages};

use crate::options::{KlPlacement, Options};

/// DAPO's soft overlong punishment of a completion of `len` tokens: 0 up to
/// `max − buffer`, then falling linearly to −1 at `max`, and −1 beyond.
pub fn overlong_punishment(len: usize, max: usize, buffer: usize) -> f64 {
    let free = max.saturating_sub(buffer);
    if buffer == 0 || len <= free {
        0.0
    } else if len <= max {
        (free as f64 - len as f64) / buffer as f64
    } else {
        -1.0
    }
}

/// The sequence-level reward of every sample, in flat order, after the overlong punishment
/// and shaping.
pub(crate) fn shaped_rewards(groups: &[TrajectoryGroup], o: &Options) -> Vec<f64> {
    groups
        .iter()
        .flat_map(|g| &g.samples)
        .map(|s| {
            let mut r = s.reward.total();
            if o.overlong_buffer > 0
                && let Some(max) = o.overlong_max_tokens
            {
                r += o.overlong_penalty
                    * overlong_punishment(s.completion.sampled_len(), max, o.overlong_buffer);
            }
            o.reward.apply(r)
        })
        .collect()
}

/// Advantages (and, with values, GAE returns) of every token of each completion. Computed
/// over the tokens a policy sampled, as if an episode's environment tokens were not there
/// (the reward on the policy's last token, GAE from one policy token to the next, whitening
/// over the policy's tokens); the environment's tokens get 0.
pub(crate) fn compute(input: &AdvantageInput<'_>, o: &Options) -> Advantages {
    let masks = sampled_masks(input.groups);
    let old = only_sampled(input.old_logprobs, &masks);
    let reference = input.reference.map(|r| only_sampled(r, &masks));
    let values = input.values.map(|v| only_sampled(v, &masks));
    let mut sampled = AdvantageInput::new(input.groups, &old);
    if let Some(r) = &reference {
        sampled = sampled.with_reference(r);
    }
    if let Some(v) = &values {
        sampled = sampled.with_values(v);
    }
    let Advantages {
        advantages,
        returns,
    } = over_sampled(&sampled, o);
    Advantages {
        advantages: at_sampled(advantages, &masks, 0.0),
        returns: returns.map(|r| at_sampled(r, &masks, 0.0)),
    }
}

/// [`compute`] on per-token vectors that hold the sampled tokens only.
fn over_sampled(input: &AdvantageInput<'_>, o: &Options) -> Advantages {
    let groups = input.groups;
    let shaped = shaped_rewards(groups, o);
    let lengths: Vec<usize> = groups
        .iter()
        .flat_map(|g| &g.samples)
        .map(|s| s.completion.sampled_len())
        .collect();

    // Per-token rewards: each turn's reward on its turn's last token, the rest of the shaped
    // return on the last token, the KL penalty on every token.
    let mut rewards: Vec<Vec<f64>> = lengths.iter().map(|&n| vec![0.0; n]).collect();
    let samples = groups.iter().flat_map(|g| &g.samples);
    for (i, (r, sample)) in rewards.iter_mut().zip(samples).enumerate() {
        let mut rest = shaped[i];
        for turn in &sample.reward.turns {
            let c = &sample.completion;
            let sampled_before = (0..turn.end.min(c.len()))
                .filter(|&t| c.is_sampled(t))
                .count();
            if let Some(at) = sampled_before.checked_sub(1) {
                r[at] += turn.value;
                rest -= turn.value;
            }
        }
        if let Some(last) = r.last_mut() {
            *last += rest;
        }
    }
    if o.kl_coef > 0.0
        && o.kl_placement == KlPlacement::Reward
        && let Some(reference) = input.reference
    {
        for ((r, old), refr) in rewards.iter_mut().zip(input.old_logprobs).zip(reference) {
            for ((x, &lo), &lr) in r.iter_mut().zip(old).zip(refr) {
                *x -= o.kl_coef * o.kl_estimator.of(f64::from(lo) - f64::from(lr));
            }
        }
    }

    let (mut advantages, returns) = match input.values {
        Some(values) => {
            // GAE: δ_t = r_t + γ·V_{t+1} − V_t (V after the last token is 0).
            let mut adv = Vec::with_capacity(rewards.len());
            let mut ret = Vec::with_capacity(rewards.len());
            for (r, v) in rewards.iter().zip(values) {
                let n = r.len();
                let mut a = vec![0.0f64; n];
                let mut running = 0.0;
                for t in (0..n).rev() {
                    let next = if t + 1 < n { f64::from(v[t + 1]) } else { 0.0 };
                    let delta = r[t] + o.gamma * next - f64::from(v[t]);
                    running = delta + o.gamma * o.lambda * running;
                    a[t] = running;
                }
                ret.push(
                    a.iter()
                        .zip(v)
                        .map(|(a, &v)| (a + f64::from(v)) as f32)
                        .collect::<Vec<f32>>(),
                );
                adv.push(a);
            }
            (adv, Some(ret))
        }
        None => {
            // Returns-to-go (γ = 1); the baseline and scale come from each sequence's return.
            let to_go: Vec<Vec<f64>> = rewards
                .iter()
                .map(|r| {
                    let mut g = r.clone();
                    for t in (0..g.len().saturating_sub(1)).rev() {
                        g[t] += g[t + 1];
                    }
                    g
                })
                .collect();
            let totals: Vec<f64> = to_go
                .iter()
                .zip(&shaped)
                .map(|(g, &r)| g.first().copied().unwrap_or(r))
                .collect();
            let sizes: Vec<usize> = groups.iter().map(|g| g.samples.len()).collect();
            let centred = centre(&totals, &sizes, o.baseline, o.scale);
            let adv = to_go
                .into_iter()
                .zip(centred)
                .map(|(g, (b, s))| g.into_iter().map(|x| (x - b) / s).collect())
                .collect();
            (adv, None)
        }
    };
    if o.token_whitening {
        whiten(&mut advantages);
    }
    Advantages {
        advantages: advantages
            .into_iter()
            .map(|a| a.into_iter().map(|x| x as f32).collect())
            .collect(),
        returns,
    }
}
