//! The task check.

use std::collections::HashSet;
use std::time::Duration;

use areal_sdk::{FinishReason, RewardInput, RewardVerifier, Split, Task, TaskItem, VerifyContext};

/// Items read from each split (the first ones, and the last of a finite split).
const SAMPLED: u64 = 64;

/// Check a task as the engine will use it:
/// - the eval split is finite and not empty; a finite train split is not empty;
/// - every item read (the first 64 of each split and the last of a finite one) has a
///   non-empty id and prompt, ids are unique within their split, and the same index gives the
///   same item twice;
/// - reading past the end of a finite split is an error, not a panic;
/// - with `verifier`, every demonstration the task gives is graded without error, with a
///   finite reward (a task and its reward must agree on the reference's format).
pub fn check_task(task: &dyn Task, verifier: Option<&dyn RewardVerifier>) {
    let name = task.name().to_owned();
    assert!(!name.is_empty(), "a task's name must not be empty");
    match task.len(Split::Eval) {
        Some(n) => assert!(n > 0, "{name}: the eval split is empty"),
        None => panic!("{name}: the eval split must be finite (len(Eval) is None)"),
    }
    assert_ne!(
        task.len(Split::Train),
        Some(0),
        "{name}: the train split is empty"
    );
    for split in [Split::Train, Split::Eval, Split::Validation] {
        for item in read_split(task, split) {
            if let Some(verifier) = verifier {
                check_demonstration(task, verifier, &item);
            }
        }
    }
}

/// The items read from `split`, checked one by one.
fn read_split(task: &dyn Task, split: Split) -> Vec<TaskItem> {
    let name = task.name();
    let what = split.as_str();
    let len = task.len(split);
    let mut indices: Vec<u64> = (0..len.map_or(SAMPLED, |n| (n as u64).min(SAMPLED))).collect();
    if let Some(n) = len
        && n as u64 > SAMPLED
    {
        indices.push(n as u64 - 1);
    }
    let mut ids = HashSet::new();
    let mut items = Vec::new();
    for index in indices {
        let item = task
            .item(split, index)
            .unwrap_or_else(|e| panic!("{name}: {what} item {index}: {e}"));
        assert!(
            !item.id.is_empty(),
            "{name}: {what} item {index} has an empty id"
        );
        assert!(
            !item.prompt.is_empty(),
            "{name}: {what} item {index} has an empty prompt"
        );
        assert!(
            ids.insert(item.id.clone()),
            "{name}: {what} id {:?} is used twice",
            item.id
        );
        let again = task
            .item(split, index)
            .unwrap_or_else(|e| panic!("{name}: {what} item {index}, read again: {e}"));
        assert_eq!(
            again, item,
            "{name}: {what} item {index} differs when read again"
        );
        items.push(item);
    }
    if let Some(n) = len {
        assert!(
            task.item(split, n as u64).is_err(),
            "{name}: {what} has {n} items, but item {n} reads without an error"
        );
    }
    items
}

/// The item's demonstration, if any, is graded without error.
fn check_demonstration(task: &dyn Task, verifier: &dyn RewardVerifier, item: &TaskItem) {
    let name = task.name();
    let demo = task
        .demonstration(item)
        .unwrap_or_else(|e| panic!("{name}: demonstration of item {}: {e}", item.id));
    let Some(demo) = demo else { return };
    let input = RewardInput {
        metadata: Default::default(),
        sample_id: 0,
        item_id: item.id.clone(),
        prompt: item.prompt.clone(),
        completion: demo.clone(),
        completion_ids: Vec::new(),
        finish_reason: FinishReason::Stop,
        reference: item.reference.clone(),
    };
    let reward = verifier
        .verify(
            &input,
            &VerifyContext::with_timeout(Duration::from_secs(60)),
        )
        .unwrap_or_else(|e| {
            panic!(
                "{name}: {} cannot grade the demonstration of item {} ({demo:?}): {e}",
                verifier.name(),
                item.id
            )
        });
    assert!(
        reward.value.is_finite(),
        "{name}: {} gave the demonstration of item {} the reward {}",
        verifier.name(),
        item.id,
        reward.value
    );
}
