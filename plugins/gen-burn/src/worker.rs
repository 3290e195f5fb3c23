//! The decoding thread: one model, a slot-based KV cache, continuous batching.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use areal_model::hf::import;
use areal_model::{LayerKv, ModelConfig, Transformer};
use areal_sdk::sampling::sample;
use areal_sdk::{
    Completion, FinishReason, GenerateRequest, PluginError, PolicyVersion, WeightUpdate, mix_seed,
};
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::oneshot;

pub(crate) type Reply = oneshot::Sender<Result<Completion, PluginError>>;

/// What the async side asks of the decoding thread.
pub(crate) enum Command {
    Generate(GenerateRequest, Reply),
    /// Requests that arrive together, so that they are batched the same way every time.
    GenerateMany(Vec<(GenerateRequest, Reply)>),
    Update(WeightUpdate, oneshot::Sender<Result<(), PluginError>>),
    Pause(oneshot::Sender<()>),
    Resume,
}

/// Counters the generator exposes.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) steps: u64,
    pub(crate) tokens: u64,
    pub(crate) max_active: usize,
    /// Time spent prefilling and decoding.
    pub(crate) busy: Duration,
    pub(crate) weight_loads: u64,
    /// Weight updates that interrupted running sequences, and the time from each such
    /// interruption to the end of the first forward pass (prefill or decoding step) after it.
    pub(crate) resumes: u64,
    pub(crate) resume: Duration,
}

/// How the decoding thread applies an adapter ([`WeightUpdate::adapter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdapterMode {
    /// Folded into the weights once per version (`W + scale · A·B`): decoding costs what the
    /// base's does.
    Merged,
    /// Kept beside the weights: each projection adds `(x·A)·B` while decoding.
    Unmerged,
}

struct Loaded {
    config: ModelConfig,
    /// The frozen weights an adapter applies to, as the update shared them, and the model
    /// built from them (so that a new adapter costs only the adapter).
    base: Option<(std::sync::Arc<Vec<areal_sdk::NamedTensor>>, Transformer)>,
    model: Transformer,
    version: PolicyVersion,
    cache: Vec<LayerKv>,
    capacity: usize,
}

/// A request about to be prefilled, with the most tokens it may add.
struct Pending {
    request: GenerateRequest,
    reply: Reply,
    limit: usize,
}

/// A sequence being decoded; its index in `active` is its cache row.
struct Active {
    request: GenerateRequest,
    reply: Reply,
    out: Completion,
    /// Tokens whose keys and values are in the cache.
    cached: usize,
    /// The newest token, sampled but not yet fed.
    pending: u32,
    /// Most tokens this sequence may still add (budget and cache capacity).
    limit: usize,
    rng: StdRng,
}

pub(crate) struct Worker {
    device: Device,
    adapters: AdapterMode,
    max_batch: usize,
    max_len: Option<usize>,
    loaded: Option<Loaded>,
    waiting: VecDeque<(GenerateRequest, Reply)>,
    active: Vec<Active>,
    paused: bool,
    /// When running sequences were last interrupted for new weights, until decoding resumes.
    interrupted_at: Option<Instant>,
    pub(crate) stats: std::sync::Arc<std::sync::Mutex<Stats>>,
}

fn failed(message: impl Into<String>) -> PluginError {
    PluginError::failed(crate::NAME, message)
}

/// Tokens of the forward pass that checks new weights before they are served.
const PROBE_TOKENS: usize = 8;

/// What a panic said, when it said it with a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// The base a new version's adapter goes over.
enum NewBase {
    /// Full weights: no adapter, no base kept.
    None,
    /// The base held already (the same tensors): kept.
    Kept,
    /// A base built for this update.
    Built(
        std::sync::Arc<Vec<areal_sdk::NamedTensor>>,
        Box<Transformer>,
    ),
}

/// A weight update built and checked, before it replaces what is held.
struct Built {
    config: ModelConfig,
    model: Transformer,
    base: NewBase,
    /// `None`: the held cache fits and is reused.
    cache: Option<Vec<LayerKv>>,
    capacity: usize,
}

impl Worker {
    pub(crate) fn new(
        device: Device,
        adapters: AdapterMode,
        max_batch: usize,
        max_len: Option<usize>,
    ) -> Self {
        Self {
            device,
            adapters,
            max_batch,
            max_len,
            loaded: None,
            waiting: VecDeque::new(),
            active: Vec::new(),
            paused: false,
            interrupted_at: None,
            stats: Default::default(),
        }
    }

    /// Serve commands until the generator is dropped.
    pub(crate) fn run(mut self, commands: Receiver<Command>) {
        loop {
            let busy = !self.active.is_empty() || (!self.paused && !self.waiting.is_empty());
            if !busy {
                match commands.recv() {
                    Ok(command) => self.handle(command),
                    Err(_) => return,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(command) => self.handle(command),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            if self.paused {
                continue;
            }
            let started = Instant::now();
            // a panic in a forward pass fails the sequences it was decoding, not the thread
            let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.admit();
                self.step();
            }));
            if let Err(panic) = stepped {
                let why = panic_message(&panic);
                tracing::error!(target: "areal::gen_burn", "decoding failed: {why}");
                for a in self.active.drain(..) {
                    let _ = a.reply.send(Err(failed(format!("decoding failed: {why}"))));
                }
            }
            self.stats.lock().expect("stats lock").busy += started.elapsed();
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Generate(request, reply) => self.waiting.push_back((request, reply)),
            Command::GenerateMany(requests) => self.waiting.extend(requests),
            Command::Update(update, done) => {
                let loaded = self.load(update);
                // counted before the caller hears back, so that it reads its own update
                self.stats.lock().expect("stats lock").weight_loads += 1;
                let _ = done.send(loaded);
            }
            Command::Pause(done) => {
                self.paused = true;
                self.interrupt_all();
                let _ = done.send(());
            }
            Command::Resume => self.paused = false,
        }
    }

    fn interrupt_all(&mut self) {
        if !self.active.is_empty() && self.interrupted_at.is_none() {
            self.interrupted_at = Some(Instant::now());
        }
        for mut a in self.active.drain(..) {
            a.out.finish_reason = FinishReason::Interrupted;
            let _ = a.reply.send(Ok(a.out));
        }
    }

    /// Take `update`, or refuse it and keep serving the weights held: the new model is built
    /// and probed beside the old one, which is replaced only when all of it succeeded (a
    /// panic while building counts as a refusal, not as the end of the decoding thread).
    fn load(&mut self, update: WeightUpdate) -> Result<(), PluginError> {
        let version = update.version;
        let mut old = self.loaded.take();
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.build(&update, old.as_ref())
        }))
        .unwrap_or_else(|panic| {
            Err(failed(format!(
                "weight update {version} could not be built: {}",
                panic_message(&panic)
            )))
        });
        let built = match built {
            Ok(built) => built,
            Err(e) => {
                let held = old.as_ref().map_or_else(
                    || "no weights are held yet".to_owned(),
                    |l| format!("version {} is still served", l.version),
                );
                self.loaded = old;
                // the cause in the message, which every caller shows
                return Err(failed(format!(
                    "weight update {version} refused ({held}): {}",
                    areal_sdk::error_chain(&e)
                )));
            }
        };
        // Caches were computed with the old weights: running sequences return what they have
        // and are resubmitted by their callers. (A refused update interrupts nothing.)
        self.interrupt_all();
        let base = match built.base {
            NewBase::None => None,
            NewBase::Built(tensors, model) => Some((tensors, *model)),
            NewBase::Kept => old.as_mut().and_then(|l| l.base.take()),
        };
        let cache = match built.cache {
            Some(cache) => cache,
            None => old.take().expect("a reused cache is the old one's").cache,
        };
        self.loaded = Some(Loaded {
            config: built.config,
            base,
            model: built.model,
            version,
            cache,
            capacity: built.capacity,
        });
        Ok(())
    }

    /// The model, base and cache `update` needs, built beside `old` (what is held).
    fn build(&self, update: &WeightUpdate, old: Option<&Loaded>) -> Result<Built, PluginError> {
        let config: ModelConfig =
            serde_json::from_value((*update.architecture).clone()).map_err(|e| {
                failed(format!(
                    "weight update {} does not describe a transformer: {e}",
                    update.version
                ))
            })?;
        // (whether the weights fit this machine, `import` checks when it builds them)
        config
            .check()
            .map_err(|e| failed(format!("config.json: {e}")))?;
        let capacity = self
            .max_len
            .unwrap_or(config.max_position_embeddings)
            .min(config.max_position_embeddings);
        let reuse_cache = old.is_some_and(|l| l.config == config && l.capacity == capacity);
        let cache_shape = [
            self.max_batch,
            config.kv_heads(),
            capacity,
            config.head_dim(),
        ];
        if !reuse_cache {
            // keys and values of every layer, f32: checked before anything is allocated
            let bytes = cache_shape
                .iter()
                .fold(8 * config.num_hidden_layers as u128, |n, &d| {
                    n.saturating_mul(d as u128)
                });
            areal_sdk::resources::check_memory(
                &format!(
                    "a key/value cache of {} rows × {capacity} positions × {} layers",
                    self.max_batch, config.num_hidden_layers
                ),
                bytes,
            )
            .map_err(failed)?;
        }
        // the base is built once: later versions bring only their adapter
        let held = old
            .and_then(|l| l.base.as_ref())
            .filter(|(tensors, _)| {
                update.adapter.is_some() && std::sync::Arc::ptr_eq(tensors, &update.tensors)
            })
            .map(|(_, model)| model);
        let (model, base) = match &update.adapter {
            None => (
                import(&config, update.tensors.as_ref().clone(), &self.device)?,
                NewBase::None,
            ),
            Some(adapter) => {
                let (adapted, base) = match held {
                    Some(model) => (model.adapted(adapter)?, NewBase::Kept),
                    None => {
                        let model = import(&config, update.tensors.as_ref().clone(), &self.device)?;
                        let adapted = model.adapted(adapter)?;
                        (
                            adapted,
                            NewBase::Built(update.tensors.clone(), Box::new(model)),
                        )
                    }
                };
                let model = match self.adapters {
                    AdapterMode::Merged => adapted.merged(),
                    AdapterMode::Unmerged => adapted,
                };
                (model, base)
            }
        };
        self.probe(&model, &config, capacity)?;
        let cache = (!reuse_cache).then(|| {
            (0..config.num_hidden_layers)
                .map(|_| LayerKv {
                    k: Tensor::zeros(cache_shape, &self.device),
                    v: Tensor::zeros(cache_shape, &self.device),
                })
                .collect()
        });
        Ok(Built {
            config,
            model,
            base,
            cache,
            capacity,
        })
    }

    /// Weights that cannot be sampled from (logits that overflow to infinity or NaN, from
    /// finite but huge values or a degenerate norm) are refused before they replace any: a
    /// forward pass over a few tokens must give finite logits.
    fn probe(
        &self,
        model: &Transformer,
        config: &ModelConfig,
        capacity: usize,
    ) -> Result<(), PluginError> {
        let n = capacity.min(config.vocab_size).min(PROBE_TOKENS);
        let ids: Vec<i64> = (0..n as i64).collect();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), &self.device);
        let logits = model
            .forward(tokens)
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .map_err(|e| failed(format!("reading the probe's logits: {e:?}")))?;
        let bad = logits.iter().filter(|l| !l.is_finite()).count();
        if bad > 0 {
            return Err(failed(format!(
                "the weights give {bad} non-finite logits of {} on a probe of {n} tokens: they \
                 cannot be sampled from (weights or an adapter too large, or a degenerate norm)",
                logits.len()
            )));
        }
        Ok(())
    }

    /// Move waiting requests into free rows, prefilling their inputs together: requests of
    /// similar length share one forward pass (right-padded; causal attention keeps the padding
    /// out of every real position), which is what makes resubmission after an interruption
    /// cheap.
    fn admit(&mut self) {
        let mut ready = Vec::new();
        while self.active.len() + ready.len() < self.max_batch {
            let Some((request, reply)) = self.waiting.pop_front() else {
                break;
            };
            if reply.is_closed() {
                continue;
            }
            match self.check(&request) {
                Ok(0) => {
                    let _ = reply.send(Ok(Completion::empty(FinishReason::Length)));
                }
                Ok(limit) => ready.push(Pending {
                    request,
                    reply,
                    limit,
                }),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        ready.sort_by_key(|p| std::cmp::Reverse(p.request.input_ids.len()));
        let mut bucket: Vec<Pending> = Vec::new();
        for pending in ready {
            // a new pass when padding to the bucket's longest input would cost too much
            let longest = bucket.first().map_or(0, |p| p.request.input_ids.len());
            if pending.request.input_ids.len() * 3 < longest * 2 {
                self.prefill(std::mem::take(&mut bucket));
            }
            bucket.push(pending);
        }
        if !bucket.is_empty() {
            self.prefill(bucket);
        }
    }

    /// The most tokens `request` may add, or why it cannot run.
    fn check(&self, request: &GenerateRequest) -> Result<usize, PluginError> {
        let Some(loaded) = self.loaded.as_ref() else {
            return Err(failed("generate before any weights were loaded"));
        };
        // What is wrong with the request itself is the caller's fault (a server's 400).
        let invalid = |message: String| PluginError::invalid_request(crate::NAME, message);
        let n = request.input_ids.len();
        if n == 0 {
            return Err(invalid("empty input".into()));
        }
        if n >= loaded.capacity {
            return Err(PluginError::context_exceeded(
                crate::NAME,
                n,
                loaded.capacity,
            ));
        }
        if let Some(bad) = request
            .input_ids
            .iter()
            .find(|&&t| t as usize >= loaded.config.vocab_size)
        {
            return Err(invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                loaded.config.vocab_size
            )));
        }
        request.sampling.check().map_err(invalid)?;
        Ok(request.max_new_tokens.min(loaded.capacity - n))
    }

    /// Run the inputs of `bucket` (longest first) through the model into the next free rows
    /// and sample each one's first token; requests complete after it are answered at once.
    fn prefill(&mut self, bucket: Vec<Pending>) {
        let Some(loaded) = self.loaded.as_mut() else {
            return;
        };
        let (row0, b) = (self.active.len(), bucket.len());
        let t = bucket[0].request.input_ids.len();
        let mut ids = vec![0i64; b * t];
        for (i, p) in bucket.iter().enumerate() {
            for (j, &token) in p.request.input_ids.iter().enumerate() {
                ids[i * t + j] = i64::from(token);
            }
        }
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [b, t]), &self.device);
        let (logits, kvs) = loaded.model.forward_with_kv(tokens);
        // positions past a row's input hold padding; decoding overwrites each before reading it
        for (layer, kv) in loaded.cache.iter_mut().zip(kvs) {
            let [_, kvh, _, hd] = kv.k.dims();
            layer.write([row0..row0 + b, 0..kvh, 0..t, 0..hd], kv.k, kv.v);
        }
        let [_, _, vocab] = logits.dims();
        let logits = logits
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32 logits");
        for (i, p) in bucket.into_iter().enumerate() {
            let n = p.request.input_ids.len();
            let last = &logits[(i * t + n - 1) * vocab..(i * t + n) * vocab];
            let seed = mix_seed(
                mix_seed(p.request.sampling.seed, p.request.sample_id),
                n as u64,
            );
            let mut rng = StdRng::seed_from_u64(seed);
            let (token, logprob) = sample(
                last,
                p.request.sampling.temperature,
                p.request.sampling.top_p,
                rng.random::<f64>(),
            );
            let mut out = Completion::empty(FinishReason::Length);
            out.push(token, logprob, loaded.version);
            self.active.push(Active {
                request: p.request,
                reply: p.reply,
                out,
                cached: n,
                pending: token,
                limit: p.limit,
                rng,
            });
        }
        {
            let mut stats = self.stats.lock().expect("stats lock");
            stats.tokens += b as u64;
            resumed(&mut stats, &mut self.interrupted_at);
        }
        let mut row = self.active.len();
        while row > row0 {
            row -= 1;
            if let Some(reason) = finished(&self.active[row]) {
                let mut done = remove_row(&mut self.active, &mut loaded.cache, row);
                done.out.finish_reason = reason;
                let _ = done.reply.send(Ok(done.out));
            }
        }
    }

    /// One token for every active sequence.
    fn step(&mut self) {
        let Some(loaded) = self.loaded.as_mut() else {
            return;
        };
        // sequences whose callers went away leave first
        let mut i = self.active.len();
        while i > 0 {
            i -= 1;
            if self.active[i].reply.is_closed() {
                remove_row(&mut self.active, &mut loaded.cache, i);
            }
        }
        let b = self.active.len();
        if b == 0 {
            return;
        }
        let ids: Vec<i64> = self.active.iter().map(|a| i64::from(a.pending)).collect();
        let positions: Vec<usize> = self.active.iter().map(|a| a.cached).collect();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [b, 1]), &self.device);
        let logits = loaded
            .model
            .decode_step(tokens, &positions, &mut loaded.cache);
        let [_, vocab] = logits.dims();
        let logits = logits
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32 logits");
        {
            let mut stats = self.stats.lock().expect("stats lock");
            stats.steps += 1;
            stats.tokens += b as u64;
            stats.max_active = stats.max_active.max(b);
            resumed(&mut stats, &mut self.interrupted_at);
        }
        for (row, a) in self.active.iter_mut().enumerate() {
            a.cached += 1;
            let u = a.rng.random::<f64>();
            let (token, logprob) = sample(
                &logits[row * vocab..(row + 1) * vocab],
                a.request.sampling.temperature,
                a.request.sampling.top_p,
                u,
            );
            a.out.push(token, logprob, loaded.version);
            a.pending = token;
        }
        let mut i = self.active.len();
        while i > 0 {
            i -= 1;
            if let Some(reason) = finished(&self.active[i]) {
                let mut done = remove_row(&mut self.active, &mut loaded.cache, i);
                done.out.finish_reason = reason;
                let _ = done.reply.send(Ok(done.out));
            }
        }
    }
}

/// Decoding computed again after an interruption: count what resuming took. (Called before
/// any reply of that pass is sent, so that a caller who hears back sees it counted.)
fn resumed(stats: &mut Stats, interrupted_at: &mut Option<Instant>) {
    if let Some(at) = interrupted_at.take() {
        stats.resumes += 1;
        stats.resume += at.elapsed();
    }
}

fn finished(a: &Active) -> Option<FinishReason> {
    let last = *a.out.token_ids.last()?;
    if a.request.stop_token_ids.contains(&last) {
        Some(FinishReason::Stop)
    } else if a.out.len() >= a.limit {
        Some(FinishReason::Length)
    } else {
        None
    }
}

/// Remove the sequence in `row`; the last row moves into its place, cache included.
fn remove_row(active: &mut Vec<Active>, cache: &mut [LayerKv], row: usize) -> Active {
    let last = active.len() - 1;
    if row != last {
        for layer in cache.iter_mut() {
            let [_, kvh, cap, hd] = layer.k.dims();
            let k = layer.k.clone().narrow(0, last, 1);
            let v = layer.v.clone().narrow(0, last, 1);
            layer.write([row..row + 1, 0..kvh, 0..cap, 0..hd], k, v);
        }
    }
    active.swap_remove(row)
}
