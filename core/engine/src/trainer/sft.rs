//! Supervised steps on demonstrations (the warm-up's compute): the mean negative logprob of
//! the demonstration tokens, packed under the token budget.

use areal_sdk_train::burn::optim::ModuleOptimizer;
use areal_sdk_train::burn::tensor::{Tensor, TensorData};
use areal_sdk_train::{PackedBatch, Policy};

use super::batch::to_vec;
use crate::error::EngineError;
use crate::packing::pack;

/// One demonstration: prompt ids and response ids (ending with a stop token).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Example {
    /// The prompt's tokens (read, not trained on).
    pub(crate) prompt: Vec<u32>,
    /// The demonstration's tokens after the prompt.
    pub(crate) response: Vec<u32>,
    /// Which of them are trained on: the policy's turns, not the environment's text between
    /// them.
    pub(crate) trained: Vec<bool>,
}

impl Example {
    /// The tokens trained on.
    fn targets(&self) -> usize {
        self.trained.iter().filter(|&&t| t).count()
    }
}

/// The examples packed under `token_budget`: each micro-batch's members (indices into
/// `examples`) and their prompt + response sequences.
fn microbatches(examples: &[Example], token_budget: usize) -> Vec<(Vec<usize>, PackedBatch)> {
    let lengths: Vec<usize> = examples
        .iter()
        .map(|e| e.prompt.len() + e.response.len())
        .collect();
    pack(&lengths, token_budget, 1)
        .microbatches
        .into_iter()
        .map(|members| {
            let mut batch = PackedBatch::new(1.0);
            for &i in &members {
                let e = &examples[i];
                batch.push(&[e.prompt.as_slice(), &e.response].concat());
            }
            (members, batch)
        })
        .collect()
}

/// Mean negative logprob per demonstration token of `examples`, without gradient.
pub(crate) fn validation_loss(
    policy: &dyn Policy,
    examples: &[Example],
    token_budget: usize,
) -> Result<f64, EngineError> {
    let (mut sum, mut count) = (0.0f64, 0usize);
    for (members, batch) in microbatches(examples, token_budget) {
        let values = to_vec(
            policy
                .logprobs_no_grad(&batch)
                .map_err(|e| EngineError::plugin("warm-up validation pass", e))?,
        );
        for (&i, range) in members.iter().zip(batch.ranges()) {
            let e = &examples[i];
            let response = &values[range.start + e.prompt.len()..range.end];
            sum -= response
                .iter()
                .zip(&e.trained)
                .filter(|(_, t)| **t)
                .map(|(&v, _)| f64::from(v))
                .sum::<f64>();
            count += e.targets();
        }
    }
    Ok(sum / count.max(1) as f64)
}

/// One supervised step: the mean negative logprob of the demonstration tokens, packed under
/// `token_budget`; returns the loss and the number of demonstration tokens.
pub(crate) fn sft_step(
    policy: &mut dyn Policy,
    optimizer: &mut ModuleOptimizer,
    examples: &[Example],
    lr: f64,
    max_grad_norm: Option<f64>,
    token_budget: usize,
) -> Result<(f64, usize), EngineError> {
    let targets: usize = examples.iter().map(Example::targets).sum();
    let device = policy.device();
    let mut loss_sum = 0.0;
    for (members, batch) in microbatches(examples, token_budget) {
        let mut mask = Vec::new();
        for &i in &members {
            let e = &examples[i];
            mask.extend(std::iter::repeat_n(0.0f32, e.prompt.len()));
            mask.extend(e.trained.iter().map(|&t| if t { 1.0f32 } else { 0.0 }));
        }
        let n = mask.len();
        let mask = Tensor::<1>::from_data(TensorData::new(mask, [n]), &device);
        let logprobs = policy
            .logprobs(&batch)
            .map_err(|e| EngineError::plugin("warm-up forward pass", e))?;
        let loss = (logprobs * mask)
            .sum()
            .neg()
            .div_scalar(targets.max(1) as f32);
        loss_sum += f64::from(loss.clone().into_scalar::<f32>());
        policy
            .backward(loss)
            .map_err(|e| EngineError::plugin("warm-up backward pass", e))?;
    }
    policy
        .step(optimizer, lr, max_grad_norm)
        .map_err(|e| EngineError::plugin("warm-up optimizer step", e))?;
    Ok((loss_sum, targets))
}
