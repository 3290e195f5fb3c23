//! Final answers that are whole numbers after a marker (`>16` in chain-sum, `=1776` in
//! tool-mul), and their reward against an item's integer `answer`.

use areal_sdk::{PluginError, Reward, RewardInput, Verdict};

/// The number after the last `marker` of `text`, if only digits follow it (at most 18).
pub(crate) fn number_after(text: &str, marker: char) -> Option<u64> {
    let tail = text.rsplit_once(marker)?.1.trim();
    if tail.is_empty() || !tail.bytes().all(|b| b.is_ascii_digit()) || tail.len() > 18 {
        return None;
    }
    tail.parse().ok()
}

/// 1 when the number after the completion's last `marker` is the reference's `answer`, 0
/// otherwise (`no_answer` when there is none), the answer read kept as a detail; an item
/// without an integer `answer` is `verifier`'s error.
pub(crate) fn grade_number(
    verifier: &str,
    input: &RewardInput,
    marker: char,
) -> Result<Reward, PluginError> {
    let answer = input.reference["answer"].as_u64().ok_or_else(|| {
        PluginError::failed(
            verifier,
            format!("item {} has no integer `answer`", input.item_id),
        )
    })?;
    Ok(match number_after(&input.completion, marker) {
        None => Reward::new(0.0, Verdict::NoAnswer),
        Some(a) if a == answer => Reward::new(1.0, Verdict::Accepted).with_detail("answer", a),
        Some(a) => Reward::new(0.0, Verdict::WrongAnswer).with_detail("answer", a),
    })
}
