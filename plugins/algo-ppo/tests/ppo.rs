//! The PPO family: hand-computed cases, every variant against the numpy reference, the
//! conformance check, finite-difference checks of the autodiff gradient, and the options and
//! combinations that are rejected.

use areal_algo_ppo::Variant;
use areal_sdk::{
    BuildContext, Completion, FinishReason, PluginConfig, Reward, Trajectory, TrajectoryGroup,
    TurnReward, Verdict,
};
use areal_sdk_train::burn::tensor::{Device, Tensor, TensorData};
use areal_sdk_train::{
    AdvantageInput, Algorithm, AlgorithmPlugin, BehaviourLogprobs, CriticInput, CurrentLogprobs,
    LossInput, ProximalLogprobs, ProximalMode, ReferenceLogprobs,
};
use areal_testkit::conformance;

fn algo(kind: &str, options: &[(&str, serde_json::Value)]) -> std::sync::Arc<dyn Algorithm> {
    let mut cfg = PluginConfig::new("algorithm", kind);
    for (k, v) in options {
        cfg = cfg.with(k, v.clone());
    }
    AlgorithmPlugin::build_from(&cfg, &BuildContext::new(0, 1)).unwrap()
}

fn t(values: &[f32], device: &Device) -> Tensor<1> {
    Tensor::<1>::from_data(TensorData::new(values.to_vec(), [values.len()]), device)
}

/// One sequence: a prompt token then three generated tokens.
#[allow(
    clippy::single_range_in_vec_init,
    reason = "one sequence: its completion range"
)]
fn input(current: &[f32], proximal: &[f32], behaviour: &[f32], device: &Device) -> LossInput {
    LossInput {
        current: CurrentLogprobs(t(current, device)),
        proximal: ProximalLogprobs(t(proximal, device)),
        behaviour: BehaviourLogprobs(t(behaviour, device)),
        advantages: t(&[0.0, 1.0, -1.0, 1.0], device),
        loss_mask: t(&[0.0, 1.0, 1.0, 1.0], device),
        versions: vec![areal_sdk::PROMPT_VERSION, 0, 0, 0],
        completions: vec![1..4],
        minibatch_tokens: 3,
        minibatch_sequences: 1,
        trainer_version: 1,
        reference: None,
        critic: None,
    }
}

fn loss_of(a: &dyn Algorithm, i: &LossInput) -> (f64, std::collections::BTreeMap<String, f64>) {
    let out = a.loss(i).unwrap();
    (f64::from(out.loss.into_scalar::<f32>()), out.stats.means())
}

const LN: fn(f32) -> f32 = f32::ln;

#[test]
fn standard_ppo_clips_the_ratio() {
    let d = Device::flex();
    // ratios 1.5, 0.5, 1.0 against proximal = behaviour = 0
    let current = [0.0, LN(1.5), LN(0.5), 0.0];
    let zero = [0.0; 4];
    let (loss, stats) = loss_of(
        algo("ppo", &[]).as_ref(),
        &input(&current, &zero, &zero, &d),
    );
    // -min(1.5, 1.2)·1 = -1.2; -min(-0.5, -0.8) = 0.8; -1.0  →  -1.4 / 3
    assert!((loss - (-1.4 / 3.0)).abs() < 1e-6, "{loss}");
    assert!(
        (stats["clip_fraction"] - 2.0 / 3.0).abs() < 1e-6,
        "{stats:?}"
    );
    assert!((stats["ratio"] - 1.0).abs() < 1e-6, "{stats:?}");
}

#[test]
fn decoupled_ppo_weights_by_proximal_over_behaviour() {
    let d = Device::flex();
    let current = [0.0, LN(1.5), LN(0.5), 0.0];
    let proximal = [0.0; 4];
    // w = exp(prox - behav) = 2, 1, 0.5
    let behaviour = [0.0, LN(0.5), 0.0, LN(2.0)];
    let i = input(&current, &proximal, &behaviour, &d);
    let (loss, stats) = loss_of(algo("decoupled-ppo", &[]).as_ref(), &i);
    assert!((loss - (-2.1 / 3.0)).abs() < 1e-6, "{loss}");
    assert!(
        (stats["behav_weight"] - 3.5 / 3.0).abs() < 1e-6,
        "{stats:?}"
    );

    let masked = algo("decoupled-ppo", &[("behav_weight_cap", 1.5.into())]);
    let (loss, stats) = loss_of(masked.as_ref(), &i);
    assert!((loss - 0.3 / 3.0).abs() < 1e-6, "{loss}");
    assert!(
        (stats["behav_capped_fraction"] - 1.0 / 3.0).abs() < 1e-6,
        "{stats:?}"
    );

    let clamped = algo(
        "decoupled-ppo",
        &[
            ("behav_weight_cap", 1.5.into()),
            ("behav_weight_mode", "clamp".into()),
        ],
    );
    let (loss, _) = loss_of(clamped.as_ref(), &i);
    assert!((loss - (-1.5 / 3.0)).abs() < 1e-6, "{loss}");

    // with proximal = behaviour the decoupled loss is the standard one
    let (a, _) = loss_of(
        algo("decoupled-ppo", &[]).as_ref(),
        &input(&current, &behaviour, &behaviour, &d),
    );
    let (b, _) = loss_of(
        algo("ppo", &[]).as_ref(),
        &input(&current, &behaviour, &behaviour, &d),
    );
    assert!((a - b).abs() < 1e-7);
}

#[test]
fn dual_clip_bounds_negative_advantage_loss() {
    let d = Device::flex();
    // token 2 has A = -1 and ratio 5: plain PPO loss 5, dual clip at c = 3 gives 3
    let current = [0.0, 0.0, LN(5.0), 0.0];
    let zero = [0.0; 4];
    let i = input(&current, &zero, &zero, &d);
    let (plain, _) = loss_of(algo("ppo", &[]).as_ref(), &i);
    assert!((plain - (-1.0 + 5.0 - 1.0) / 3.0).abs() < 1e-5, "{plain}");
    let (dual, stats) = loss_of(algo("ppo", &[("dual_clip", 3.0.into())]).as_ref(), &i);
    assert!((dual - (-1.0 + 3.0 - 1.0) / 3.0).abs() < 1e-5, "{dual}");
    assert!((stats["dual_clip_fraction"] - 1.0 / 3.0).abs() < 1e-6);
}

#[test]
fn gradients_match_finite_differences() {
    let d = Device::flex().autodiff();
    let plain = Device::flex();
    // inside the clip range for all tokens (where there is one), so the losses are smooth here
    let base = [0.0f32, -1.0, -2.0, -0.5];
    let proximal = [0.0f32, -1.1, -1.9, -0.45];
    let behaviour = [0.0f32, -1.3, -1.7, -0.6];
    let reference = [0.0f32, -0.8, -2.2, -0.7];
    let cases: [(&str, Vec<(&str, serde_json::Value)>); 5] = [
        ("decoupled-ppo", vec![("eps_clip", 0.3.into())]),
        ("gspo", vec![("eps_clip", 0.3.into())]),
        ("sapo", vec![]),
        (
            "grpo",
            vec![("kl_coef", 0.5.into()), ("eps_clip", 0.3.into())],
        ),
        ("m2po", vec![("m2_threshold", 1.0.into())]),
    ];
    for (kind, options) in cases {
        let a = algo(kind, &options);
        let with = |x: &[f32], device: &Device| {
            let mut i = input(x, &proximal, &behaviour, device);
            i.reference = Some(ReferenceLogprobs(t(&reference, device)));
            i
        };
        let current = t(&base, &d).require_grad();
        let mut i = with(&base, &d);
        i.current = CurrentLogprobs(current.clone());
        let grads = a.loss(&i).unwrap().loss.backward();
        let grad: Vec<f32> = current
            .grad(&grads)
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        let h = 1e-3f32;
        for k in 0..4 {
            let mut up = base;
            up[k] += h;
            let mut down = base;
            down[k] -= h;
            let f = |x: &[f32]| loss_of(a.as_ref(), &with(x, &plain)).0;
            let numeric = (f(&up) - f(&down)) / (2.0 * f64::from(h));
            assert!(
                (numeric - f64::from(grad[k])).abs() < 2e-3,
                "{kind}, token {k}: autodiff {} vs finite difference {numeric}",
                grad[k]
            );
        }
        assert_eq!(grad[0], 0.0, "{kind}: prompt token has no gradient");
        assert!(grad[1..].iter().any(|g| *g != 0.0), "{kind}: no gradient");
    }
}

/// At a step's only gradient evaluation (one mini-batch) π_θ = π_prox, so decoupled PPO's
/// ratio is 1 and its gradient is w·A·∇log π_θ with w = π_θ/π_behav on every token: naive
/// PPO's gradient where naive PPO's clip does not act, and the full weight where it does.
/// The two objectives differ on one mini-batch by exactly naive PPO's clip set (what the
/// staleness ablation's split runs in `docs/benchmarks.md` take apart, half by half).
#[test]
#[allow(
    clippy::single_range_in_vec_init,
    reason = "one sequence: its completion range"
)]
fn on_one_minibatch_decoupled_ppo_is_naive_ppo_without_its_clip() {
    let d = Device::flex().autodiff();
    // a prompt token, then w = 1.1, 1.5 (A > 0) and 0.9, 0.5 (A < 0): ε = 0.2 clips the 2nd
    // (moved up past 1.2 with A > 0) and the 4th (down past 0.8 with A < 0)
    let theta = [0.0f32, -1.0, -0.7, -2.0, -1.5];
    let weights = [1.0f32, 1.1, 1.5, 0.9, 0.5];
    let behaviour: Vec<f32> = theta.iter().zip(weights).map(|(l, w)| l - w.ln()).collect();
    let advantages = [0.0f32, 1.0, 1.0, -1.0, -1.0];
    let grad_of = |kind: &str, options: &[(&str, serde_json::Value)]| -> Vec<f32> {
        let current = t(&theta, &d).require_grad();
        let i = LossInput {
            current: CurrentLogprobs(current.clone()),
            // what the engine gives each: ppo's proximal policy is the behaviour policy
            proximal: ProximalLogprobs(t(if kind == "ppo" { &behaviour } else { &theta }, &d)),
            behaviour: BehaviourLogprobs(t(&behaviour, &d)),
            advantages: t(&advantages, &d),
            loss_mask: t(&[0.0, 1.0, 1.0, 1.0, 1.0], &d),
            versions: vec![areal_sdk::PROMPT_VERSION, 0, 0, 0, 0],
            completions: vec![1..5],
            minibatch_tokens: 4,
            minibatch_sequences: 1,
            trainer_version: 4,
            reference: None,
            critic: None,
        };
        let grads = algo(kind, options).loss(&i).unwrap().loss.backward();
        current
            .grad(&grads)
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap()
    };
    let decoupled = grad_of("decoupled-ppo", &[]);
    let naive = grad_of("ppo", &[]);
    for k in 1..5 {
        let full = -advantages[k] * weights[k] / 4.0;
        assert!(
            (decoupled[k] - full).abs() < 1e-6,
            "token {k}: {decoupled:?}"
        );
        let clipped = k == 2 || k == 4;
        let expected = if clipped { 0.0 } else { full };
        assert!((naive[k] - expected).abs() < 1e-6, "token {k}: {naive:?}");
    }
    // naive PPO with neither side of its clip able to act is decoupled PPO
    let unclipped = grad_of(
        "ppo",
        &[("eps_clip", 0.999.into()), ("eps_clip_high", 1000.0.into())],
    );
    for k in 1..5 {
        assert!((unclipped[k] - decoupled[k]).abs() < 1e-6, "token {k}");
    }
    // each half of the clip alone: ε_high → ∞ keeps only the A < 0 side, ε_low → 1 with
    // ε_high = 0.2 only the A > 0 side (ε_high defaults to ε_low: ε_low = 0.999 alone widens
    // both sides)
    let only_negative = grad_of("ppo", &[("eps_clip_high", 1000.0.into())]);
    let only_positive = grad_of(
        "ppo",
        &[("eps_clip", 0.999.into()), ("eps_clip_high", 0.2.into())],
    );
    let both_wide = grad_of("ppo", &[("eps_clip", 0.999.into())]);
    assert!((both_wide[2] - decoupled[2]).abs() < 1e-6, "{both_wide:?}");
    for k in 1..5 {
        let zero_neg = if k == 4 { 0.0 } else { decoupled[k] };
        let zero_pos = if k == 2 { 0.0 } else { decoupled[k] };
        assert!(
            (only_negative[k] - zero_neg).abs() < 1e-6,
            "token {k}: {only_negative:?}"
        );
        assert!(
            (only_positive[k] - zero_pos).abs() < 1e-6,
            "token {k}: {only_positive:?}"
        );
    }
}

fn group(id: u64, rewards: &[f64]) -> TrajectoryGroup {
    TrajectoryGroup {
        group_id: id,
        item_id: format!("item-{id}"),
        prompt_ids: vec![1, 2],
        admitted_at: 0,
        samples: rewards
            .iter()
            .enumerate()
            .map(|(i, &r)| Trajectory {
                sample_id: id * 10 + i as u64,
                completion: Completion {
                    token_ids: vec![3; i + 2],
                    behaviour_logprobs: vec![-0.7; i + 2],
                    versions: vec![0; i + 2],
                    finish_reason: FinishReason::Stop,
                },
                reward: Reward::new(r, Verdict::Partial),
            })
            .collect(),
    }
}

/// [`group`] with a reward of `value` at the end of each sample's first token (an episode's
/// first turn), beside its final reward.
fn with_turn_rewards(mut group: TrajectoryGroup, value: f64) -> TrajectoryGroup {
    for sample in &mut group.samples {
        sample.reward.turns.push(TurnReward { end: 1, value });
    }
    group
}

#[test]
fn every_variant_conforms() {
    let groups = [group(0, &[1.0, 0.0, 0.5]), group(1, &[0.2, 0.9])];
    // with rewards at the ends of turns, advantages differ within a sample: each token's
    // gradient must still follow its own advantage (GSPO's ratio is the sequence's, so its
    // tokens' gradients mix their sample's advantages, and it is left out of this part)
    let turns = [
        group(0, &[1.0, 0.0, 0.5]),
        with_turn_rewards(group(2, &[0.3, 0.0]), 0.5),
    ];
    for variant in Variant::ALL {
        let options: Vec<(&str, serde_json::Value)> = match variant {
            Variant::DrGrpo => vec![("loss_agg_constant", 8.into())],
            _ => vec![],
        };
        let algorithm = algo(variant.name(), &options);
        conformance::check_algorithm(algorithm.as_ref(), &groups);
        if variant != Variant::Gspo {
            conformance::check_algorithm(algorithm.as_ref(), &turns);
        }
    }
}

/// The options that change how tokens are counted, weighted or rewarded, each on top of the
/// default variants' checks: an episode's environment tokens change nothing under any of them
/// (the testkit's `check_algorithm` compares the samples with and without them).
#[test]
fn environment_tokens_change_nothing_under_every_option() {
    let groups = [group(0, &[1.0, 0.0, 0.5]), group(1, &[0.2, 0.9])];
    let cases: Vec<(&str, Vec<(&str, serde_json::Value)>)> = vec![
        (
            "decoupled-ppo",
            vec![
                ("loss_agg", "seq-mean-token-mean".into()),
                ("behav_weight_level", "sequence".into()),
                ("behav_weight_cap", 1.05.into()),
            ],
        ),
        (
            "decoupled-ppo",
            vec![
                ("loss_agg", "seq-mean-token-sum".into()),
                ("dual_clip", 3.0.into()),
            ],
        ),
        (
            "decoupled-ppo",
            vec![
                ("kl_coef", 0.1.into()),
                ("kl_placement", "reward".into()),
                ("kl_estimator", "k3".into()),
                ("token_whitening", true.into()),
            ],
        ),
        (
            "decoupled-ppo",
            vec![
                ("kl_coef", 0.1.into()),
                ("kl_placement", "loss".into()),
                ("kl_estimator", "k2".into()),
            ],
        ),
        (
            "decoupled-ppo",
            vec![
                ("overlong_buffer", 2.into()),
                ("overlong_max_tokens", 3.into()),
                ("overlong_penalty", 1.0.into()),
            ],
        ),
        (
            "ppo-critic",
            vec![("value_clip", 0.2.into()), ("gamma", 0.9.into())],
        ),
        (
            "decoupled-ppo",
            vec![
                ("behav_weight_cap", 1.3.into()),
                ("behav_weight_floor", 0.8.into()),
            ],
        ),
        (
            "decoupled-ppo",
            vec![
                ("behav_weight_floor", 0.9.into()),
                ("behav_weight_mode", "clamp".into()),
                ("behav_weight_level", "sequence".into()),
            ],
        ),
        ("decoupled-ppo", vec![("max_token_lag", 1.into())]),
        ("grpo", vec![("max_token_lag", 0.into())]),
    ];
    for (kind, options) in cases {
        conformance::check_algorithm(algo(kind, &options).as_ref(), &groups);
    }
}

/// A turn's reward is credited where it was earned: with returns-to-go, the tokens of the
/// turn it rewards and of the turns before see it, the tokens after do not; sequence-level
/// variants see the sample's return (the final reward plus its turns').
#[test]
fn turn_rewards_are_credited_to_the_turns_before_them() {
    // sample 0: 5 tokens, 0.5 at the end of its second token, 1.0 at the end; sample 1: 0
    let mut g = group(0, &[1.0, 0.0]);
    g.samples[0].completion = g.samples[1].completion.clone();
    g.samples[0].completion.token_ids.extend([3, 3]);
    g.samples[0]
        .completion
        .behaviour_logprobs
        .extend([-0.7, -0.7]);
    g.samples[0].completion.versions.extend([0, 0]);
    g.samples[0]
        .reward
        .turns
        .push(TurnReward { end: 2, value: 0.5 });
    assert_eq!(g.samples[0].reward.total(), 1.5);
    let groups = [g];
    let old: Vec<Vec<f32>> = groups[0]
        .samples
        .iter()
        .map(|s| s.completion.behaviour_logprobs.clone())
        .collect();
    let input = AdvantageInput::new(&groups, &old);
    // returns-to-go: turn 1 sees 1.5, turn 2 sees 1.0; the group's mean return is 0.75
    let a = algo("decoupled-ppo", &[])
        .advantages(&input)
        .unwrap()
        .advantages;
    let (s0, s1) = (&a[0], &a[1]);
    assert_eq!(s0[0], s0[1]);
    assert_eq!(s0[2], s0[3]);
    assert!((s0[2] / s0[0] - 1.0 / 3.0).abs() < 1e-6, "{a:?}");
    assert!((s1[0] / s0[0] + 1.0).abs() < 1e-6, "{a:?}");
    // with a critic, the turn's reward enters GAE at the turn's last token: with V = 0,
    // γ = λ = 1, the returns are the rewards to go
    let values = vec![vec![0.0f32; 5], vec![0.0; 3]];
    let input = input.with_values(&values);
    let returns = algo(
        "ppo-critic",
        &[("gamma", 1.0.into()), ("lambda", 1.0.into())],
    )
    .advantages(&input)
    .unwrap()
    .returns
    .unwrap();
    assert_eq!(returns[0], vec![1.5, 1.5, 1.0, 1.0, 1.0]);
    assert_eq!(returns[1], vec![0.0; 3]);
}

#[test]
fn every_variant_is_registered_with_a_description() {
    let infos = areal_sdk::registry::infos::<AlgorithmPlugin>();
    for variant in Variant::ALL {
        let info = infos
            .iter()
            .find(|i| i.name == variant.name())
            .unwrap_or_else(|| panic!("{} is not registered", variant.name()));
        assert!(!info.description.is_empty());
        assert_eq!(info.description, variant.description());
    }
}

#[test]
fn dapo_filters_groups_whose_rewards_are_all_equal() {
    let dapo = algo("dapo", &[]);
    assert!(!dapo.keep_group(&group(0, &[1.0, 1.0, 1.0])));
    assert!(!dapo.keep_group(&group(0, &[0.0, 0.0])));
    assert!(dapo.keep_group(&group(0, &[1.0, 0.0, 1.0])));
    // the others keep every group
    assert!(algo("grpo", &[]).keep_group(&group(0, &[1.0, 1.0])));
    assert!(algo("grpo", &[("dynamic_filter", true.into())]).keep_group(&group(0, &[1.0, 0.5])));
    assert!(!algo("grpo", &[("dynamic_filter", true.into())]).keep_group(&group(0, &[0.5, 0.5])));
}

#[test]
fn requirements_follow_the_options() {
    let needs =
        |kind: &str, options: &[(&str, serde_json::Value)]| algo(kind, options).requirements();
    assert_eq!(needs("ppo", &[]).proximal, ProximalMode::Behaviour);
    assert_eq!(
        needs("decoupled-ppo", &[]).proximal,
        ProximalMode::Recompute
    );
    assert_eq!(
        needs("decoupled-ppo", &[("proximal", "log-linear".into())]).proximal,
        ProximalMode::LogLinear
    );
    assert!(needs("grpo", &[]).reference);
    assert!(!needs("grpo", &[("kl_coef", 0.0.into())]).reference);
    assert!(needs("reinforce++", &[]).reference);
    assert!(!needs("dapo", &[]).reference);
    assert!(needs("ppo-critic", &[]).values);
    assert!(!needs("ppo", &[]).values);
}

#[test]
fn length_defaults_come_from_the_engine() {
    let ctx = BuildContext::new(0, 1).with_max_new_tokens(80);
    let build = |kind: &str| {
        areal_algo_ppo::PpoFamily::new(
            Variant::ALL.into_iter().find(|v| v.name() == kind).unwrap(),
            &PluginConfig::new("algorithm", kind),
            &ctx,
        )
        .unwrap()
    };
    let dapo = build("dapo");
    assert_eq!(dapo.options().overlong_max_tokens, Some(80));
    assert_eq!(dapo.options().overlong_buffer, 16);
    assert_eq!(build("dr-grpo").options().loss_agg_constant, Some(80));
    // any variant gets the same length defaults when it opts into what uses them
    let grpo = areal_algo_ppo::PpoFamily::new(
        Variant::Grpo,
        &PluginConfig::new("algorithm", "grpo")
            .with("loss_agg", "seq-mean-token-sum-norm")
            .with("overlong_buffer", 10),
        &ctx,
    )
    .unwrap();
    assert_eq!(grpo.options().loss_agg_constant, Some(80));
    assert_eq!(grpo.options().overlong_max_tokens, Some(80));
    assert_eq!(areal_algo_ppo::overlong_punishment(64, 80, 16), 0.0);
    assert_eq!(areal_algo_ppo::overlong_punishment(72, 80, 16), -0.5);
    assert_eq!(areal_algo_ppo::overlong_punishment(80, 80, 16), -1.0);
    assert_eq!(areal_algo_ppo::overlong_punishment(81, 80, 16), -1.0);
}

#[test]
fn combinations_that_make_no_sense_are_rejected_with_the_reason() {
    let error = |kind: &str, options: &[(&str, serde_json::Value)]| {
        let mut cfg = PluginConfig::new("algorithm", kind);
        for (k, v) in options {
            cfg = cfg.with(k, v.clone());
        }
        AlgorithmPlugin::build_from(&cfg, &BuildContext::new(0, 1))
            .err()
            .unwrap_or_else(|| panic!("{kind} {options:?} was accepted"))
            .to_string()
    };
    let e = error("sapo", &[("proximal", "recompute".into())]);
    assert!(
        e.contains("`algorithm.proximal`") && e.contains("decoupled"),
        "{e}"
    );
    let e = error("sapo", &[("eps_clip", 0.1.into())]);
    assert!(
        e.contains("`algorithm.eps_clip`") && e.contains("soft sigmoid gate"),
        "{e}"
    );
    let e = error("m2po", &[("dual_clip", 3.0.into())]);
    assert!(
        e.contains("`algorithm.dual_clip`") && e.contains("m2_threshold"),
        "{e}"
    );
    let e = error("grpo", &[("tau_pos", 2.0.into())]);
    assert!(
        e.contains("`algorithm.tau_pos`") && e.contains("only applies to sapo"),
        "{e}"
    );
    let e = error("dapo", &[("gamma", 0.9.into())]);
    assert!(
        e.contains("`algorithm.gamma`") && e.contains("ppo-critic"),
        "{e}"
    );
    let e = error("ppo-critic", &[("baseline", "group-mean".into())]);
    assert!(
        e.contains("`algorithm.baseline`") && e.contains("GAE"),
        "{e}"
    );
    let e = error("decoupled-ppo", &[("proximal", "behaviour".into())]);
    assert!(
        e.contains("`algorithm.proximal`") && e.contains("\"ppo\""),
        "{e}"
    );
    let e = error("dr-grpo", &[]);
    assert!(e.contains("`algorithm.loss_agg_constant`"), "{e}");
    let e = error("dapo", &[("overlong_buffer", 8.into())]);
    assert!(e.contains("`algorithm.overlong_max_tokens`"), "{e}");
    let e = error("grpo", &[("kl_estimator", "k4".into())]);
    assert!(
        e.contains("`algorithm.kl_estimator`") && e.contains("k4"),
        "{e}"
    );
    let e = error("grpo", &[("behav_weight_cap", 2.0.into())]);
    assert!(e.contains("`algorithm.behav_weight_cap`"), "{e}");
    let e = error("grpo", &[("kl_coef", (-0.1).into())]);
    assert!(e.contains("`algorithm.kl_coef`"), "{e}");
}

#[test]
fn options_are_checked_with_their_key() {
    let build = |kind: &str, key: &str, v: serde_json::Value| {
        let cfg = PluginConfig::new("algorithm", kind).with(key, v);
        AlgorithmPlugin::build_from(&cfg, &BuildContext::new(0, 1))
            .err()
            .unwrap()
            .to_string()
    };
    let e = build("decoupled-ppo", "eps_clip", 1.5.into());
    assert!(
        e.contains("`algorithm.eps_clip`") && e.contains("1.5"),
        "{e}"
    );
    let e = build("ppo", "behav_weight_cap", 2.0.into());
    assert!(
        e.contains("`algorithm.behav_weight_cap`") && e.contains("decoupled-ppo"),
        "{e}"
    );
    let e = build("ppo", "behav_weight_floor", 0.5.into());
    assert!(
        e.contains("`algorithm.behav_weight_floor`") && e.contains("decoupled-ppo"),
        "{e}"
    );
    let e = build("decoupled-ppo", "behav_weight_floor", 1.2.into());
    assert!(
        e.contains("`algorithm.behav_weight_floor`") && e.contains("(0, 1)"),
        "{e}"
    );
    let e = build("decoupled-ppo", "max_token_lag", (-1).into());
    assert!(e.contains("`algorithm.max_token_lag`"), "{e}");
    let e = build("ppo", "proximal", "log-linear".into());
    assert!(e.contains("`algorithm.proximal`"), "{e}");
    let e = build("decoupled-ppo", "eps_clipp", 0.1.into());
    assert!(
        e.contains("`algorithm.eps_clipp`") && e.contains("unknown field"),
        "{e}"
    );
    let e = build("ppo", "baseline", "median".into());
    assert!(
        e.contains("`algorithm.baseline`") && e.contains("median"),
        "{e}"
    );
    let e = AlgorithmPlugin::build_from(
        &PluginConfig::new("algorithm", "ppo2"),
        &BuildContext::new(0, 1),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("ppo2") && e.contains("decoupled-ppo") && e.contains("reinforce++"),
        "{e}"
    );
}

/// A fixture's token versions: the fixtures write a prompt token's version as -1.
fn fixture_versions(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|v| match v.as_i64().unwrap() {
            -1 => areal_sdk::PROMPT_VERSION,
            v => v as u64,
        })
        .collect()
}

/// A fixture's completion ranges, written as `[start, end]`.
fn fixture_ranges(v: &serde_json::Value) -> Vec<std::ops::Range<usize>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_u64().unwrap() as usize..r[1].as_u64().unwrap() as usize)
        .collect()
}

/// `tests/fixtures/reference.json`, written by `reference.py` (numpy, from the published
/// formulas): every case's advantages, loss and statistics on one fixed batch, at 1e-5.
#[test]
fn losses_and_advantages_match_the_numpy_reference() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reference.json");
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let floats = |key: &str| -> Vec<f32> {
        fixture[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect()
    };
    let completions = fixture_ranges(&fixture["completions"]);
    // The groups, with completion lengths as in the packed batch.
    let mut lengths = completions.iter().map(|r| r.len());
    let groups: Vec<TrajectoryGroup> = fixture["group_rewards"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(g, rewards)| {
            let mut group = group(g as u64, &[]);
            for (i, r) in rewards.as_array().unwrap().iter().enumerate() {
                let n = lengths.next().unwrap();
                group.samples.push(Trajectory {
                    sample_id: g as u64 * 10 + i as u64,
                    completion: Completion {
                        token_ids: vec![3; n],
                        behaviour_logprobs: vec![-0.7; n],
                        versions: vec![0; n],
                        finish_reason: FinishReason::Stop,
                    },
                    reward: Reward::new(r.as_f64().unwrap(), Verdict::Partial),
                });
            }
            group
        })
        .collect();
    let d = Device::flex();
    let mask = floats("loss_mask");
    let tokens = mask.iter().filter(|m| **m > 0.0).count();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
    let mut checked = 0;
    for case in fixture["cases"].as_array().unwrap() {
        let kind = case["kind"].as_str().unwrap();
        let options: Vec<(&str, serde_json::Value)> = case["options"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let a = algo(kind, &options);
        let label = format!("{kind} {}", case["options"]);

        let needs = a.requirements();
        // What the engine hands over: π_prox is the behaviour policy unless recomputed.
        let proximal = match needs.proximal {
            areal_sdk_train::ProximalMode::Behaviour => floats("behaviour"),
            _ => floats("proximal"),
        };
        let slices = |all: &[f32]| -> Vec<Vec<f32>> {
            completions
                .iter()
                .map(|r| all[r.clone()].to_vec())
                .collect()
        };
        let old = slices(&proximal);
        let reference = slices(&floats("reference"));
        let old_values = slices(&floats("old_values"));
        let mut advantage_input = AdvantageInput::new(&groups, &old);
        if needs.reference {
            advantage_input = advantage_input.with_reference(&reference);
        }
        if needs.values {
            advantage_input = advantage_input.with_values(&old_values);
        }
        let computed = a.advantages(&advantage_input).unwrap();
        let per_sample = |key: &str| -> Vec<Vec<f64>> {
            case[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|xs| {
                    xs.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap())
                        .collect()
                })
                .collect()
        };
        let compare = |what: &str, got: &[Vec<f32>], want: &[Vec<f64>]| {
            assert_eq!(got.len(), want.len(), "{label}: {what}");
            for (g, w) in got.iter().zip(want) {
                assert_eq!(g.len(), w.len(), "{label}: {what}");
                assert!(
                    g.iter().zip(w).all(|(g, w)| close(f64::from(*g), *w)),
                    "{label}: {what} {g:?} vs {w:?}"
                );
            }
        };
        compare(
            "advantages",
            &computed.advantages,
            &per_sample("advantages"),
        );
        assert_eq!(
            computed.returns.is_some(),
            case.get("returns").is_some(),
            "{label}"
        );
        if let Some(returns) = &computed.returns {
            compare("returns", returns, &per_sample("returns"));
        }

        let mut per_token = vec![0.0f32; mask.len()];
        for (range, adv) in completions.iter().zip(&computed.advantages) {
            per_token[range.clone()].copy_from_slice(adv);
        }
        let mut returns = vec![0.0f32; mask.len()];
        for (range, r) in completions.iter().zip(computed.returns.iter().flatten()) {
            returns[range.clone()].copy_from_slice(r);
        }
        let input = LossInput {
            current: CurrentLogprobs(t(&floats("current"), &d)),
            proximal: ProximalLogprobs(t(&proximal, &d)),
            behaviour: BehaviourLogprobs(t(&floats("behaviour"), &d)),
            advantages: t(&per_token, &d),
            loss_mask: t(&mask, &d),
            versions: fixture_versions(&fixture["versions"]),
            completions: completions.clone(),
            minibatch_tokens: tokens,
            minibatch_sequences: completions.len(),
            trainer_version: fixture["trainer_version"].as_u64().unwrap(),
            reference: needs
                .reference
                .then(|| ReferenceLogprobs(t(&floats("reference"), &d))),
            critic: needs.values.then(|| CriticInput {
                values: t(&floats("values"), &d),
                old_values: t(&floats("old_values"), &d),
                returns: t(&returns, &d),
            }),
        };
        let (loss, stats) = loss_of(a.as_ref(), &input);
        let want_loss = case["loss"].as_f64().unwrap();
        assert!(
            close(loss, want_loss),
            "{label}: loss {loss} vs {want_loss}"
        );
        let want_stats = case["stats"].as_object().unwrap();
        assert_eq!(
            stats.keys().collect::<Vec<_>>(),
            want_stats
                .keys()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>(),
            "{label}: the same statistics"
        );
        for (name, want) in want_stats {
            let want = want.as_f64().unwrap();
            let got = stats[name];
            assert!(close(got, want), "{label}: {name} {got} vs {want}");
        }
        checked += 1;
    }
    assert_eq!(checked, 34, "every case of the fixture");
}

/// The audit of the decoupled objective on real batches: `tests/fixtures/recorded.json` holds
/// loss calls of the built-in job recorded by `areal bench audit-objective` (several
/// mini-batches, η = 4, real stale tokens), with each case's loss and per-token gradient as
/// `audit.py` computes them in numpy from Eq. 5. The Rust loss and its autodiff gradient must
/// match, token by token. `AREAL_AUDIT=FILE` checks another `audit.py` output (a whole
/// recording) and prints the largest differences per case.
#[test]
#[allow(clippy::print_stderr, reason = "the test prints what it measured")]
fn recorded_batches_match_numpy() {
    let path = std::env::var_os("AREAL_AUDIT").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recorded.json"),
        std::path::PathBuf::from,
    );
    let audit: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let floats = |v: &serde_json::Value| -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    let calls = audit["calls"].as_array().unwrap();
    let d = Device::flex().autodiff();
    let mut stale_tokens = 0;
    let mut losses: Vec<Vec<f64>> = Vec::new();
    eprintln!("| case | calls | tokens | max |Δ loss| | max |Δ gradient| | max |gradient| |");
    eprintln!("|---|---|---|---|---|---|");
    for case in audit["cases"].as_array().unwrap() {
        let kind = case["kind"].as_str().unwrap();
        let options: Vec<(&str, serde_json::Value)> = case["options"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let a = algo(kind, &options);
        let label = format!("{kind} {}", case["options"]);
        let (mut loss_gap, mut grad_gap, mut grad_max, mut tokens) = (0.0f64, 0.0f64, 0.0f64, 0);
        let mut case_losses = Vec::new();
        for (call, want) in calls.iter().zip(case["calls"].as_array().unwrap()) {
            let current = t(&floats(&call["current"]), &d).require_grad();
            let versions = fixture_versions(&call["versions"]);
            let trainer_version = call["trainer_version"].as_u64().unwrap();
            stale_tokens += versions
                .iter()
                .filter(|&&v| v != areal_sdk::PROMPT_VERSION && v < trainer_version)
                .count();
            let input = LossInput {
                current: CurrentLogprobs(current.clone()),
                proximal: ProximalLogprobs(t(&floats(&call["proximal"]), &d)),
                behaviour: BehaviourLogprobs(t(&floats(&call["behaviour"]), &d)),
                advantages: t(&floats(&call["advantages"]), &d),
                loss_mask: t(&floats(&call["loss_mask"]), &d),
                versions,
                completions: fixture_ranges(&call["completions"]),
                minibatch_tokens: call["minibatch_tokens"].as_u64().unwrap() as usize,
                minibatch_sequences: call["minibatch_sequences"].as_u64().unwrap() as usize,
                trainer_version,
                reference: None,
                critic: None,
            };
            let loss = a.loss(&input).unwrap().loss;
            let value = f64::from(loss.clone().into_scalar::<f32>());
            let grads = loss.backward();
            let grad: Vec<f32> = current
                .grad(&grads)
                .unwrap()
                .into_data()
                .try_to_vec()
                .unwrap();
            let want_grad = floats(&want["gradient"]);
            assert_eq!(grad.len(), want_grad.len(), "{label}");
            let want_loss = want["loss"].as_f64().unwrap();
            case_losses.push(want_loss);
            loss_gap = loss_gap.max((value - want_loss).abs());
            let scale = want_grad.iter().fold(0.0f32, |m, g| m.max(g.abs()));
            for (i, (g, w)) in grad.iter().zip(&want_grad).enumerate() {
                let gap = f64::from((g - w).abs());
                assert!(
                    gap <= 1e-4 * f64::from(scale) + 1e-9,
                    "{label}: token {i}: autodiff {g} vs numpy {w} (largest {scale})"
                );
                grad_gap = grad_gap.max(gap);
            }
            grad_max = grad_max.max(f64::from(scale));
            tokens += grad.len();
            assert!(
                (value - want_loss).abs() <= 1e-5 * (1.0 + want_loss.abs()),
                "{label}: loss {value} vs numpy {want_loss}"
            );
        }
        eprintln!(
            "| {label} | {} | {tokens} | {loss_gap:.1e} | {grad_gap:.1e} | {grad_max:.1e} |",
            calls.len()
        );
        // the first case is plain decoupled PPO; every other one must act on the recording
        if let Some(plain) = losses.first() {
            assert!(
                plain
                    .iter()
                    .zip(&case_losses)
                    .any(|(p, l)| (p - l).abs() > 1e-7),
                "{label}: its option never acts on this recording"
            );
        }
        losses.push(case_losses);
    }
    assert!(stale_tokens > 0, "the recording has stale tokens");
}
