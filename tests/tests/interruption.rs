//! The interruption protocol: pause → new weights → resume keeps every token's version and
//! behaviour logprob.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use areal_core::{GroupRunner, RewardService};
use areal_sdk::{
    Completion, GenerateRequest, Generator, NamedTensor, PluginError, SamplingParams, Tokenizer,
    WeightUpdate,
};
use areal_sdk_train::PackedBatch;
use areal_sdk_train::burn::module::Param;
use areal_sdk_train::burn::tensor::{Device, Tensor, TensorData};
use areal_testkit::{
    BigramGenerator, BigramGeneratorOptions, BigramModel, LetterTokenizer, SuccessorVerifier, TABLE,
};

use super::{config, run_recorded};

/// A generator whose backend is always down.
pub(crate) struct Broken;

#[areal_sdk::async_trait]
impl Generator for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    async fn generate(&self, _: GenerateRequest) -> Result<Completion, PluginError> {
        Err(PluginError::failed("broken", "the model server is down"))
    }
    async fn update_weights(&self, _: WeightUpdate) -> Result<(), PluginError> {
        Ok(())
    }
}

/// The testkit generator, except that it panics on samples whose id is a multiple of
/// `every`.
pub(crate) struct Panicky {
    pub(crate) inner: BigramGenerator,
    pub(crate) every: u64,
}

#[areal_sdk::async_trait]
impl Generator for Panicky {
    fn name(&self) -> &str {
        "panicky"
    }
    async fn generate(&self, request: GenerateRequest) -> Result<Completion, PluginError> {
        assert!(
            !request.sample_id.is_multiple_of(self.every),
            "panicky panics on sample {}",
            request.sample_id
        );
        self.inner.generate(request).await
    }
    async fn update_weights(&self, update: WeightUpdate) -> Result<(), PluginError> {
        self.inner.update_weights(update).await
    }
    async fn pause(&self) -> Result<(), PluginError> {
        self.inner.pause().await
    }
    async fn resume(&self) -> Result<(), PluginError> {
        self.inner.resume().await
    }
}

/// The testkit task, except that it panics on train items whose index is a multiple of
/// `every`.
pub(crate) struct PanickyTask {
    pub(crate) inner: Arc<dyn areal_sdk::Task>,
    pub(crate) every: u64,
}

impl areal_sdk::Task for PanickyTask {
    fn name(&self) -> &str {
        "panicky-task"
    }
    fn len(&self, split: areal_sdk::Split) -> Option<usize> {
        self.inner.len(split)
    }
    fn item(
        &self,
        split: areal_sdk::Split,
        index: u64,
    ) -> Result<areal_sdk::TaskItem, PluginError> {
        assert!(
            !index.is_multiple_of(self.every),
            "panicky-task panics on item {index}"
        );
        self.inner.item(split, index)
    }
}

const VOCAB: usize = 9;

/// Random logits (the letters' spread over -2..2), the stop token's `stop`: -40 makes it
/// impossible, so samples run to their budget.
pub(crate) fn table(seed: u64, stop: f32) -> Vec<f32> {
    (0..VOCAB * VOCAB)
        .map(|i| {
            if i % VOCAB == VOCAB - 1 {
                stop
            } else {
                let x = areal_sdk::mix_seed(seed, i as u64);
                (x % 1000) as f32 / 250.0 - 2.0
            }
        })
        .collect()
}

/// What the engine does after every optimizer step, for each of `weights` after the first
/// (version 1, 2, ...), `every` apart: pause the generator, load the weights, resume.
pub(crate) async fn publish_every(
    generator: &BigramGenerator,
    weights: &[Vec<f32>],
    every: Duration,
) {
    for (version, values) in weights.iter().enumerate().skip(1) {
        tokio::time::sleep(every).await;
        publish(generator, version as u64, values).await;
    }
}

/// What the engine does after an optimizer step: pause the generator, load `values` as
/// `version`, resume.
pub(crate) async fn publish(generator: &BigramGenerator, version: u64, values: &[f32]) {
    generator.pause().await.unwrap();
    generator
        .update_weights(update(version, values))
        .await
        .unwrap();
    generator.resume().await.unwrap();
}

/// Check that every sampled token of `completion` after the one-token prompt `[prompt]` has
/// the behaviour logprob its version's weights give it in its context (environment tokens
/// included), and that environment tokens have 0; returns each version's logprobs of the
/// whole sequence.
pub(crate) fn check_behaviour_logprobs(
    weights: &[Vec<f32>],
    prompt: u32,
    completion: &Completion,
) -> Vec<Vec<f32>> {
    let mut tokens = vec![prompt];
    tokens.extend(&completion.token_ids);
    let under: Vec<Vec<f32>> = weights.iter().map(|w| logprobs(w, &tokens)).collect();
    for (t, (&v, &behaviour)) in completion
        .versions
        .iter()
        .zip(&completion.behaviour_logprobs)
        .enumerate()
    {
        if v == areal_sdk::PROMPT_VERSION {
            assert_eq!(behaviour, 0.0, "environment token {t}");
            continue;
        }
        let expected = under[v as usize][t + 1];
        assert!(
            (expected - behaviour).abs() < 1e-5,
            "token {t} (version {v}) has behaviour logprob {behaviour}, its policy gives {expected}"
        );
    }
    under
}

pub(crate) fn update(version: u64, values: &[f32]) -> WeightUpdate {
    WeightUpdate::new(
        version,
        vec![NamedTensor {
            name: TABLE.into(),
            shape: vec![VOCAB, VOCAB],
            data: values.to_vec(),
        }],
    )
}

/// Logprobs of `tokens` (prompt first) under the bigram `values`, computed by the burn model.
fn logprobs(values: &[f32], tokens: &[u32]) -> Vec<f32> {
    let device = Device::flex();
    let model = BigramModel {
        table: Param::from_tensor(Tensor::<2>::from_data(
            TensorData::new(values.to_vec(), [VOCAB, VOCAB]),
            &device,
        )),
    };
    let mut batch = PackedBatch::new(1.0);
    batch.push(tokens);
    model
        .logprobs(&batch)
        .unwrap()
        .into_data()
        .try_to_vec()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_samples_keep_each_tokens_version_and_logprob() {
    let weights = [table(1, -40.0), table(2, -40.0), table(3, -40.0)];
    let generator = Arc::new(BigramGenerator::new(BigramGeneratorOptions {
        token_delay_us: 1000,
        jitter: 0.0,
    }));
    generator
        .update_weights(update(0, &weights[0]))
        .await
        .unwrap();
    let tokenizer: Arc<dyn Tokenizer> = Arc::new(LetterTokenizer::new(8));
    let rewards = RewardService::new(Arc::new(SuccessorVerifier), 1, Duration::from_secs(10));
    let rollout = Arc::new(GroupRunner::new(generator.clone(), tokenizer, rewards));

    let sampling = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        seed: 4,
    };
    let task = {
        let rollout = rollout.clone();
        tokio::spawn(async move { rollout.generate(1, &[2], 600, &sampling).await })
    };
    publish_every(&generator, &weights, Duration::from_millis(150)).await;
    let completion = task.await.unwrap().unwrap();
    assert_eq!(completion.len(), 600);
    assert_eq!(rollout.counters.interruptions.load(Ordering::SeqCst), 2);

    let versions = &completion.versions;
    assert!(
        versions.windows(2).all(|w| w[0] <= w[1]),
        "versions go back: {versions:?}"
    );
    for v in 0..3 {
        assert!(
            versions.contains(&v),
            "no token of version {v}: {versions:?}"
        );
    }
    let under = check_behaviour_logprobs(&weights, 2, &completion);
    // The three weight sets give different logprobs, so the check above tells them apart.
    let tokens = completion.len() + 1;
    let distinct = (1..tokens)
        .filter(|&t| (under[0][t] - under[1][t]).abs() > 1e-3)
        .count();
    assert!(distinct > tokens / 2);
}

/// In an asynchronous run with slow decoding, weight updates interrupt samples, and every
/// trained sample still has non-decreasing versions starting no earlier than its admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_runs_interrupt_and_resume_samples() {
    let config = config(&[
        "rollout.max_staleness=2",
        "rollout.max_new_tokens=24",
        "train.steps=10",
        "generator.token_delay_us=300",
        "generator.jitter=0.5",
        "task.length=20",
        "eval.enabled=false",
    ]);
    let (summary, recorder) = run_recorded(config, None).await;
    summary.unwrap();
    let interrupted: u64 = recorder
        .steps
        .lock()
        .unwrap()
        .iter()
        .map(|m| m.interrupted_samples)
        .sum();
    assert!(
        interrupted > 0,
        "no sample was in flight at any of 10 weight updates"
    );
    let mut spanning = 0;
    for (version, groups) in recorder.trained.lock().unwrap().iter() {
        for group in groups {
            for s in &group.samples {
                let v = &s.completion.versions;
                assert!(v.windows(2).all(|w| w[0] <= w[1]), "{v:?}");
                assert!(
                    v.first().is_none_or(|&h| h >= group.admitted_at),
                    "{v:?} admitted at {}",
                    group.admitted_at
                );
                assert!(v.iter().all(|x| x <= version));
                spanning += usize::from(v.first() != v.last());
            }
        }
    }
    assert!(spanning > 0, "no trained sample spans a weight update");
}
