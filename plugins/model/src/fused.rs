//! Fused CPU kernels for the element-wise work of a step: SiLU·up, the causal softmax of
//! attention, and the log-probability of each next token, each with its own backward pass.
//!
//! burn's flex backend computes `exp` one libm call at a time and runs element-wise
//! operations on one thread; composed from tensor operations, a softmax or a SiLU is several
//! passes over memory forward and several more backward, `exp` recomputed in each. Here each
//! is one pass each way, over rows in parallel, with an `exp` the compiler vectorises
//! (`docs/benchmarks.md` has what it gained).
//!
//! The kernels are a burn backend extension ([`FusedOps`]) on the flex backend and on
//! autodiff over it; on any other device (CUDA) the model composes burn's own operations
//! instead ([`Fused::on`]).

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, DispatchDevice, Flex, backend_extension};
use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

/// Rows per parallel task: enough work to pay for a task, small enough to share out.
const ROWS_PER_TASK: usize = 16;

/// `e^x` to within 2 ulp (Cephes' `expf`: the rounding of `x / ln 2` and a degree-6
/// polynomial on the remainder), in operations the compiler vectorises. Below −87.3 the result
/// is the smallest normal float instead of a subnormal or 0, above 88 it is e^88; the kernels
/// only take it of `x − max ≤ 0`.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds to an integer in the low bits
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^n as a float's exponent bits
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    e * scale
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// The f32 values of a flex tensor (made contiguous) and its shape.
fn values(t: &FlexTensor) -> (FlexTensor, Vec<usize>) {
    let t = t.to_contiguous();
    let shape = t.layout().shape().to_vec();
    (t, shape)
}

fn tensor(values: Vec<f32>, shape: Vec<usize>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// Fused operations of the model: kernels on the flex backend, and their backward passes on
/// autodiff over it. (On other backends [`Fused`] composes burn's operations instead.)
#[backend_extension(Flex, Autodiff)]
pub trait FusedOps: Backend {
    /// `silu(gate) · up`, element by element (the same shapes).
    fn silu_mul(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The gradients of [`FusedOps::silu_mul`] for `gate` and `up`, given the output's.
    fn silu_mul_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// Softmax over the last axis of `scores: [..., q, k]` where query `i` sees keys up to
    /// `i + k − q` (causal attention, queries at the end of the keys); the rest are 0.
    fn causal_softmax(scores: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The gradient of [`FusedOps::causal_softmax`] from its output `probs` and the output's
    /// gradient.
    fn causal_softmax_backward(
        probs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `log softmax(logits)[target]` of each row of `logits: [rows, vocab]`: `[rows]`.
    fn token_logprobs(logits: FloatTensor<Self>, targets: Vec<u32>) -> FloatTensor<Self>;

    /// The gradient of [`FusedOps::token_logprobs`] for `logits`, given the output's `[rows]`.
    fn token_logprobs_backward(
        logits: FloatTensor<Self>,
        targets: Vec<u32>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

impl FusedOps for Flex {
    fn silu_mul(gate: FlexTensor, up: FlexTensor) -> FlexTensor {
        let ((gate, shape), (up, up_shape)) = (values(&gate), values(&up));
        assert_eq!(shape, up_shape, "silu_mul of differently shaped tensors");
        let (g, u) = (gate.storage::<f32>(), up.storage::<f32>());
        let mut out = vec![0.0f32; g.len()];
        out.par_chunks_mut(4096)
            .zip(g.par_chunks(4096).zip(u.par_chunks(4096)))
            .for_each(|(o, (g, u))| {
                for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                    *o = g * sigmoid(g) * u;
                }
            });
        tensor(out, shape)
    }

    fn silu_mul_backward(
        gate: FlexTensor,
        up: FlexTensor,
        grad: FlexTensor,
    ) -> (FlexTensor, FlexTensor) {
        let ((gate, shape), (up, _), (grad, _)) = (values(&gate), values(&up), values(&grad));
        let (g, u, d) = (
            gate.storage::<f32>(),
            up.storage::<f32>(),
            grad.storage::<f32>(),
        );
        let mut dg = vec![0.0f32; g.len()];
        let mut du = vec![0.0f32; g.len()];
        dg.par_chunks_mut(4096)
            .zip(du.par_chunks_mut(4096))
            .zip(
                g.par_chunks(4096)
                    .zip(u.par_chunks(4096))
                    .zip(d.par_chunks(4096)),
            )
            .for_each(|((dg, du), ((g, u), d))| {
                for i in 0..g.len() {
                    let s = sigmoid(g[i]);
                    let silu = g[i] * s;
                    du[i] = d[i] * silu;
                    dg[i] = d[i] * u[i] * (s + silu * (1.0 - s));
                }
            });
        (tensor(dg, shape.clone()), tensor(du, shape))
    }

    fn causal_softmax(scores: FlexTensor) -> FlexTensor {
        let (scores, shape) = values(&scores);
        let (q, k) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        assert!(q <= k, "causal softmax of {q} queries over {k} keys");
        let x = scores.storage::<f32>();
        let mut out = vec![0.0f32; x.len()];
        out.par_chunks_mut(k * ROWS_PER_TASK)
            .zip(x.par_chunks(k * ROWS_PER_TASK))
            .enumerate()
            .for_each(|(task, (o, x))| {
                for (r, (o, x)) in o.chunks_mut(k).zip(x.chunks(k)).enumerate() {
                    let i = (task * ROWS_PER_TASK + r) % q;
                    let seen = (i + k - q + 1).min(k);
                    let (o, x) = (&mut o[..seen], &x[..seen]);
                    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0.0;
                    for (o, &x) in o.iter_mut().zip(x) {
                        *o = exp(x - max);
                        sum += *o;
                    }
                    let inv = 1.0 / sum;
                    o.iter_mut().for_each(|o| *o *= inv);
                }
            });
        tensor(out, shape)
    }

    fn causal_softmax_backward(probs: FlexTensor, grad: FlexTensor) -> FlexTensor {
        let ((probs, shape), (grad, _)) = (values(&probs), values(&grad));
        let k = shape[shape.len() - 1];
        let (p, g) = (probs.storage::<f32>(), grad.storage::<f32>());
        let mut out = vec![0.0f32; p.len()];
        // d scores = p · (d probs − Σ p · d probs); masked entries have p = 0
        out.par_chunks_mut(k * ROWS_PER_TASK)
            .zip(
                p.par_chunks(k * ROWS_PER_TASK)
                    .zip(g.par_chunks(k * ROWS_PER_TASK)),
            )
            .for_each(|(o, (p, g))| {
                for ((o, p), g) in o.chunks_mut(k).zip(p.chunks(k)).zip(g.chunks(k)) {
                    let dot: f32 = p.iter().zip(g).map(|(p, g)| p * g).sum();
                    for ((o, &p), &g) in o.iter_mut().zip(p).zip(g) {
                        *o = p * (g - dot);
                    }
                }
            });
        tensor(out, shape)
    }

    fn token_logprobs(logits: FlexTensor, targets: Vec<u32>) -> FlexTensor {
        let (logits, shape) = values(&logits);
        let v = shape[1];
        assert_eq!(targets.len(), shape[0], "a target per row");
        assert!(
            targets.iter().all(|&t| (t as usize) < v),
            "targets inside the vocabulary"
        );
        let x = logits.storage::<f32>();
        let out: Vec<f32> = x
            .par_chunks(v)
            .zip(targets.par_iter())
            .map(|(row, &target)| row[target as usize] - log_sum_exp(row))
            .collect();
        tensor(out, vec![shape[0]])
    }

    fn token_logprobs_backward(
        logits: FlexTensor,
        targets: Vec<u32>,
        grad: FlexTensor,
    ) -> FlexTensor {
        let ((logits, shape), (grad, _)) = (values(&logits), values(&grad));
        let v = shape[1];
        let (x, g) = (logits.storage::<f32>(), grad.storage::<f32>());
        let mut out = vec![0.0f32; x.len()];
        // d logits = d out · (one-hot(target) − softmax(logits))
        out.par_chunks_mut(v)
            .zip(x.par_chunks(v))
            .zip(targets.par_iter().zip(g.par_iter()))
            .for_each(|((o, row), (&target, &g))| {
                let lse = log_sum_exp(row);
                for (o, &x) in o.iter_mut().zip(row) {
                    *o = -g * exp(x - lse);
                }
                o[target as usize] += g;
            });
        tensor(out, shape)
    }
}

/// `log Σ e^x` of a row, shifted by its maximum.
fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = row.iter().map(|&x| exp(x - max)).sum();
    max + sum.ln()
}

/// The operations' backward steps on autodiff.
#[derive(Debug)]
struct SiluMul;
#[derive(Debug)]
struct CausalSoftmax;
#[derive(Debug)]
struct TokenLogprobs;

impl<B: Backend + FusedOps> Backward<B, 2> for SiluMul {
    type State = (NodeId, NodeId);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let (gate, up) = ops.state;
        let gate: FloatTensor<B> = checkpointer.retrieve_node_output(gate);
        let up: FloatTensor<B> = checkpointer.retrieve_node_output(up);
        let grad = grads.consume::<B>(&ops.node);
        let (d_gate, d_up) = B::silu_mul_backward(gate, up, grad);
        let [gate_node, up_node] = ops.parents;
        if let Some(node) = gate_node {
            grads.register::<B>(node.id, d_gate);
        }
        if let Some(node) = up_node {
            grads.register::<B>(node.id, d_up);
        }
    }
}

impl<B: Backend + FusedOps> Backward<B, 1> for CausalSoftmax {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::causal_softmax_backward(ops.state, grad));
        }
    }
}

impl<B: Backend + FusedOps> Backward<B, 1> for TokenLogprobs {
    type State = (NodeId, Vec<u32>);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let (logits, targets) = ops.state;
        let logits: FloatTensor<B> = checkpointer.retrieve_node_output(logits);
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::token_logprobs_backward(logits, targets, grad));
        }
    }
}

impl<B: Backend + FusedOps, C: CheckpointStrategy> FusedOps for Autodiff<B, C> {
    fn silu_mul(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        match SiluMul
            .prepare::<C>([gate.node(), up.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&gate), prep.checkpoint(&up));
                prep.finish(
                    state,
                    B::silu_mul(gate.into_primitive(), up.into_primitive()),
                )
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::silu_mul(gate.into_primitive(), up.into_primitive()))
            }
        }
    }

    fn silu_mul_backward(
        _: FloatTensor<Self>,
        _: FloatTensor<Self>,
        _: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        unreachable!("backward passes run on the inner backend")
    }

    fn causal_softmax(scores: FloatTensor<Self>) -> FloatTensor<Self> {
        match CausalSoftmax
            .prepare::<C>([scores.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let probs = B::causal_softmax(scores.into_primitive());
                prep.finish(probs.clone(), probs)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::causal_softmax(scores.into_primitive())),
        }
    }

    fn causal_softmax_backward(_: FloatTensor<Self>, _: FloatTensor<Self>) -> FloatTensor<Self> {
        unreachable!("backward passes run on the inner backend")
    }

    fn token_logprobs(logits: FloatTensor<Self>, targets: Vec<u32>) -> FloatTensor<Self> {
        match TokenLogprobs
            .prepare::<C>([logits.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&logits), targets.clone());
                prep.finish(state, B::token_logprobs(logits.into_primitive(), targets))
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::token_logprobs(logits.into_primitive(), targets))
            }
        }
    }

    fn token_logprobs_backward(
        _: FloatTensor<Self>,
        _: Vec<u32>,
        _: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        unreachable!("backward passes run on the inner backend")
    }
}

/// Whether a device runs the fused kernels: flex, with or without autodiff.
#[derive(Clone, Copy, Debug)]
pub struct Fused(bool);

impl Fused {
    /// For tensors on `device`.
    pub fn on(device: &Device) -> Self {
        let flex = matches!(
            device.clone().without_autodiff().as_dispatch(),
            DispatchDevice::Flex(_)
        );
        Self(flex)
    }

    /// `silu(gate) · up`.
    pub fn silu_mul<const D: usize>(self, gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
        if self.0 {
            Tensor::from_dispatch(<Dispatch as FusedOps>::silu_mul(
                gate.into_dispatch(),
                up.into_dispatch(),
            ))
        } else {
            burn::tensor::activation::silu(gate) * up
        }
    }

    /// Causal softmax of attention scores `[b, h, q, k]` (queries at the end of the keys).
    pub fn causal_softmax(self, scores: Tensor<4>) -> Tensor<4> {
        if self.0 {
            Tensor::from_dispatch(<Dispatch as FusedOps>::causal_softmax(
                scores.into_dispatch(),
            ))
        } else {
            let [b, h, q, k] = scores.dims();
            let device = scores.device();
            let mask: Vec<bool> = (0..q)
                .flat_map(|i| (0..k).map(move |j| j > i + k - q))
                .collect();
            let mask =
                Tensor::<2, burn::tensor::Bool>::from_data(TensorData::new(mask, [q, k]), &device)
                    .unsqueeze::<4>()
                    .expand([b, h, q, k]);
            burn::tensor::activation::softmax(scores.mask_fill(mask, f32::NEG_INFINITY), 3)
        }
    }

    /// `log softmax(logits)[target]` of each row of `logits: [rows, vocab]`.
    pub fn token_logprobs(self, logits: Tensor<2>, targets: Vec<u32>) -> Tensor<1> {
        if self.0 {
            Tensor::from_dispatch(<Dispatch as FusedOps>::token_logprobs(
                logits.into_dispatch(),
                targets,
            ))
        } else {
            let [rows, _] = logits.dims();
            let device = logits.device();
            let ids: Vec<i64> = targets.iter().map(|&t| i64::from(t)).collect();
            let ids =
                Tensor::<2, burn::tensor::Int>::from_data(TensorData::new(ids, [rows, 1]), &device);
            burn::tensor::activation::log_softmax(logits, 1)
                .gather(1, ids)
                .reshape([rows])
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor};

    use super::*;

    fn close(a: Tensor<1>, b: Tensor<1>, what: &str) {
        let (a, b) = (
            a.into_data().try_to_vec::<f32>().unwrap(),
            b.into_data().try_to_vec::<f32>().unwrap(),
        );
        assert_eq!(a.len(), b.len());
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0.0f32, f32::max);
        assert!(worst < 2e-6, "{what}: differs by {worst:e}");
    }

    #[test]
    fn exp_is_within_two_ulp_of_libm() {
        for i in -8700..8800 {
            let x = i as f32 / 100.0 + 0.003;
            let (got, want) = (exp(x), x.exp());
            let ulp = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulp <= 2, "exp({x}) = {got}, libm {want}: {ulp} ulp");
        }
    }

    /// Each fused operation gives the values and the gradients of burn's composition.
    #[test]
    fn fused_operations_match_burns_composition_forward_and_backward() {
        let device = Device::flex().autodiff();
        let fused = Fused::on(&device);
        assert!(fused.0);
        let composed = Fused(false);
        let random = |shape: [usize; 4], seed: u64| {
            device.seed(seed);
            Tensor::<4>::random(shape, Distribution::Normal(0.0, 2.0), &device).require_grad()
        };
        let flat = |t: Tensor<4>| t.flatten::<1>(0, 3);

        // SiLU·up
        let (gate, up) = (random([2, 3, 5, 7], 1), random([2, 3, 5, 7], 2));
        let weight = random([2, 3, 5, 7], 3).detach();
        let run = |f: Fused| {
            let out = f.silu_mul(gate.clone(), up.clone());
            let values = flat(out.clone().detach());
            let grads = (out * weight.clone()).sum().backward();
            (
                values,
                flat(gate.grad(&grads).unwrap()),
                flat(up.grad(&grads).unwrap()),
            )
        };
        let (a, b) = (run(fused), run(composed));
        close(a.0, b.0, "silu_mul");
        close(a.1, b.1, "silu_mul: gate gradient");
        close(a.2, b.2, "silu_mul: up gradient");

        // causal softmax, queries at the end of longer keys as well
        for (q, k) in [(6, 6), (3, 8)] {
            let scores = random([2, 3, q, k], 4);
            let weight = random([2, 3, q, k], 5).detach();
            let run = |f: Fused| {
                let out = f.causal_softmax(scores.clone());
                let values = flat(out.clone().detach());
                let grads = (out * weight.clone()).sum().backward();
                (values, flat(scores.grad(&grads).unwrap()))
            };
            let (a, b) = (run(fused), run(composed));
            close(a.0, b.0, "causal_softmax");
            close(a.1, b.1, "causal_softmax: gradient");
        }

        // next-token logprobs
        device.seed(6);
        let logits =
            Tensor::<2>::random([6, 50], Distribution::Normal(0.0, 2.0), &device).require_grad();
        let targets = vec![0, 49, 7, 7, 23, 1];
        let weight = Tensor::<1>::random([6], Distribution::Normal(0.0, 1.0), &device);
        let run = |f: Fused| {
            let out = f.token_logprobs(logits.clone(), targets.clone());
            let values = out.clone().detach();
            let grads = (out * weight.clone()).sum().backward();
            let grad = logits.grad(&grads).unwrap();
            (values, grad.flatten::<1>(0, 1))
        };
        let (a, b) = (run(fused), run(composed));
        close(a.0, b.0, "token_logprobs");
        close(a.1, b.1, "token_logprobs: gradient");
    }
}
