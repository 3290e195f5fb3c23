//! The trainer step: micro-batching is exact gradient accumulation, mini-batches step the
//! optimizer several times within one version, the proximal modes differ only where they
//! should, the reference policy stays frozen, a critic learns its values, and an episode's
//! environment tokens are read but never trained on.

use areal_core::trainer::{StepReport, TrainerSettings, train_step};
use areal_sdk::{
    BuildContext, Completion, FinishReason, PluginConfig, Reward, Trajectory, TrajectoryGroup,
    Verdict,
};
use areal_sdk_train::burn::optim::AdamWConfig;
use areal_sdk_train::burn::tensor::Device;
use areal_sdk_train::{AlgorithmPlugin, PackedBatch, Policy};
use areal_testkit::{BigramPolicy, BigramPolicyOptions};

fn policy() -> BigramPolicy {
    BigramPolicy::new(
        &BigramPolicyOptions {
            letters: 8,
            init_std: 0.5,
        },
        3,
        &Device::flex().autodiff(),
    )
}

/// Groups of samples with behaviour logprobs from `policy` (so they are on-policy at
/// `version` when `versions` says so), mixed lengths and rewards.
fn groups(
    policy: &dyn Policy,
    token_version: impl Fn(usize, usize) -> u64,
) -> Vec<TrajectoryGroup> {
    let mut out = Vec::new();
    for g in 0..3u64 {
        let prompt = vec![g as u32];
        let mut samples = Vec::new();
        for j in 0..4usize {
            let len = 2 + (g as usize * 3 + j * 5) % 9;
            let tokens: Vec<u32> = (0..len)
                .map(|t| ((g as usize + j * t + t * t) % 9) as u32)
                .collect();
            let mut seq = prompt.clone();
            seq.extend(&tokens);
            let mut batch = PackedBatch::new(1.0);
            batch.push(&seq);
            let lp: Vec<f32> = policy
                .logprobs_no_grad(&batch)
                .unwrap()
                .into_data()
                .try_to_vec()
                .unwrap();
            samples.push(Trajectory {
                sample_id: g * 4 + j as u64,
                completion: Completion {
                    token_ids: tokens,
                    behaviour_logprobs: lp[1..].to_vec(),
                    versions: (0..len).map(|t| token_version(j, t)).collect(),
                    finish_reason: FinishReason::Length,
                },
                reward: Reward::new(((g as usize + j) % 3) as f64 / 2.0, Verdict::Partial),
            });
        }
        out.push(TrajectoryGroup {
            group_id: g,
            item_id: g.to_string(),
            prompt_ids: prompt,
            admitted_at: 0,
            samples,
        });
    }
    out
}

fn settings(token_budget: usize, minibatches: usize) -> TrainerSettings {
    TrainerSettings {
        lr: 0.05,
        max_grad_norm: Some(1.0),
        minibatches,
        token_budget,
        min_microbatches: 1,
        temperature: 1.0,
        withhold_past_lag: None,
    }
}

fn step(
    algorithm: &str,
    options: &[(&str, &str)],
    settings: &TrainerSettings,
    version: u64,
    on_policy: bool,
) -> (Vec<f32>, StepReport) {
    let mut policy = policy();
    let data = groups(&policy, |j, t| {
        if on_policy {
            version
        } else {
            version - ((j + t) % 3) as u64
        }
    });
    let mut cfg = PluginConfig::new("algorithm", algorithm);
    for (k, v) in options {
        cfg = cfg.with(k, *v);
    }
    let algorithm = AlgorithmPlugin::build_from(&cfg, &BuildContext::new(0, 1)).unwrap();
    let mut optimizer = AdamWConfig::new().init();
    let report = train_step(
        &mut policy,
        None,
        &mut optimizer,
        algorithm.as_ref(),
        &data,
        version,
        settings,
    )
    .unwrap();
    (policy.weights()[0].data.clone(), report)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn micro_batching_is_exact_gradient_accumulation() {
    let (whole, r1) = step("decoupled-ppo", &[], &settings(10_000, 1), 2, false);
    let (split, r2) = step("decoupled-ppo", &[], &settings(12, 1), 2, false);
    assert_eq!(r1.microbatches, 1);
    assert!(r2.microbatches >= 5, "{r2:?}");
    assert_eq!(r1.trained_tokens, r2.trained_tokens);
    assert_eq!(r1.packed_tokens, r2.packed_tokens);
    assert!(
        (r1.loss - r2.loss).abs() < 1e-5,
        "{} vs {}",
        r1.loss,
        r2.loss
    );
    assert!((r1.grad_norm - r2.grad_norm).abs() < 1e-5);
    assert!(
        max_diff(&whole, &split) < 1e-5,
        "weights differ by {}",
        max_diff(&whole, &split)
    );
    let (_, oversized) = step("decoupled-ppo", &[], &settings(8, 1), 2, false);
    assert!(
        oversized.oversized > 0,
        "sequences of 9+ tokens exceed a budget of 8"
    );
}

#[test]
fn minibatches_step_the_optimizer_several_times() {
    let (one, _) = step("decoupled-ppo", &[], &settings(10_000, 1), 2, true);
    let (three, r) = step("decoupled-ppo", &[], &settings(10_000, 3), 2, true);
    assert!(max_diff(&one, &three) > 1e-3);
    // later mini-batches see a ratio away from 1 against the step's fixed proximal policy
    assert!((r.stats["ratio"] - 1.0).abs() > 1e-6, "{:?}", r.stats);
    assert!(r.on_policy_logprob_gap < 1e-6);
}

#[test]
fn proximal_modes_agree_on_policy_and_differ_when_stale() {
    let s = settings(10_000, 1);
    let (recompute, _) = step("decoupled-ppo", &[], &s, 2, true);
    let (loglinear, _) = step("decoupled-ppo", &[("proximal", "log-linear")], &s, 2, true);
    let (behaviour, _) = step("ppo", &[], &s, 2, true);
    assert!(max_diff(&recompute, &loglinear) < 1e-6);
    assert!(max_diff(&recompute, &behaviour) < 1e-6);

    // stale tokens: the behaviour logprobs were computed by the same weights, so recompute
    // and ppo agree, but the log-linear approximation pretends the old versions differed
    // and moves π_prox towards π_θ, which changes the importance weights.
    let (recompute, r) = step("decoupled-ppo", &[], &s, 2, false);
    let (behaviour, _) = step("ppo", &[], &s, 2, false);
    assert!(max_diff(&recompute, &behaviour) < 1e-6);
    assert!(r.on_policy_logprob_gap < 1e-6);
    let (_, r) = step("decoupled-ppo", &[("proximal", "log-linear")], &s, 2, false);
    assert!(r.stats.contains_key("behav_weight"));
}

/// Mismatch and staleness are measured without the proximal recompute too: from the first
/// mini-batch's forward pass, which runs with the weights the step starts from. With one
/// mini-batch that is every token, and the same numbers the recompute gives; with several,
/// the first mini-batch's tokens.
#[test]
fn off_policy_gaps_are_measured_without_the_recompute_from_the_first_minibatch() {
    let one = settings(10_000, 1);
    let (_, recompute) = step("decoupled-ppo", &[], &one, 2, false);
    let (_, coupled) = step("ppo", &[], &one, 2, false);
    let (_, loglinear) = step(
        "decoupled-ppo",
        &[("proximal", "log-linear")],
        &one,
        2,
        false,
    );
    let r = recompute.off_policy.expect("measured by the recompute");
    for report in [&coupled, &loglinear] {
        let o = report
            .off_policy
            .as_ref()
            .expect("measured by the first mini-batch");
        assert_eq!(o.mismatch.tokens, r.mismatch.tokens);
        assert!(o.mismatch.tokens > 0 && o.staleness.tokens > 0, "{o:?}");
        assert_eq!(o.staleness.tokens, r.staleness.tokens);
        let lags = |o: &areal_core::trainer::OffPolicyStats| -> Vec<(String, u64)> {
            o.staleness_by_lag
                .iter()
                .map(|(k, g)| (k.clone(), g.tokens))
                .collect()
        };
        assert_eq!(lags(o), lags(&r));
        for (a, b) in [(&o.mismatch, &r.mismatch), (&o.staleness, &r.staleness)] {
            assert!(
                (a.abs_mean - b.abs_mean).abs() < 1e-7,
                "{a:?} against {b:?}"
            );
            assert!((a.kl_k3 - b.kl_k3).abs() < 1e-9, "{a:?} against {b:?}");
        }
        // the behaviour logprobs came from the same weights: both gaps are rounding
        assert!(
            o.mismatch.abs_max < 1e-5 && o.staleness.abs_max < 1e-5,
            "{o:?}"
        );
        assert_eq!(
            report.trained_tokens as u64,
            o.mismatch.tokens + o.staleness.tokens
        );
    }
    let (_, several) = step("ppo", &[], &settings(10_000, 3), 2, false);
    let o = several
        .off_policy
        .expect("measured by the first mini-batch");
    let measured = o.mismatch.tokens + o.staleness.tokens;
    assert!(
        measured > 0 && measured < several.trained_tokens as u64,
        "{measured} of {} tokens",
        several.trained_tokens
    );
}

fn build(
    kind: &str,
    options: &[(&str, serde_json::Value)],
) -> std::sync::Arc<dyn areal_sdk_train::Algorithm> {
    let mut cfg = PluginConfig::new("algorithm", kind);
    for (k, v) in options {
        cfg = cfg.with(k, v.clone());
    }
    AlgorithmPlugin::build_from(&cfg, &BuildContext::new(0, 1)).unwrap()
}

/// GRPO's KL term: the reference is a frozen copy of the weights when RL starts, so the first
/// step measures KL = 0 against it and the next, after an update, does not; without a
/// reference the trainer refuses the algorithm.
#[test]
fn the_reference_policy_stays_frozen() {
    let mut policy = policy();
    let reference = policy.snapshot().unwrap();
    let data = groups(&policy, |_, _| 2);
    let grpo = build("grpo", &[("kl_coef", 0.5.into())]);
    let mut optimizer = AdamWConfig::new().init();
    let s = settings(10_000, 1);
    let mut run = |version: u64, reference: Option<&dyn Policy>| {
        train_step(
            &mut policy,
            reference,
            &mut optimizer,
            grpo.as_ref(),
            &data,
            version,
            &s,
        )
    };
    let first = run(2, Some(reference.as_ref())).unwrap();
    assert!(first.stats["kl_ref"].abs() < 1e-6, "{:?}", first.stats);
    let second = run(3, Some(reference.as_ref())).unwrap();
    assert!(second.stats["kl_ref"] > 1e-5, "{:?}", second.stats);
    let third = run(4, Some(reference.as_ref())).unwrap();
    assert!(
        third.stats["kl_ref"] > second.stats["kl_ref"],
        "{:?}",
        third.stats
    );
    let error = run(5, None).unwrap_err().to_string();
    assert!(error.contains("reference"), "{error}");
}

/// ppo-critic through the trainer on the transformer: values come from its value head (added
/// by `enable_values`), and the clipped value loss pulls them towards the GAE returns.
#[test]
fn a_critic_learns_its_values() {
    use areal_model::{TransformerOptions, TransformerPolicy};
    let options = TransformerOptions {
        hidden_size: 32,
        layers: 1,
        heads: 2,
        kv_heads: 1,
        max_positions: 32,
        ..TransformerOptions::default()
    };
    let mut policy =
        TransformerPolicy::fresh(&options, "abcdefgh", 5, &Device::flex().autodiff()).unwrap();
    let data = groups(&policy, |_, _| 0);
    let mut batch = PackedBatch::new(1.0);
    batch.push(&[2, 3, 4]);
    assert!(policy.values(&batch).is_err(), "no value head yet");
    policy.enable_values().unwrap();
    let values: Vec<f32> = policy
        .values_no_grad(&batch)
        .unwrap()
        .into_data()
        .try_to_vec()
        .unwrap();
    assert_eq!(values.len(), 3);
    assert_eq!(values[0], 0.0, "the first token has no prefix to value");

    let critic = build("ppo-critic", &[("value_coef", 1.0.into())]);
    let mut optimizer = AdamWConfig::new().init();
    let s = TrainerSettings {
        lr: 0.01,
        ..settings(10_000, 1)
    };
    let mut value_loss = Vec::new();
    for version in 0..40 {
        let report = train_step(
            &mut policy,
            None,
            &mut optimizer,
            critic.as_ref(),
            &data,
            version,
            &s,
        )
        .unwrap();
        value_loss.push(report.stats["value_loss"]);
    }
    let (first, last) = (value_loss[0], value_loss[39]);
    assert!(first > 0.05, "{value_loss:?}");
    assert!(last < first * 0.3, "value loss {first} -> {last}");
    // the value head is not part of the weights the generators load
    assert!(policy.weights().iter().all(|w| !w.name.contains("value")));
}

/// The samples of `groups` as episodes: after each sample's first token the environment
/// writes `[5, 6, first]`, and after its last `[5]`. A bigram policy's logprob of a token
/// depends only on the token before it, and every policy token keeps its predecessor (the
/// environment's turn ends with the token it follows), so the policy's tokens get the same
/// logprobs in both layouts: only the environment tokens differ.
fn as_episodes(groups: &[TrajectoryGroup]) -> Vec<TrajectoryGroup> {
    let mut out = groups.to_vec();
    for sample in out.iter_mut().flat_map(|g| &mut g.samples) {
        let c = &sample.completion;
        let mut turns = Completion::empty(c.finish_reason);
        turns.push(c.token_ids[0], c.behaviour_logprobs[0], c.versions[0]);
        turns.push_environment(&[5, 6, c.token_ids[0]]);
        for i in 1..c.len() {
            turns.push(c.token_ids[i], c.behaviour_logprobs[i], c.versions[i]);
        }
        turns.push_environment(&[5]);
        sample.completion = turns;
    }
    out
}

/// One step of the trainer on episodes (environment tokens between the policy's turns) is the
/// step on the same policy tokens without them, to the last bit of every weight: the loss
/// mask reaches the loss through packing, advantages and every micro-batch, and the
/// environment's tokens add no gradient, not even through the parameters of their own
/// transitions. Off policy (stale tokens), with micro-batches and mini-batches, and a KL
/// term to a reference policy that differs from the policy at every token (so that only the
/// loss mask keeps the environment's tokens out of it).
#[test]
fn environment_tokens_are_read_but_never_trained_on() {
    let reference = BigramPolicy::new(
        &BigramPolicyOptions {
            letters: 8,
            init_std: 0.5,
        },
        4,
        &Device::flex().autodiff(),
    );
    for (algorithm, options) in [
        ("decoupled-ppo", vec![]),
        ("decoupled-ppo", vec![("loss_agg", "seq-mean-token-mean")]),
        ("gspo", vec![]),
        ("ppo", vec![("dual_clip", "3.0")]),
        ("grpo", vec![("kl_coef", "0.5")]),
    ] {
        let version = 3;
        let stale = |j: usize, t: usize| version - ((j + t) % 3) as u64;
        let mut cfg = PluginConfig::new("algorithm", algorithm);
        for (k, v) in &options {
            cfg = cfg.with(
                k,
                serde_json::from_str::<serde_json::Value>(v).unwrap_or((*v).into()),
            );
        }
        let algorithm = AlgorithmPlugin::build_from(&cfg, &BuildContext::new(0, 1)).unwrap();
        let run = |episodes: bool| {
            let mut policy = policy();
            let mut data = groups(&policy, stale);
            if episodes {
                data = as_episodes(&data);
            }
            let mut optimizer = AdamWConfig::new().init();
            let reference = algorithm
                .requirements()
                .reference
                .then_some(&reference as &dyn Policy);
            let report = train_step(
                &mut policy,
                reference,
                &mut optimizer,
                algorithm.as_ref(),
                &data,
                version,
                &settings(24, 2),
            )
            .unwrap();
            (policy.weights(), report)
        };
        let (plain, plain_report) = run(false);
        let (episodes, episode_report) = run(true);
        let name = algorithm.name();
        assert_eq!(
            plain_report.trained_tokens, episode_report.trained_tokens,
            "{name}: environment tokens are not trained on"
        );
        assert_eq!(
            episode_report.packed_tokens,
            plain_report.packed_tokens + 12 * 4,
            "{name}: but they are read (packed)"
        );
        assert!(
            (plain_report.loss - episode_report.loss).abs() < 1e-6,
            "{name}: loss {} without environment tokens, {} with them",
            plain_report.loss,
            episode_report.loss
        );
        for (a, b) in plain.iter().zip(&episodes) {
            assert!(
                max_diff(&a.data, &b.data) < 1e-6,
                "{name}: weights `{}` differ by {} after a step with environment tokens",
                a.name,
                max_diff(&a.data, &b.data)
            );
        }
        assert_ne!(
            plain,
            policy().weights(),
            "{name}: the step changed nothing"
        );
    }
}

/// `rollout.max_lag_policy = "withhold"`: a sample with a token past the bound trains none of
/// its tokens, but its reward stays in its group's baseline. Its step is the step in which its
/// tokens are the environment's (read, never trained), not the step without it.
#[test]
fn a_withheld_sample_trains_no_token_but_keeps_its_reward_in_the_baseline() {
    let version = 3;
    // the last sample of every group was sampled by version 0 (lag 3), the others by 3
    let stale = |j: usize, _t: usize| if j == 3 { 0 } else { version };
    let withhold = TrainerSettings {
        withhold_past_lag: Some(2),
        ..settings(10_000, 2)
    };
    let run = |data: &dyn Fn(&dyn Policy) -> Vec<TrajectoryGroup>, s: &TrainerSettings| {
        let mut policy = policy();
        let data = data(&policy);
        let algorithm = build("decoupled-ppo", &[]);
        let mut optimizer = AdamWConfig::new().init();
        let report = train_step(
            &mut policy,
            None,
            &mut optimizer,
            algorithm.as_ref(),
            &data,
            version,
            s,
        )
        .unwrap();
        (policy.weights()[0].data.clone(), report)
    };
    let (withheld, r) = run(&|p| groups(p, stale), &withhold);
    assert_eq!(r.withheld_samples, 3);
    let trained = |data: &[TrajectoryGroup]| -> usize {
        data.iter()
            .flat_map(|g| &g.samples)
            .filter(|s| s.completion.versions[0] == version)
            .map(|s| s.completion.len())
            .sum()
    };
    let data = groups(&policy(), stale);
    assert_eq!(r.trained_tokens, trained(&data));

    // the same step with those samples' tokens made the environment's
    let environment = |p: &dyn Policy| {
        let mut data = groups(p, stale);
        for g in &mut data {
            let s = &mut g.samples[3];
            s.completion.versions = vec![areal_sdk::PROMPT_VERSION; s.completion.len()];
        }
        data
    };
    let (same, r2) = run(&environment, &settings(10_000, 2));
    assert_eq!(r2.withheld_samples, 0);
    assert!(
        max_diff(&withheld, &same) < 1e-7,
        "weights differ by {}",
        max_diff(&withheld, &same)
    );
    // not the step without the samples (their rewards moved the baseline) ...
    let without = |p: &dyn Policy| {
        let mut data = groups(p, stale);
        for g in &mut data {
            g.samples.pop();
        }
        data
    };
    let (dropped, _) = run(&without, &settings(10_000, 2));
    assert!(max_diff(&withheld, &dropped) > 1e-4);
    // ... nor the step that trains them
    let (kept, r3) = run(&|p| groups(p, stale), &settings(10_000, 2));
    assert_eq!(r3.withheld_samples, 0);
    assert!(max_diff(&withheld, &kept) > 1e-4);
    // their tokens are still measured: lag 3 is staleness, version 3 mismatch
    let o = r.off_policy.expect("measured with the proximal recompute");
    assert_eq!(
        o.staleness_by_lag["3"].tokens as usize,
        r3.trained_tokens - r.trained_tokens
    );
    assert_eq!(o.mismatch.tokens as usize, r.trained_tokens);
    assert!(o.mismatch.abs_max < 1e-5, "{o:?}");
}
