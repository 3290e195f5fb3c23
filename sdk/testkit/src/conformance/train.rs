//! The policy and algorithm checks (they need burn: the `full` feature).

use areal_sdk::{PROMPT_VERSION, TrajectoryGroup};
use areal_sdk_train::burn::optim::ModuleOptimizer;
use areal_sdk_train::burn::tensor::{Tensor, TensorData};
use areal_sdk_train::{
    AdvantageInput, Algorithm, BehaviourLogprobs, CriticInput, CurrentLogprobs, LossInput,
    PackedBatch, Policy, ProximalLogprobs, ReferenceLogprobs,
};

/// Check a policy on some token sequences: logprob shape and range, the zero at each sequence
/// start, no-grad equal to grad, packing invariance (a sequence's logprobs do not depend on
/// what is packed beside it), exported weights, that a step on −Σ logprob raises it, and, for
/// a policy that saves its training state, that a step after restoring it is the same step
/// bit for bit.
pub fn check_policy(
    policy: &mut dyn Policy,
    optimizer: &mut ModuleOptimizer,
    sequences: &[Vec<u32>],
) {
    let name = policy.name().to_owned();
    assert!(sequences.len() >= 2, "{name}: give at least two sequences");
    let mut batch = PackedBatch::new(1.0);
    for s in sequences {
        batch.push(s);
    }
    let values = |t: Tensor<1>| -> Vec<f32> {
        t.into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32")
    };
    let lp = values(
        policy
            .logprobs(&batch)
            .unwrap_or_else(|e| panic!("{name}: logprobs: {e}")),
    );
    assert_eq!(
        lp.len(),
        batch.num_tokens(),
        "{name}: one logprob per token expected"
    );
    for range in batch.ranges() {
        assert_eq!(
            lp[range.start], 0.0,
            "{name}: first token of a sequence must get 0"
        );
        for (t, &value) in lp.iter().enumerate().take(range.end).skip(range.start + 1) {
            assert!(
                value.is_finite() && value <= 1e-5,
                "{name}: logprob {value} at {t}"
            );
        }
    }
    let lp_ng = values(policy.logprobs_no_grad(&batch).expect("no-grad logprobs"));
    for (a, b) in lp.iter().zip(&lp_ng) {
        assert!(
            (a - b).abs() < 1e-4,
            "{name}: no-grad logprobs differ: {a} vs {b}"
        );
    }
    for (i, range) in batch.ranges().enumerate() {
        let mut alone = PackedBatch::new(1.0);
        alone.push(&sequences[i]);
        let single = values(policy.logprobs_no_grad(&alone).expect("logprobs"));
        for (a, b) in lp[range].iter().zip(&single) {
            assert!(
                (a - b).abs() < 1e-4,
                "{name}: sequence {i} changes when packed: {a} vs {b}"
            );
        }
    }

    let weights = policy.weights();
    let mut names: Vec<&str> = weights.iter().map(|w| w.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(
        names.len(),
        weights.len(),
        "{name}: weight names are not unique"
    );
    for w in &weights {
        assert_eq!(
            w.data.len(),
            w.shape.iter().product::<usize>(),
            "{name}: `{}` has the wrong size",
            w.name
        );
    }

    let before: f32 = lp.iter().sum();
    let loss = policy.logprobs(&batch).expect("logprobs").sum().neg();
    policy
        .backward(loss)
        .unwrap_or_else(|e| panic!("{name}: backward: {e}"));
    let stats = policy
        .step(optimizer, 1e-2, Some(1.0))
        .unwrap_or_else(|e| panic!("{name}: step: {e}"));
    assert!(stats.grad_norm > 0.0, "{name}: zero gradient");
    let after: f32 = values(policy.logprobs_no_grad(&batch).expect("logprobs"))
        .iter()
        .sum();
    assert!(
        after > before,
        "{name}: a step on -sum(logprob) did not raise it ({before} -> {after})"
    );
    assert_ne!(
        policy.weights(),
        weights,
        "{name}: weights did not change after a step"
    );

    // Exact resume, if the policy supports it: its state saved now and restored after another
    // step makes that step again, bit for bit (parameters and optimizer state both restored).
    let dir = tempfile::tempdir().expect("a temp dir");
    match policy.save_state(Some(optimizer), dir.path()) {
        Err(e) if e.is_unsupported() => return,
        Err(e) => panic!("{name}: save_state: {e}"),
        Ok(()) => {}
    }
    let saved = policy.weights();
    let step = |policy: &mut dyn Policy, optimizer: &mut ModuleOptimizer| {
        let loss = policy.logprobs(&batch).expect("logprobs").sum().neg();
        policy.backward(loss).expect("backward");
        policy.step(optimizer, 1e-2, Some(1.0)).expect("step");
        bits(&policy.weights())
    };
    let once = step(policy, optimizer);
    policy
        .load_state(Some(optimizer), dir.path())
        .unwrap_or_else(|e| panic!("{name}: load_state: {e}"));
    assert_eq!(
        bits(&policy.weights()),
        bits(&saved),
        "{name}: load_state restored other weights"
    );
    let again = step(policy, optimizer);
    assert!(
        once == again,
        "{name}: the step after load_state differs from the step after save_state (is the optimizer's state restored?)"
    );
}

/// Every weight's values as bits, by name.
fn bits(weights: &[areal_sdk::NamedTensor]) -> Vec<(String, Vec<u32>)> {
    weights
        .iter()
        .map(|w| (w.name.clone(), w.data.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

/// Check an algorithm on finished groups: advantages have the right shape and are finite, and
/// on-policy (current = proximal = behaviour) the loss is finite and its gradient pushes up
/// the logprob of tokens with positive advantage and down those with negative advantage,
/// leaving prompt tokens alone. Then the same samples as episodes, with environment tokens
/// between and after the policy's: those change nothing of what is trained (advantages,
/// returns, loss, gradients of the policy's tokens) and get no gradient themselves.
pub fn check_algorithm(algorithm: &dyn Algorithm, groups: &[TrajectoryGroup]) {
    let name = algorithm.name().to_owned();
    let needs = algorithm.requirements();
    let samples: Vec<_> = groups
        .iter()
        .flat_map(|g| g.samples.iter().map(move |s| (g, s)))
        .collect();
    // On policy: old = reference = behaviour; values 0 before the update.
    let old: Vec<Vec<f32>> = samples
        .iter()
        .map(|(_, s)| s.completion.behaviour_logprobs.clone())
        .collect();
    let zero_values: Vec<Vec<f32>> = samples
        .iter()
        .map(|(_, s)| vec![0.0; s.completion.len()])
        .collect();
    let mut advantage_input = AdvantageInput::new(groups, &old);
    if needs.reference {
        advantage_input = advantage_input.with_reference(&old);
    }
    if needs.values {
        advantage_input = advantage_input.with_values(&zero_values);
    }
    let computed = algorithm
        .advantages(&advantage_input)
        .unwrap_or_else(|e| panic!("{name}: advantages: {e}"));
    assert_eq!(
        computed.returns.is_some(),
        needs.values,
        "{name}: value targets (returns) exactly when the algorithm asks for values"
    );
    let advantages = computed.advantages;
    assert_eq!(
        advantages.len(),
        samples.len(),
        "{name}: one advantage vector per sample"
    );

    let device = areal_sdk_train::burn::tensor::Device::flex().autodiff();
    let (mut behaviour, mut adv, mut mask, mut versions, mut completions) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((group, sample), a) in samples.iter().zip(&advantages) {
        assert_eq!(
            a.len(),
            sample.completion.len(),
            "{name}: advantages of sample {} have the wrong length",
            sample.sample_id
        );
        assert!(
            a.iter().all(|x| x.is_finite()),
            "{name}: non-finite advantage"
        );
        let start = behaviour.len() + group.prompt_ids.len();
        for _ in &group.prompt_ids {
            behaviour.push(0.0);
            adv.push(0.0);
            mask.push(0.0);
            versions.push(PROMPT_VERSION);
        }
        behaviour.extend(&sample.completion.behaviour_logprobs);
        adv.extend(a);
        mask.extend(
            sample
                .completion
                .versions
                .iter()
                .map(|&v| if v == PROMPT_VERSION { 0.0f32 } else { 1.0 }),
        );
        versions.extend(&sample.completion.versions);
        completions.push(start..behaviour.len());
    }
    let n = behaviour.len();
    let tensor = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [n]), &device);
    let current = tensor(&behaviour).require_grad();
    let input = LossInput {
        current: CurrentLogprobs(current.clone()),
        proximal: ProximalLogprobs(tensor(&behaviour)),
        behaviour: BehaviourLogprobs(tensor(&behaviour)),
        advantages: tensor(&adv),
        loss_mask: tensor(&mask),
        versions: versions.clone(),
        minibatch_tokens: mask.iter().filter(|m| **m > 0.0).count(),
        minibatch_sequences: completions.len(),
        completions,
        // on policy: the version that sampled the tokens (not the prompt's marker)
        trainer_version: versions
            .iter()
            .copied()
            .filter(|&v| v != PROMPT_VERSION)
            .max()
            .unwrap_or(0),
        reference: needs
            .reference
            .then(|| ReferenceLogprobs(tensor(&behaviour))),
        critic: needs.values.then(|| CriticInput {
            values: tensor(&vec![0.0; n]).require_grad(),
            old_values: tensor(&vec![0.0; n]),
            returns: tensor(&adv),
        }),
    };
    let out = algorithm
        .loss(&input)
        .unwrap_or_else(|e| panic!("{name}: loss: {e}"));
    assert_eq!(
        out.loss.dims(),
        [1],
        "{name}: the loss must be a one-element tensor"
    );
    let value = out.loss.clone().into_scalar::<f32>();
    assert!(value.is_finite(), "{name}: loss is {value}");
    let grads = out.loss.backward();
    let grad = current
        .grad(&grads)
        .map(|g| {
            g.into_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .expect("f32")
        })
        .unwrap_or_else(|| vec![0.0; n]);
    for t in 0..n {
        if mask[t] == 0.0 {
            assert_eq!(grad[t], 0.0, "{name}: gradient on prompt token {t}");
        } else if adv[t] != 0.0 {
            assert!(
                grad[t] * adv[t] < 0.0,
                "{name}: token {t} with advantage {} has loss gradient {}",
                adv[t],
                grad[t]
            );
        }
    }
    if samples
        .iter()
        .all(|(_, s)| s.completion.sampled_len() == s.completion.len())
    {
        check_environment_tokens(algorithm, groups);
    }
}

/// The groups of single-turn samples as episodes: environment tokens (a tool's result, the
/// template's glue) after each sample's first token and at its end.
fn as_episodes(groups: &[TrajectoryGroup]) -> Vec<TrajectoryGroup> {
    let mut episodes = groups.to_vec();
    for group in &mut episodes {
        let env = group.prompt_ids.first().copied().unwrap_or(0);
        for sample in &mut group.samples {
            let c = &sample.completion;
            if c.is_empty() {
                continue;
            }
            let mut turns = areal_sdk::Completion::empty(c.finish_reason);
            turns.push(c.token_ids[0], c.behaviour_logprobs[0], c.versions[0]);
            turns.push_environment(&[env, env, env]);
            for i in 1..c.len() {
                turns.push(c.token_ids[i], c.behaviour_logprobs[i], c.versions[i]);
            }
            turns.push_environment(&[env]);
            sample.completion = turns;
            // the turns' rewards move with their turns' ends
            for turn in &mut sample.reward.turns {
                if turn.end >= 1 {
                    turn.end += 3;
                }
            }
        }
    }
    episodes
}

/// A number in [−1, 1) that depends only on `(a, b)`.
fn noise(a: usize, b: usize) -> f32 {
    let mut x =
        (a as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (b as u64).wrapping_add(0x632b_e59b);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 29;
    (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// An episode's environment tokens change nothing of what is trained: with them inserted
/// (and arbitrary numbers at them, as a policy computes logprobs and values there too), the
/// advantages and returns of the policy's tokens, the loss and the gradient of every policy
/// token are those of the same samples without them, and no environment token gets a
/// gradient. Off policy (current and proximal logprobs away from the behaviour's), so that
/// clipping, importance weights and per-sequence means are all exercised.
fn check_environment_tokens(algorithm: &dyn Algorithm, groups: &[TrajectoryGroup]) {
    let name = algorithm.name().to_owned();
    let needs = algorithm.requirements();
    let episodes = as_episodes(groups);
    let advantages_of = |groups: &[TrajectoryGroup]| {
        let samples: Vec<_> = groups.iter().flat_map(|g| &g.samples).collect();
        let old: Vec<Vec<f32>> = samples
            .iter()
            .map(|s| s.completion.behaviour_logprobs.clone())
            .collect();
        // values that differ token by token, and arbitrary at the environment's tokens
        let values: Vec<Vec<f32>> = samples
            .iter()
            .enumerate()
            .map(|(j, s)| {
                let c = &s.completion;
                let mut k = 0;
                (0..c.len())
                    .map(|i| {
                        if c.is_sampled(i) {
                            k += 1;
                            0.3 * noise(j, k)
                        } else {
                            5.0 * noise(j + 100, i)
                        }
                    })
                    .collect()
            })
            .collect();
        let mut input = AdvantageInput::new(groups, &old);
        if needs.reference {
            input = input.with_reference(&old);
        }
        if needs.values {
            input = input.with_values(&values);
        }
        let computed = algorithm
            .advantages(&input)
            .unwrap_or_else(|e| panic!("{name}: advantages of episodes: {e}"));
        (computed, values)
    };
    let (plain, plain_values) = advantages_of(groups);
    let (episode, episode_values) = advantages_of(&episodes);
    let samples: Vec<_> = episodes.iter().flat_map(|g| &g.samples).collect();
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * (1.0 + a.abs().max(b.abs()));
    for (j, s) in samples.iter().enumerate() {
        let c = &s.completion;
        let sampled: Vec<usize> = (0..c.len()).filter(|&i| c.is_sampled(i)).collect();
        let at = |v: &[f32]| sampled.iter().map(|&i| v[i]).collect::<Vec<f32>>();
        let (want, got) = (&plain.advantages[j], at(&episode.advantages[j]));
        assert!(
            want.len() == got.len() && want.iter().zip(&got).all(|(a, b)| close(*a, *b)),
            "{name}: environment tokens change the advantages of sample {}'s policy tokens: {want:?} without them, {got:?} with them",
            s.sample_id
        );
        if let (Some(want), Some(got)) = (&plain.returns, &episode.returns) {
            let got = at(&got[j]);
            assert!(
                want[j].iter().zip(&got).all(|(a, b)| close(*a, *b)),
                "{name}: environment tokens change the returns of sample {}: {:?} without them, {got:?} with them",
                s.sample_id,
                want[j]
            );
        }
    }

    // One micro-batch of each layout: the same numbers at the policy's tokens.
    struct Layout {
        current: Vec<f32>,
        proximal: Vec<f32>,
        behaviour: Vec<f32>,
        reference: Vec<f32>,
        advantages: Vec<f32>,
        values: Vec<f32>,
        old_values: Vec<f32>,
        returns: Vec<f32>,
        mask: Vec<f32>,
        versions: Vec<areal_sdk::PolicyVersion>,
        completions: Vec<std::ops::Range<usize>>,
        /// index in the layout of the k-th policy token, over all sequences
        policy_tokens: Vec<usize>,
    }
    let layout = |groups: &[TrajectoryGroup],
                  computed: &areal_sdk_train::Advantages,
                  values: &[Vec<f32>]| {
        let mut l = Layout {
            current: Vec::new(),
            proximal: Vec::new(),
            behaviour: Vec::new(),
            reference: Vec::new(),
            advantages: Vec::new(),
            values: Vec::new(),
            old_values: Vec::new(),
            returns: Vec::new(),
            mask: Vec::new(),
            versions: Vec::new(),
            completions: Vec::new(),
            policy_tokens: Vec::new(),
        };
        let samples = groups
            .iter()
            .flat_map(|g| g.samples.iter().map(move |s| (g, s)));
        for (j, (group, sample)) in samples.enumerate() {
            let c = &sample.completion;
            for _ in &group.prompt_ids {
                let t = l.current.len();
                for v in [
                    &mut l.proximal,
                    &mut l.behaviour,
                    &mut l.reference,
                    &mut l.advantages,
                    &mut l.values,
                    &mut l.old_values,
                    &mut l.returns,
                ] {
                    v.push(0.0);
                }
                l.current.push(-0.5 + 0.1 * noise(t, 7));
                l.mask.push(0.0);
                l.versions.push(PROMPT_VERSION);
            }
            let start = l.current.len();
            let mut k = 0;
            for i in 0..c.len() {
                let t = l.current.len();
                if c.is_sampled(i) {
                    let b = c.behaviour_logprobs[i];
                    l.current.push(b + 0.4 * noise(j, 1000 + k));
                    l.proximal.push(b + 0.2 * noise(j, 2000 + k));
                    l.behaviour.push(b);
                    l.reference.push(b + 0.3 * noise(j, 3000 + k));
                    l.advantages.push(computed.advantages[j][i]);
                    l.values.push(values[j][i]);
                    l.old_values.push(values[j][i] + 0.1 * noise(j, 4000 + k));
                    l.returns.push(
                        computed
                            .returns
                            .as_ref()
                            .map_or(computed.advantages[j][i], |r| r[j][i]),
                    );
                    l.mask.push(1.0);
                    l.policy_tokens.push(t);
                    k += 1;
                } else {
                    // what a policy computes at an environment token, and what an algorithm
                    // may have left there: anything
                    l.current.push(-3.0 + 2.0 * noise(t, 11));
                    l.proximal.push(-3.0 + 2.0 * noise(t, 12));
                    l.behaviour.push(0.0);
                    l.reference.push(-3.0 + 2.0 * noise(t, 13));
                    l.advantages.push(4.0 * noise(t, 14));
                    l.values.push(4.0 * noise(t, 15));
                    l.old_values.push(4.0 * noise(t, 16));
                    l.returns.push(4.0 * noise(t, 17));
                    l.mask.push(0.0);
                }
                l.versions.push(c.versions[i]);
            }
            l.completions.push(start..l.current.len());
        }
        l
    };
    let run = |l: &Layout| {
        let device = areal_sdk_train::burn::tensor::Device::flex().autodiff();
        let n = l.current.len();
        let tensor = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [n]), &device);
        let current = tensor(&l.current).require_grad();
        let values = tensor(&l.values).require_grad();
        let input = LossInput {
            current: CurrentLogprobs(current.clone()),
            proximal: ProximalLogprobs(tensor(&l.proximal)),
            behaviour: BehaviourLogprobs(tensor(&l.behaviour)),
            advantages: tensor(&l.advantages),
            loss_mask: tensor(&l.mask),
            versions: l.versions.clone(),
            minibatch_tokens: l.policy_tokens.len(),
            minibatch_sequences: l.completions.len(),
            completions: l.completions.clone(),
            trainer_version: l
                .versions
                .iter()
                .copied()
                .filter(|&v| v != PROMPT_VERSION)
                .max()
                .unwrap_or(0),
            reference: needs
                .reference
                .then(|| ReferenceLogprobs(tensor(&l.reference))),
            critic: needs.values.then(|| CriticInput {
                values: values.clone(),
                old_values: tensor(&l.old_values),
                returns: tensor(&l.returns),
            }),
        };
        let out = algorithm
            .loss(&input)
            .unwrap_or_else(|e| panic!("{name}: loss of episodes: {e}"));
        let loss = out.loss.clone().into_scalar::<f32>();
        let grads = out.loss.backward();
        let grad = |t: &Tensor<1>| {
            t.grad(&grads).map_or_else(
                || vec![0.0; n],
                |g| {
                    g.into_data()
                        .convert::<f32>()
                        .try_to_vec::<f32>()
                        .expect("f32")
                },
            )
        };
        (loss, grad(&current), grad(&values))
    };
    let plain = layout(groups, &plain, &plain_values);
    let episode = layout(&episodes, &episode, &episode_values);
    let (loss_plain, grad_plain, value_grad_plain) = run(&plain);
    let (loss_episode, grad_episode, value_grad_episode) = run(&episode);
    assert!(
        loss_plain.is_finite() && close(loss_plain, loss_episode),
        "{name}: environment tokens change the loss: {loss_plain} without them, {loss_episode} with them"
    );
    for (t, m) in episode.mask.iter().enumerate() {
        if *m == 0.0 {
            assert!(
                grad_episode[t] == 0.0 && value_grad_episode[t] == 0.0,
                "{name}: token {t}, which no policy sampled, gets a gradient ({} on its logprob, {} on its value)",
                grad_episode[t],
                value_grad_episode[t]
            );
        }
    }
    for (k, (&p, &e)) in plain
        .policy_tokens
        .iter()
        .zip(&episode.policy_tokens)
        .enumerate()
    {
        assert!(
            close(grad_plain[p], grad_episode[e])
                && close(value_grad_plain[p], value_grad_episode[e]),
            "{name}: environment tokens change the gradient of policy token {k}: {} without them, {} with them",
            grad_plain[p],
            grad_episode[e]
        );
    }
}
