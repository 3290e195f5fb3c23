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
/// leaving prompt tokens alone.
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
        mask.extend(std::iter::repeat_n(1.0f32, a.len()));
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
        trainer_version: versions.iter().copied().max().unwrap_or(0),
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
}
