//! What the fleet checks of what servers say before the run takes it: the version of each
//! token (for answers that name at most one), that the answer is well formed and within the
//! trainer's vocabulary and of weights this run sent, and that a server's tokenizer is the
//! trainer's.

use std::sync::atomic::Ordering;

use areal_sdk::{Completion, FinishReason, GenerateRequest, PolicyVersion, Tokenizer};

use super::api::{self, CallError};
use super::{Servers, bounded};

/// What the trainer's tokenizer says of a probe text.
#[derive(Clone, Debug)]
pub(super) struct Probe {
    text: String,
    ids: Vec<u32>,
    vocab_size: usize,
}

pub(super) fn malformed(why: impl std::fmt::Display) -> CallError {
    CallError::Refused(format!("sent a malformed answer: {why}"))
}

impl Servers {
    /// The tokens of an answer that names at most one version, each with the version that
    /// sampled it; `None` when that cannot be known (the answer crossed a pause without
    /// naming its version), so the sample runs again from where it was.
    pub(super) fn versioned(
        &self,
        answer: api::GenerationAnswer,
        held: Option<PolicyVersion>,
        paused_since: bool,
    ) -> Result<Option<Completion>, CallError> {
        let (reason, why) = answer.reason;
        let finish = match reason.as_str() {
            "stop" => FinishReason::Stop,
            "length" => FinishReason::Length,
            "abort" if paused_since || self.gate.is_closed() => FinishReason::Interrupted,
            "abort" => {
                return Err(CallError::Refused(format!(
                    "aborted the sample while not paused: {}",
                    why.unwrap_or_else(|| "(no reason given)".into())
                )));
            }
            other => return Err(malformed(format!("finish reason {other:?}"))),
        };
        let reported = match answer.weight_version {
            None => None,
            Some(text) => match text.parse::<PolicyVersion>() {
                Ok(v) => Some(v),
                Err(_) => return Err(self.never_sent(&text)),
            },
        };
        let version = match (finish, reported, held) {
            // the server's own account of the weights (checked as every answer is)
            (_, Some(version), _) => version,
            // cut by the pause, before any new weights: the weights it had when it went
            (FinishReason::Interrupted, None, Some(held)) => held,
            (_, None, Some(held)) if !paused_since => held,
            (_, None, None) => return Err(api::unloaded()),
            // finished across a pause (held by the paused server, then run after the
            // update, or finished just as the pause came): which weights sampled it is not
            // known
            (_, None, Some(_)) => return Ok(None),
        };
        let mut completion = Completion::empty(finish);
        for (&id, &lp) in answer.tokens.iter().zip(&answer.logprobs) {
            completion.push(id, lp as f32, version);
        }
        Ok(Some(completion))
    }

    /// The refusal of an answer naming weight version `claimed`, which this run never sent.
    fn never_sent(&self, claimed: &str) -> CallError {
        let sent = self.current().map(|c| c.version);
        malformed(format!(
            "tokens of weight version {claimed}, which this run never sent (the newest: {})",
            sent.map_or("none yet".into(), |s| s.to_string())
        ))
    }

    /// Refuse an answer the run cannot account for: more tokens than asked for, logprobs
    /// that are no log-probabilities, ids past the trainer's vocabulary, or tokens of a
    /// version this run never sent (a server's own claim of `999999` would be trained on
    /// with a lag of 0).
    pub(super) fn account_for(
        &self,
        completion: &Completion,
        request: &GenerateRequest,
    ) -> Result<(), CallError> {
        if completion.len() > request.max_new_tokens {
            return Err(malformed(format!(
                "{} tokens for max_new_tokens {}",
                completion.len(),
                request.max_new_tokens
            )));
        }
        completion.check().map_err(malformed)?;
        let vocab = self.vocab.load(Ordering::Relaxed);
        if let Some(id) = completion
            .token_ids
            .iter()
            .find(|&&id| vocab > 0 && id as usize >= vocab)
        {
            return Err(malformed(format!(
                "token id {id} is outside the trainer's vocabulary of {vocab}"
            )));
        }
        let sent = self.current().map(|c| c.version);
        if let Some(&v) = completion.versions.iter().max()
            && sent.is_none_or(|sent| v > sent)
        {
            return Err(self.never_sent(&v.to_string()));
        }
        Ok(())
    }

    /// Check server `index`'s tokenizer against the probe; a server whose API cannot
    /// tokenize (or has no route for it) is let through.
    pub(super) async fn check_server_tokenizer(&self, index: usize) -> Result<(), CallError> {
        let Some(probe) = self.probe.lock().expect("probe lock").clone() else {
            return Ok(());
        };
        let served = bounded(self.timeouts.probe, self.api.tokenize(index, &probe.text)).await?;
        let Some(served) = served else {
            return Ok(());
        };
        if served != probe.ids {
            let at = served
                .iter()
                .zip(&probe.ids)
                .position(|(a, b)| a != b)
                .unwrap_or(served.len().min(probe.ids.len()));
            return Err(CallError::Refused(format!(
                "its tokenizer differs from the trainer's: the probe text {:?} is {} ids there and {} here, first differing at position {at} (server {:?}, trainer {:?}); serve the model the trainer trains, with its tokenizer",
                probe.text.chars().take(80).collect::<String>(),
                served.len(),
                probe.ids.len(),
                served.get(at),
                probe.ids.get(at),
            )));
        }
        if let Some(&max) = served.iter().max()
            && max as usize >= probe.vocab_size
        {
            return Err(CallError::Refused(format!(
                "its tokenizer gives id {max}, beyond the trainer's vocabulary of {}",
                probe.vocab_size
            )));
        }
        Ok(())
    }
}

/// The probe text: tokens spread over the trainer's vocabulary, decoded (so that both sides
/// encode the same text, and ids from the whole vocabulary are exercised), then encoded again
/// by the trainer.
pub(super) fn make_probe(tokenizer: &dyn Tokenizer) -> Result<Probe, String> {
    let vocab_size = tokenizer.vocab_size();
    let stop = tokenizer.stop_token_ids();
    let step = (vocab_size / 64).max(1);
    let sample: Vec<u32> = (0..vocab_size)
        .step_by(step)
        .map(|i| i as u32)
        .filter(|id| !stop.contains(id))
        .collect();
    let mut text = String::new();
    for id in sample {
        // one at a time: an id the tokenizer cannot write alone (a lone byte) is left out
        if let Ok(piece) = tokenizer.decode(&[id])
            && !piece.contains('\u{fffd}')
            && tokenizer.encode(&piece).is_ok()
        {
            text.push_str(&piece);
        }
    }
    if text.is_empty() {
        return Err("the trainer's tokenizer decodes none of its tokens to text".into());
    }
    let ids = tokenizer
        .encode(&text)
        .map_err(|e| format!("the trainer's tokenizer cannot encode its own text: {e}"))?;
    Ok(Probe {
        text,
        ids,
        vocab_size,
    })
}
