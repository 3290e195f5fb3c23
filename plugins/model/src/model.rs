//! The transformer: embedding, decoder layers (RMSNorm, rotary attention with grouped
//! key/value heads, SwiGLU), final norm and output projection. Field names follow Hugging
//! Face's Qwen2/Llama modules, so parameter paths map one to one onto checkpoint names.

use burn::module::{Module, Param};
use burn::nn::{Dropout, Embedding, Linear, RmsNorm};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::config::{Llama3Scaling, ModelConfig};
use crate::fused::Fused;

/// Standard deviation of the initial weights (Hugging Face's `initializer_range`).
pub const INIT_STD: f32 = 0.02;

/// Self-attention with rotary position embeddings and grouped key/value heads.
#[derive(Module, Debug)]
pub struct Attention {
    /// Query projection.
    pub q_proj: Proj,
    /// Key projection.
    pub k_proj: Proj,
    /// Value projection.
    pub v_proj: Proj,
    /// Output projection.
    pub o_proj: Proj,
    /// RMSNorm of each query head before RoPE (Qwen3).
    pub q_norm: Option<RmsNorm>,
    /// RMSNorm of each key head before RoPE (Qwen3).
    pub k_norm: Option<RmsNorm>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rope_theta: f64,
    // `llama3` RoPE scaling; a factor of 0 is none
    rope_factor: f64,
    rope_low_freq_factor: f64,
    rope_high_freq_factor: f64,
    rope_original_max: f64,
}

/// How positions turn into rotations: the head width, the base and any scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Width of one head.
    pub head_dim: usize,
    /// The base (`rope_theta`).
    pub theta: f64,
    /// `rope_scaling` of type `llama3`, if any.
    pub llama3: Option<Llama3Scaling>,
}

impl Rope {
    /// The rotation speed of each of the `head_dim / 2` pairs.
    pub fn inv_freq(&self) -> Vec<f64> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let f = 1.0 / self.theta.powf(2.0 * i as f64 / self.head_dim as f64);
                match &self.llama3 {
                    None => f,
                    Some(s) => {
                        let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
                        let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen > low_wavelen {
                            f / s.factor
                        } else if wavelen < high_wavelen {
                            f
                        } else {
                            let smooth = (s.original_max_position_embeddings / wavelen
                                - s.low_freq_factor)
                                / (s.high_freq_factor - s.low_freq_factor);
                            (1.0 - smooth) * f / s.factor + smooth * f
                        }
                    }
                }
            })
            .collect()
    }
}

/// The SwiGLU feed-forward block: `down(silu(gate(x)) · up(x))`.
#[derive(Module, Debug)]
pub struct Mlp {
    /// Gate projection.
    pub gate_proj: Proj,
    /// Up projection.
    pub up_proj: Proj,
    /// Down projection.
    pub down_proj: Proj,
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    /// Attention block.
    pub self_attn: Attention,
    /// Feed-forward block.
    pub mlp: Mlp,
    /// Norm before attention.
    pub input_layernorm: RmsNorm,
    /// Norm before the feed-forward block.
    pub post_attention_layernorm: RmsNorm,
}

/// A decoder-only transformer language model.
#[derive(Module, Debug)]
pub struct Transformer {
    /// Token embedding `[vocab, hidden]`.
    pub embed_tokens: Embedding,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer>,
    /// Final norm.
    pub norm: RmsNorm,
    /// Output projection; `None` when tied to the embedding.
    pub lm_head: Option<Linear>,
    /// Value head `[hidden, 1]` on the final hidden state, for algorithms with a critic;
    /// `None` otherwise. Not part of the exported (Hugging Face) weights.
    pub value_head: Option<Linear>,
}

/// Keys and values of one layer for every cached position: `[batch, kv_heads, len, head_dim]`.
#[derive(Clone, Debug)]
pub struct LayerKv {
    /// Keys (after RoPE).
    pub k: Tensor<4>,
    /// Values.
    pub v: Tensor<4>,
}

/// Write `values` into `slot` at `ranges`, in place when nothing else holds the tensor.
fn write(slot: &mut Tensor<4>, ranges: [std::ops::Range<usize>; 4], values: Tensor<4>) {
    let empty = Tensor::<4>::zeros([0, 0, 0, 0], &slot.device());
    let tensor = std::mem::replace(slot, empty);
    *slot = tensor.slice_assign(ranges, values);
}

impl LayerKv {
    /// Store keys `k` and values `v` at `ranges` (in place when nothing else holds the cache).
    pub fn write(&mut self, ranges: [std::ops::Range<usize>; 4], k: Tensor<4>, v: Tensor<4>) {
        write(&mut self.k, ranges.clone(), k);
        write(&mut self.v, ranges, v);
    }

    /// These keys and values (of a prefix, as `forward_with_kv` gives them) at the start of a
    /// cache of `capacity` positions, for `decode_step` to go on from.
    pub fn with_capacity(self, capacity: usize) -> Self {
        let [b, h, t, d] = self.k.dims();
        assert!(
            t <= capacity,
            "a prefix of {t} positions in a cache of {capacity}"
        );
        let device = self.k.device();
        let mut cache = Self {
            k: Tensor::zeros([b, h, capacity, d], &device),
            v: Tensor::zeros([b, h, capacity, d], &device),
        };
        cache.write([0..b, 0..h, 0..t, 0..d], self.k, self.v);
        cache
    }
}

/// A projection `x·W (+ b)` (PyTorch's `nn.Linear`, the weight kept `[in, out]`), with a
/// low-rank adapter beside it when LoRA is on: `+ scale · (dropout(x)·A)·B`.
#[derive(Module, Debug)]
pub struct Proj {
    /// `[in, out]`.
    pub weight: Param<Tensor<2>>,
    /// `[out]`, if the projection has one.
    pub bias: Option<Param<Tensor<1>>>,
    /// The adapter, when LoRA is on.
    pub lora: Option<Lora>,
}

/// A low-rank adapter of a projection: `scale · (dropout(x)·A)·B`.
#[derive(Module, Debug)]
pub struct Lora {
    /// `[in, rank]`: PEFT's `lora_A.weight` transposed.
    pub a: Param<Tensor<2>>,
    /// `[rank, out]`: PEFT's `lora_B.weight` transposed.
    pub b: Param<Tensor<2>>,
    /// Dropout on the adapter's input (training only).
    pub dropout: Dropout,
    /// `alpha / rank` (`alpha / √rank` with rsLoRA).
    pub scale: f64,
}

impl Proj {
    /// A projection without an adapter.
    pub fn new(weight: Tensor<2>, bias: Option<Tensor<1>>) -> Self {
        Self {
            weight: Param::from_tensor(weight),
            bias: bias.map(Param::from_tensor),
            lora: None,
        }
    }

    /// `x: [n, in]` → `[n, out]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let bias = self.bias.as_ref().map(Param::val);
        match &self.lora {
            None => burn::tensor::module::linear(x, self.weight.val(), bias),
            Some(lora) => {
                let base = burn::tensor::module::linear(x.clone(), self.weight.val(), bias);
                let low = lora.dropout.forward(x).matmul(lora.a.val());
                base + low.matmul(lora.b.val()).mul_scalar(lora.scale)
            }
        }
    }

    /// The weight with the adapter folded in, `W + scale · A·B` (`W` without one).
    pub fn merged_weight(&self) -> Tensor<2> {
        match &self.lora {
            None => self.weight.val(),
            Some(lora) => {
                self.weight.val() + lora.a.val().matmul(lora.b.val()).mul_scalar(lora.scale)
            }
        }
    }
}

/// `layer` applied to every position of `x: [b, t, d_in]`, as one `[b·t, d_in]` product.
///
/// burn's `Linear` on a rank-3 input runs as a batched product against the broadcast weight;
/// under autodiff its weight gradient is then one product per batch row and a reduction over
/// them, which made the backward pass of every projection three times its forward (a 256→688
/// projection of 8 × 128 positions: 12 ms, against 2 ms for each plain product). Folding the
/// positions into rows first gives one product each way (`docs/benchmarks.md`).
fn dense(layer: &impl Dense, x: Tensor<3>) -> Tensor<3> {
    let [b, t, d] = x.dims();
    let y = layer.apply(x.reshape([b * t, d]));
    let out = y.dims()[1];
    y.reshape([b, t, out])
}

/// A layer applied to rows `[n, in]`.
trait Dense {
    fn apply(&self, x: Tensor<2>) -> Tensor<2>;
}

impl Dense for Linear {
    fn apply(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward(x)
    }
}

impl Dense for Proj {
    fn apply(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward(x)
    }
}

/// Normal(0, std) values from `rng`.
fn normal(rng: &mut StdRng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
            let u2: f64 = rng.random::<f64>();
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32 * std
        })
        .collect()
}

fn linear(rng: &mut StdRng, d_in: usize, d_out: usize, bias: bool, device: &Device) -> Linear {
    let w = Tensor::<2>::from_data(
        TensorData::new(normal(rng, d_in * d_out, INIT_STD), [d_in, d_out]),
        device,
    );
    Linear {
        weight: Param::from_tensor(w),
        bias: bias.then(|| Param::from_tensor(Tensor::<1>::zeros([d_out], device))),
    }
}

fn proj(rng: &mut StdRng, d_in: usize, d_out: usize, bias: bool, device: &Device) -> Proj {
    let Linear { weight, bias } = linear(rng, d_in, d_out, bias, device);
    Proj {
        weight,
        bias,
        lora: None,
    }
}

fn rms_norm(d: usize, eps: f64, device: &Device) -> RmsNorm {
    RmsNorm {
        gamma: Param::from_tensor(Tensor::<1>::ones([d], device)),
        epsilon: eps,
    }
}

/// `cos` and `sin` tables `[positions, head_dim]` for rotate-half RoPE (Hugging Face layout:
/// the frequency of pair `i` sits at columns `i` and `i + head_dim/2`).
pub fn rope_tables(positions: &[usize], rope: &Rope, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let head_dim = rope.head_dim;
    let inv_freq = rope.inv_freq();
    let mut cos = Vec::with_capacity(positions.len() * head_dim);
    let mut sin = Vec::with_capacity(positions.len() * head_dim);
    for &p in positions {
        for _ in 0..2 {
            for f in &inv_freq {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
    }
    let shape = [positions.len(), head_dim];
    (
        Tensor::from_data(TensorData::new(cos, shape), device),
        Tensor::from_data(TensorData::new(sin, shape), device),
    )
}

/// Apply RoPE to `x: [batch, heads, seq, head_dim]` with tables broadcast as
/// `[batch or 1, 1, seq, head_dim]`.
fn apply_rope(x: Tensor<4>, cos: Tensor<4>, sin: Tensor<4>) -> Tensor<4> {
    let [_, _, _, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().narrow(3, 0, half);
    let x2 = x.clone().narrow(3, half, half);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
    x * cos + rotated * sin
}

impl Attention {
    /// An attention block from its projections (and per-head query/key norms, for Qwen3),
    /// shaped by `config`, which must pass [`ModelConfig::check`].
    pub fn new(
        q_proj: Proj,
        k_proj: Proj,
        v_proj: Proj,
        o_proj: Proj,
        qk_norms: Option<(RmsNorm, RmsNorm)>,
        config: &ModelConfig,
    ) -> Self {
        let scaling = config.llama3_scaling().ok().flatten();
        let (q_norm, k_norm) = qk_norms.unzip();
        Self {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm,
            k_norm,
            heads: config.num_attention_heads,
            kv_heads: config.kv_heads(),
            head_dim: config.head_dim(),
            rope_theta: config.rope_theta,
            rope_factor: scaling.map_or(0.0, |s| s.factor),
            rope_low_freq_factor: scaling.map_or(0.0, |s| s.low_freq_factor),
            rope_high_freq_factor: scaling.map_or(0.0, |s| s.high_freq_factor),
            rope_original_max: scaling.map_or(0.0, |s| s.original_max_position_embeddings),
        }
    }

    /// Its rotary embedding.
    pub fn rope(&self) -> Rope {
        Rope {
            head_dim: self.head_dim,
            theta: self.rope_theta,
            llama3: (self.rope_factor > 0.0).then_some(Llama3Scaling {
                factor: self.rope_factor,
                low_freq_factor: self.rope_low_freq_factor,
                high_freq_factor: self.rope_high_freq_factor,
                original_max_position_embeddings: self.rope_original_max,
            }),
        }
    }

    /// Queries, keys and values of `x: [b, t, hidden]` with RoPE applied (tables
    /// `[b or 1, 1, t, head_dim]`): q `[b, heads, t, hd]`, k and v `[b, kv_heads, t, hd]`.
    fn project(
        &self,
        x: Tensor<3>,
        cos: Tensor<4>,
        sin: Tensor<4>,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, t, _] = x.dims();
        let split =
            |y: Tensor<3>, heads: usize| y.reshape([b, t, heads, self.head_dim]).swap_dims(1, 2);
        let mut q = split(dense(&self.q_proj, x.clone()), self.heads);
        let mut k = split(dense(&self.k_proj, x.clone()), self.kv_heads);
        let v = split(dense(&self.v_proj, x), self.kv_heads);
        if let Some(norm) = &self.q_norm {
            q = norm.forward(q);
        }
        if let Some(norm) = &self.k_norm {
            k = norm.forward(k);
        }
        (
            apply_rope(q, cos.clone(), sin.clone()),
            apply_rope(k, cos, sin),
            v,
        )
    }

    /// Attend from `q` to `k`/`v` (grouped heads repeated), then project out to `[b, t, hidden]`.
    fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        mask: Option<Tensor<4, Bool>>,
        causal: bool,
    ) -> Tensor<3> {
        let [b, _, t, _] = q.dims();
        let repeat = self.heads / self.kv_heads;
        let (k, v) = if repeat > 1 {
            // each key/value head serves `repeat` consecutive query heads (concatenation is
            // much faster than repeat_dim on burn's CPU backend)
            let expand = |x: Tensor<4>| {
                let [b, h, l, d] = x.dims();
                let x = x.unsqueeze_dim::<5>(2);
                Tensor::cat(vec![x; repeat], 2).reshape([b, h * repeat, l, d])
            };
            (expand(k), expand(v))
        } else {
            (k, v)
        };
        let out = if causal && mask.is_none() {
            // softmax((q · kᵀ) / √d) · v with the causal mask inside the fused softmax
            let scale = 1.0 / (self.head_dim as f64).sqrt();
            let scores = (q * scale).matmul(k.swap_dims(2, 3));
            Fused::on(&scores.device()).causal_softmax(scores).matmul(v)
        } else {
            let options = AttentionModuleOptions {
                scale: None,
                softcap: None,
                is_causal: causal,
            };
            attention(q, k, v, mask, None, options)
        };
        dense(
            &self.o_proj,
            out.swap_dims(1, 2)
                .reshape([b, t, self.heads * self.head_dim]),
        )
    }
}

impl Mlp {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let fused = Fused::on(&x.device());
        dense(
            &self.down_proj,
            fused.silu_mul(dense(&self.gate_proj, x.clone()), dense(&self.up_proj, x)),
        )
    }
}

impl Transformer {
    /// A freshly initialised model (weights N(0, 0.02), norms 1, biases 0) drawn from `seed`.
    pub fn new(config: &ModelConfig, seed: u64, device: &Device) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let (d, f, v) = (
            config.hidden_size,
            config.intermediate_size,
            config.vocab_size,
        );
        let hd = config.head_dim();
        let kv = config.kv_heads() * hd;
        let q = config.num_attention_heads * hd;
        let eps = config.rms_norm_eps;
        let embed = Tensor::<2>::from_data(
            TensorData::new(normal(&mut rng, v * d, INIT_STD), [v, d]),
            device,
        );
        let layers = (0..config.num_hidden_layers)
            .map(|_| DecoderLayer {
                self_attn: Attention::new(
                    proj(&mut rng, d, q, config.qkv_bias(), device),
                    proj(&mut rng, d, kv, config.qkv_bias(), device),
                    proj(&mut rng, d, kv, config.qkv_bias(), device),
                    proj(&mut rng, q, d, false, device),
                    config
                        .qk_norm()
                        .then(|| (rms_norm(hd, eps, device), rms_norm(hd, eps, device))),
                    config,
                ),
                mlp: Mlp {
                    gate_proj: proj(&mut rng, d, f, false, device),
                    up_proj: proj(&mut rng, d, f, false, device),
                    down_proj: proj(&mut rng, f, d, false, device),
                },
                input_layernorm: rms_norm(d, config.rms_norm_eps, device),
                post_attention_layernorm: rms_norm(d, config.rms_norm_eps, device),
            })
            .collect();
        Self {
            embed_tokens: Embedding {
                weight: Param::from_tensor(embed),
            },
            layers,
            norm: rms_norm(d, config.rms_norm_eps, device),
            lm_head: (!config.tie_word_embeddings).then(|| linear(&mut rng, d, v, false, device)),
            value_head: None,
        }
    }

    /// Add a value head drawn from `seed` (N(0, 0.02) weights, zero bias): the critic shares
    /// the trunk. A model that has one keeps it.
    pub fn with_value_head(mut self, seed: u64) -> Self {
        if self.value_head.is_none() {
            let d = self.norm.gamma.val().dims()[0];
            let device = self.norm.gamma.val().device();
            let mut rng = StdRng::seed_from_u64(seed);
            self.value_head = Some(linear(&mut rng, d, 1, true, &device));
        }
        self
    }

    /// Values `[b, t]` of `tokens: [b, t]` read causally: entry `t` is the value head on the
    /// final hidden state at `t`. `None` without a value head.
    pub fn values(&self, tokens: Tensor<2, Int>) -> Option<Tensor<2>> {
        let head = self.value_head.as_ref()?;
        let [b, t] = tokens.dims();
        let x = self.norm.forward(self.hidden(tokens));
        Some(dense(head, x).reshape([b, t]))
    }

    fn rope(&self) -> Rope {
        self.layers[0].self_attn.rope()
    }

    /// Hidden states to logits.
    fn logits(&self, x: Tensor<3>) -> Tensor<3> {
        let x = self.norm.forward(x);
        match &self.lm_head {
            Some(head) => dense(head, x),
            None => {
                let [b, t, d] = x.dims();
                let weight = self.embed_tokens.weight.val();
                let vocab = weight.dims()[0];
                burn::tensor::module::linear(x.reshape([b * t, d]), weight.transpose(), None)
                    .reshape([b, t, vocab])
            }
        }
    }

    /// Logits `[b, t, vocab]` of `tokens: [b, t]` read from position 0, causally; also the
    /// keys and values of every layer, for a cache.
    pub fn forward_with_kv(&self, tokens: Tensor<2, Int>) -> (Tensor<3>, Vec<LayerKv>) {
        let (x, kvs) = self.run(tokens, true);
        (self.logits(x), kvs)
    }

    /// Final hidden states (before the norm) of `tokens: [b, t]`.
    fn hidden(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        self.run(tokens, false).0
    }

    /// The decoder stack; the keys and values of every layer when `keep_kv`.
    fn run(&self, tokens: Tensor<2, Int>, keep_kv: bool) -> (Tensor<3>, Vec<LayerKv>) {
        let [_, t] = tokens.dims();
        let device = tokens.device();
        let positions: Vec<usize> = (0..t).collect();
        let (cos, sin) = rope_tables(&positions, &self.rope(), &device);
        let (cos, sin) = (cos.unsqueeze::<4>(), sin.unsqueeze::<4>());
        let mut x = self.embed_tokens.forward(tokens);
        let mut kvs = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let h = layer.input_layernorm.forward(x.clone());
            let (q, k, v) = layer.self_attn.project(h, cos.clone(), sin.clone());
            if keep_kv {
                kvs.push(LayerKv {
                    k: k.clone(),
                    v: v.clone(),
                });
            }
            x = x + layer.self_attn.attend(q, k, v, None, true);
            x = x.clone() + layer.mlp.forward(layer.post_attention_layernorm.forward(x));
        }
        (x, kvs)
    }

    /// Logits `[b, t, vocab]` of `tokens: [b, t]` read from position 0, causally.
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        self.forward_with_kv(tokens).0
    }

    /// One decoding step for a batch whose rows have cached prefixes of different lengths.
    ///
    /// `tokens: [b, 1]` is each row's newest token, at position `positions[row]`; `cache[layer]`
    /// holds `[rows ≥ b, kv_heads, capacity, hd]` keys and values, of which row `r < b` uses
    /// the first `positions[r]` entries (rows from `b` on are left alone). The new keys and
    /// values are written at `positions[row]` (which must be below the capacity); the result
    /// is the logits `[b, vocab]`.
    pub fn decode_step(
        &self,
        tokens: Tensor<2, Int>,
        positions: &[usize],
        cache: &mut [LayerKv],
    ) -> Tensor<2> {
        let [b, _] = tokens.dims();
        let device = tokens.device();
        let rope = self.rope();
        let hd = rope.head_dim;
        let (cos, sin) = rope_tables(positions, &rope, &device);
        let (cos, sin) = (cos.reshape([b, 1, 1, hd]), sin.reshape([b, 1, 1, hd]));
        let capacity = cache.first().map_or(0, |c| c.k.dims()[2]);
        assert!(
            positions.iter().all(|&p| p < capacity),
            "decode position past the cache capacity {capacity}"
        );
        // attention reads only the cache positions some row uses
        let used = positions.iter().max().map_or(0, |p| p + 1);
        let (kv_heads, group) = {
            let a = &self.layers[0].self_attn;
            (a.kv_heads, a.heads / a.kv_heads)
        };
        // the queries of one key/value head attend together: [b, kv_heads, group, used]
        let mut masked = Vec::with_capacity(b * kv_heads * group * used);
        for &p in positions {
            for _ in 0..kv_heads * group {
                masked.extend((0..used).map(|j| j > p));
            }
        }
        let mask = Tensor::<4, Bool>::from_data(
            TensorData::new(masked, [b, kv_heads, group, used]),
            &device,
        );
        let same = positions.windows(2).all(|w| w[0] == w[1]);
        let mut x = self.embed_tokens.forward(tokens);
        for (layer, kv) in self.layers.iter().zip(cache.iter_mut()) {
            let attn = &layer.self_attn;
            let h = layer.input_layernorm.forward(x.clone());
            let (q, k, v) = attn.project(h, cos.clone(), sin.clone());
            if same {
                let p = positions[0];
                kv.write([0..b, 0..kv_heads, p..p + 1, 0..hd], k, v);
            } else {
                for (r, &p) in positions.iter().enumerate() {
                    let range = [r..r + 1, 0..kv_heads, p..p + 1, 0..hd];
                    kv.write(range, k.clone().narrow(0, r, 1), v.clone().narrow(0, r, 1));
                }
            }
            let rows = kv.k.dims()[0];
            let window = |t: &Tensor<4>| {
                if rows == b && used == capacity {
                    t.clone()
                } else {
                    t.clone().slice([0..b, 0..kv_heads, 0..used, 0..hd])
                }
            };
            // grouped-query attention without copying keys: each key/value head's queries
            // are folded into the query axis
            let q = q.reshape([b, kv_heads, group, hd]);
            let options = AttentionModuleOptions {
                scale: None,
                softcap: None,
                is_causal: false,
            };
            let out = attention(
                q,
                window(&kv.k),
                window(&kv.v),
                Some(mask.clone()),
                None,
                options,
            );
            x = x + dense(&attn.o_proj, out.reshape([b, 1, attn.heads * hd]));
            x = x.clone() + layer.mlp.forward(layer.post_attention_layernorm.forward(x));
        }
        let logits = self.logits(x);
        let [_, _, v] = logits.dims();
        logits.reshape([b, v])
    }
}
