//! Loss values of `ppo` and `decoupled-ppo` on hand-computed cases, the conformance check, and
//! a finite-difference check of the autodiff gradient.

use areal_sdk::{
    BuildContext, Completion, FinishReason, PluginConfig, Reward, Trajectory, TrajectoryGroup,
    Verdict,
};
use areal_sdk_train::burn::tensor::{Device, Tensor, TensorData};
use areal_sdk_train::{
    Algorithm, AlgorithmPlugin, BehaviourLogprobs, CurrentLogprobs, LossInput, ProximalLogprobs,
};
use areal_testkit::conformance;
// Integration tests link only the crates they name: without this the registrations are lost.
use areal_algo_ppo as _;

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
#[allow(clippy::single_range_in_vec_init)]
fn input(current: &[f32], proximal: &[f32], behaviour: &[f32], device: &Device) -> LossInput {
    LossInput {
        current: CurrentLogprobs(t(current, device)),
        proximal: ProximalLogprobs(t(proximal, device)),
        behaviour: BehaviourLogprobs(t(behaviour, device)),
        advantages: t(&[0.0, 1.0, -1.0, 1.0], device),
        loss_mask: t(&[0.0, 1.0, 1.0, 1.0], device),
        versions: vec![-1, 0, 0, 0],
        completions: vec![1..4],
        minibatch_tokens: 3,
        minibatch_sequences: 1,
        trainer_version: 1,
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
fn gradient_matches_finite_differences() {
    let d = Device::flex().autodiff();
    let a = algo("decoupled-ppo", &[("eps_clip", 0.3.into())]);
    // inside the clip range for all tokens, so the loss is smooth here
    let base = [0.0f32, -1.0, -2.0, -0.5];
    let proximal = [0.0f32, -1.1, -1.9, -0.45];
    let behaviour = [0.0f32, -1.3, -1.7, -0.6];
    let current = t(&base, &d).require_grad();
    let mut i = input(&base, &proximal, &behaviour, &d);
    i.current = CurrentLogprobs(current.clone());
    let grads = a.loss(&i).unwrap().loss.backward();
    let grad: Vec<f32> = current
        .grad(&grads)
        .unwrap()
        .into_data()
        .try_to_vec()
        .unwrap();
    let plain = Device::flex();
    let h = 1e-3f32;
    for k in 0..4 {
        let mut up = base;
        up[k] += h;
        let mut down = base;
        down[k] -= h;
        let f = |x: &[f32]| loss_of(a.as_ref(), &input(x, &proximal, &behaviour, &plain)).0;
        let numeric = (f(&up) - f(&down)) / (2.0 * f64::from(h));
        assert!(
            (numeric - f64::from(grad[k])).abs() < 2e-3,
            "token {k}: autodiff {} vs finite difference {numeric}",
            grad[k]
        );
    }
    assert_eq!(grad[0], 0.0, "prompt token has no gradient");
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

#[test]
fn both_variants_conform() {
    let groups = [group(0, &[1.0, 0.0, 0.5]), group(1, &[0.2, 0.9])];
    for kind in ["ppo", "decoupled-ppo"] {
        conformance::check_algorithm(algo(kind, &[]).as_ref(), &groups);
    }
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
        e.contains("ppo2") && e.contains("decoupled-ppo, ppo"),
        "{e}"
    );
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
    let completions: Vec<std::ops::Range<usize>> = fixture["completions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_u64().unwrap() as usize..r[1].as_u64().unwrap() as usize)
        .collect();
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

        let advantages = a.advantages(&groups).unwrap();
        let want: Vec<f64> = case["advantages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(advantages.len(), want.len());
        for (got, want) in advantages.iter().zip(&want) {
            assert!(
                got.iter().all(|g| close(f64::from(*g), *want)),
                "{label}: advantages {got:?} vs {want}"
            );
        }

        let mut per_token = vec![0.0f32; mask.len()];
        for (range, adv) in completions.iter().zip(&advantages) {
            per_token[range.clone()].copy_from_slice(adv);
        }
        // What the engine hands over: standard PPO's proximal policy is the behaviour policy.
        let proximal = match a.requirements().proximal {
            areal_sdk_train::ProximalMode::Behaviour => floats("behaviour"),
            _ => floats("proximal"),
        };
        let input = LossInput {
            current: CurrentLogprobs(t(&floats("current"), &d)),
            proximal: ProximalLogprobs(t(&proximal, &d)),
            behaviour: BehaviourLogprobs(t(&floats("behaviour"), &d)),
            advantages: t(&per_token, &d),
            loss_mask: t(&mask, &d),
            versions: fixture["versions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect(),
            completions: completions.clone(),
            minibatch_tokens: tokens,
            minibatch_sequences: completions.len(),
            trainer_version: fixture["trainer_version"].as_i64().unwrap(),
        };
        let (loss, stats) = loss_of(a.as_ref(), &input);
        let want_loss = case["loss"].as_f64().unwrap();
        assert!(
            close(loss, want_loss),
            "{label}: loss {loss} vs {want_loss}"
        );
        for (name, want) in case["stats"].as_object().unwrap() {
            let want = want.as_f64().unwrap();
            let got = stats.get(name).copied().unwrap_or(f64::NAN);
            assert!(close(got, want), "{label}: {name} {got} vs {want}");
        }
    }
}
