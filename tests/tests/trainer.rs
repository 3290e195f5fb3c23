//! The trainer step: micro-batching is exact gradient accumulation, mini-batches step the
//! optimizer several times within one version, the proximal modes differ only where they
//! should, the reference policy stays frozen, and a critic learns its values.

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
