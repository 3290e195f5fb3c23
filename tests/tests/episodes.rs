//! Episodes end to end: several turns with a tool between them, across weight updates.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use areal_core::{GroupRunner, GroupSpec, RewardService};
use areal_sdk::{Generator, SamplingParams, TaskItem, Tokenizer, Tool};
use areal_testkit::{
    BigramGenerator, BigramGeneratorOptions, LetterTokenizer, Relay, RelayOptions, Shift,
    ShiftOptions, SuccessorVerifier,
};

use super::interruption::{check_behaviour_logprobs, publish, table, update};

/// The letters of `text` moved on by `by`, as `testkit-shift` answers its `by`-th call.
fn shifted(text: &str, by: u32) -> String {
    text.chars()
        .map(|c| char::from_u32('a' as u32 + (c as u32 - 'a' as u32 + by) % 8).unwrap())
        .collect()
}

/// Episodes of three turns with the tool between them, generated while the weights change
/// twice: each trained sequence is the turns as sampled with the tool's answers between them
/// (the answer to call k being the turn before it moved on by k, so each episode has its own
/// tool session), and every sampled token keeps the version and logprob it was sampled
/// with, read in the context of the environment's tokens before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn episode_tokens_are_what_was_sampled_and_appended_across_weight_updates() {
    // a turn stops after some 25 tokens
    let weights = [table(11, -1.0), table(12, -1.0), table(13, -1.0)];
    let generator = Arc::new(BigramGenerator::new(BigramGeneratorOptions {
        token_delay_us: 2000,
        jitter: 0.0,
    }));
    generator
        .update_weights(update(0, &weights[0]))
        .await
        .unwrap();
    let tokenizer: Arc<dyn Tokenizer> = Arc::new(LetterTokenizer::new(8));
    let rewards = RewardService::new(Arc::new(SuccessorVerifier), 1, Duration::from_secs(10));
    let tools: Vec<Arc<dyn Tool>> = vec![Arc::new(Shift::new(ShiftOptions::default()))];
    let runner = Arc::new(
        GroupRunner::new(generator.clone(), tokenizer.clone(), rewards)
            .with_episode(Arc::new(Relay::new(RelayOptions { turns: 3 })), tools),
    );
    let spec = GroupSpec {
        group_id: 0,
        group_size: 6,
        max_new_tokens: 400,
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            seed: 5,
        },
        admitted_at: 0,
    };
    let item = TaskItem {
        id: "c".into(),
        prompt: "c".into(),
        reference: serde_json::json!({"letters": 8, "length": 6}),
    };
    let group = {
        let runner = runner.clone();
        tokio::spawn(async move { runner.run_group(spec, item).await })
    };
    // each update once the episodes are well under way (a count of tokens, not a wait that a
    // busy machine can outlast)
    for (version, values) in weights.iter().enumerate().skip(1) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while runner.counters.generated_tokens.load(Ordering::SeqCst) < 60 * version as u64 {
            assert!(std::time::Instant::now() < deadline, "no tokens generated");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        publish(&generator, version as u64, values).await;
    }
    let group = group.await.unwrap().unwrap();
    assert_eq!(group.samples.len(), 6);
    assert!(runner.counters.interruptions.load(Ordering::SeqCst) > 0);
    assert_eq!(runner.counters.episodes.load(Ordering::SeqCst), 6);

    let (mut spanning, mut calls) = (0, 0);
    for sample in &group.samples {
        let c = &sample.completion;
        c.check_trajectory().unwrap();
        // Split into runs of sampled and of environment tokens.
        let mut runs: Vec<(bool, Vec<u32>)> = Vec::new();
        for (i, &id) in c.token_ids.iter().enumerate() {
            let sampled = c.is_sampled(i);
            match runs.last_mut() {
                Some((s, ids)) if *s == sampled => ids.push(id),
                _ => runs.push((sampled, vec![id])),
            }
        }
        assert!(runs[0].0, "an episode starts with a turn");
        let mut call = 0;
        for pair in runs.windows(2) {
            if let [(true, turn), (false, env)] = pair {
                call += 1;
                let said = tokenizer.decode(turn).unwrap();
                let expected = if said.is_empty() {
                    "a".to_owned()
                } else {
                    shifted(&said, call)
                };
                assert_eq!(tokenizer.decode(env).unwrap(), expected, "call {call}");
            }
        }
        assert!(call <= 2, "three turns, two calls between them");
        calls += call;
        // Every sampled token, in its context (environment tokens included), under the
        // weights of its version.
        check_behaviour_logprobs(&weights, 2, c);
        let sampled: Vec<u64> = c.sampled_versions().collect();
        assert!(sampled.windows(2).all(|w| w[0] <= w[1]), "{sampled:?}");
        spanning += usize::from(sampled.first() != sampled.last());
    }
    assert_eq!(
        runner.counters.tool_calls.load(Ordering::SeqCst),
        calls as u64
    );
    assert!(calls >= 6, "most episodes call the tool twice: {calls}");
    assert!(spanning > 0, "no episode spans a weight update");
}
