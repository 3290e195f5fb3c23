//! The gRPC protocol of areal-rs: the generator and reward services (`proto/areal/v1/`), and
//! the conversions between their messages and the SDK's plain data.
//!
//! The messages carry exactly what the in-process plugins exchange: a [`GenerateRequest`]
//! becomes a stream of token chunks (each token with its behaviour logprob and policy version)
//! ending in a finish reason; a [`WeightUpdate`] travels as a header and tensor parts whose
//! sha256 the receiver checks ([`weight_chunks`], [`WeightAssembler`]); a [`RewardInput`] and
//! its deadline go out, a [`Reward`] or the verifier's error comes back. Every request carries
//! a [`Header`](pb::Header) with [`PROTOCOL_VERSION`]; [`check_header`] refuses another
//! version with an error that names both.
//!
//! Decoding never panics on what a peer sends: a missing field, an unknown enum value, a
//! malformed JSON reference, a tensor whose parts do not add up or whose checksum differs is a
//! [`DecodeError`], which a server answers as `INVALID_ARGUMENT`.

use std::sync::Arc;
use std::time::Duration;

use areal_sdk::{
    Completion, FinishReason, GenerateRequest, GeneratorStats, NamedTensor, Provenance, Reward,
    RewardInput, SamplingParams, Verdict, WeightUpdate,
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The generated messages and services of `areal.v1`.
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::allow_attributes_without_reason,
    reason = "generated code"
)]
pub mod pb {
    tonic::include_proto!("areal.v1");
}

/// The protocol version this build speaks; every request carries it.
pub const PROTOCOL_VERSION: u32 = 1;

/// The largest message a server or client accepts (a weight part, a reward batch).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Values of one weight part: 4 MiB of f32, well under [`MAX_MESSAGE_BYTES`].
pub const PART_VALUES: usize = 1 << 20;

/// The header of every request.
pub fn header() -> pb::Header {
    pb::Header {
        protocol: PROTOCOL_VERSION,
    }
}

/// A call that carries nothing but its header.
pub fn ping() -> pb::Ping {
    pb::Ping {
        header: Some(header()),
    }
}

/// Refuse a request from another protocol version (or without a header), naming both.
pub fn check_header(header: Option<&pb::Header>) -> Result<(), tonic::Status> {
    match header {
        Some(h) if h.protocol == PROTOCOL_VERSION => Ok(()),
        Some(h) => Err(tonic::Status::failed_precondition(format!(
            "protocol version {} refused: this server speaks areal protocol {PROTOCOL_VERSION} \
             (areal {}); run a client and server of the same release",
            h.protocol,
            env!("CARGO_PKG_VERSION")
        ))),
        None => Err(tonic::Status::invalid_argument(
            "the request has no header (an areal client sends its protocol version in every call)",
        )),
    }
}

/// Why a message could not be turned into the SDK's data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// A field that must be present is not.
    #[error("`{0}` is missing")]
    Missing(&'static str),
    /// An enum field holds a value this build does not know.
    #[error("`{field}` has the unknown value {value}")]
    UnknownValue {
        /// The field.
        field: &'static str,
        /// The value.
        value: i32,
    },
    /// A JSON field does not parse.
    #[error("`{field}` is not valid JSON")]
    Json {
        /// The field.
        field: &'static str,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A JSON field parses but is not an object.
    #[error("`{0}` must be a JSON object")]
    NotAnObject(&'static str),
    /// The token, logprob and version lists of a chunk differ in length.
    #[error("a token chunk has {tokens} tokens, {logprobs} logprobs and {versions} versions")]
    ChunkLengths {
        /// Tokens.
        tokens: usize,
        /// Logprobs.
        logprobs: usize,
        /// Versions.
        versions: usize,
    },
    /// A stream of more tokens than the request's budget.
    #[error("{tokens} tokens streamed for a request of max_new_tokens {max_new_tokens}")]
    TooManyTokens {
        /// Tokens so far.
        tokens: usize,
        /// The request's budget.
        max_new_tokens: usize,
    },
    /// Weights that do not add up: parts out of order, a wrong size, a bad checksum.
    #[error("weights of version {version}: {message}")]
    Weights {
        /// The version being sent.
        version: u64,
        /// What is wrong.
        message: String,
    },
}

impl From<DecodeError> for tonic::Status {
    fn from(e: DecodeError) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

fn object(field: &'static str, text: &str) -> Result<Map<String, Value>, DecodeError> {
    if text.is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str(text).map_err(|source| DecodeError::Json { field, source })? {
        Value::Object(map) => Ok(map),
        _ => Err(DecodeError::NotAnObject(field)),
    }
}

/// A finish reason on the wire.
pub fn finish_reason(reason: FinishReason) -> pb::FinishReason {
    match reason {
        FinishReason::Stop => pb::FinishReason::Stop,
        FinishReason::Length => pb::FinishReason::Length,
        FinishReason::Interrupted => pb::FinishReason::Interrupted,
    }
}

/// A finish reason from the wire.
pub fn from_finish_reason(value: i32) -> Result<FinishReason, DecodeError> {
    match pb::FinishReason::try_from(value) {
        Ok(pb::FinishReason::Stop) => Ok(FinishReason::Stop),
        Ok(pb::FinishReason::Length) => Ok(FinishReason::Length),
        Ok(pb::FinishReason::Interrupted) => Ok(FinishReason::Interrupted),
        _ => Err(DecodeError::UnknownValue {
            field: "finish_reason",
            value,
        }),
    }
}

/// A generate request on the wire.
pub fn generate_request(r: &GenerateRequest) -> pb::GenerateRequest {
    pb::GenerateRequest {
        header: Some(header()),
        sample_id: r.sample_id,
        input_ids: r.input_ids.clone(),
        max_new_tokens: r.max_new_tokens as u64,
        sampling: Some(pb::SamplingParams {
            temperature: r.sampling.temperature,
            top_p: r.sampling.top_p,
            seed: r.sampling.seed,
        }),
        stop_token_ids: r.stop_token_ids.clone(),
    }
}

/// A generate request from the wire.
pub fn from_generate_request(r: pb::GenerateRequest) -> Result<GenerateRequest, DecodeError> {
    let sampling = r.sampling.ok_or(DecodeError::Missing("sampling"))?;
    Ok(GenerateRequest {
        sample_id: r.sample_id,
        input_ids: r.input_ids,
        max_new_tokens: usize::try_from(r.max_new_tokens).unwrap_or(usize::MAX),
        sampling: SamplingParams {
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            seed: sampling.seed,
        },
        stop_token_ids: r.stop_token_ids,
    })
}

/// A completion as the events of a `Generate` stream: one token chunk, then the finish.
pub fn completion_events(c: &Completion) -> Vec<pb::GenerateEvent> {
    use pb::generate_event::Event;
    let mut events = Vec::with_capacity(2);
    if !c.token_ids.is_empty() {
        events.push(pb::GenerateEvent {
            event: Some(Event::Tokens(pb::TokenChunk {
                token_ids: c.token_ids.clone(),
                behaviour_logprobs: c.behaviour_logprobs.clone(),
                versions: c.versions.clone(),
            })),
        });
    }
    events.push(pb::GenerateEvent {
        event: Some(Event::Finish(pb::Finish {
            reason: finish_reason(c.finish_reason) as i32,
        })),
    });
    events
}

/// Builds a [`Completion`] from the events of a `Generate` stream, cut at the request's
/// budget: a server that streams more tokens than were asked for is refused at the first
/// chunk past it, not held on to until the sample ends.
#[derive(Debug)]
pub struct CompletionBuilder {
    token_ids: Vec<u32>,
    behaviour_logprobs: Vec<f32>,
    versions: Vec<u64>,
    max_tokens: usize,
}

impl CompletionBuilder {
    /// A builder for the answer to a request of `max_new_tokens`.
    pub fn new(max_new_tokens: usize) -> Self {
        Self {
            token_ids: Vec::new(),
            behaviour_logprobs: Vec::new(),
            versions: Vec::new(),
            max_tokens: max_new_tokens,
        }
    }

    /// Add one event; `Some` with the completion once the finish arrives.
    pub fn push(&mut self, event: pb::GenerateEvent) -> Result<Option<Completion>, DecodeError> {
        use pb::generate_event::Event;
        match event.event.ok_or(DecodeError::Missing("event"))? {
            Event::Tokens(chunk) => {
                let (tokens, logprobs, versions) = (
                    chunk.token_ids.len(),
                    chunk.behaviour_logprobs.len(),
                    chunk.versions.len(),
                );
                if tokens != logprobs || tokens != versions {
                    return Err(DecodeError::ChunkLengths {
                        tokens,
                        logprobs,
                        versions,
                    });
                }
                let total = self.token_ids.len().saturating_add(tokens);
                if total > self.max_tokens {
                    return Err(DecodeError::TooManyTokens {
                        tokens: total,
                        max_new_tokens: self.max_tokens,
                    });
                }
                self.token_ids.extend(chunk.token_ids);
                self.behaviour_logprobs.extend(chunk.behaviour_logprobs);
                self.versions.extend(chunk.versions);
                Ok(None)
            }
            Event::Finish(finish) => Ok(Some(Completion {
                token_ids: std::mem::take(&mut self.token_ids),
                behaviour_logprobs: std::mem::take(&mut self.behaviour_logprobs),
                versions: std::mem::take(&mut self.versions),
                finish_reason: from_finish_reason(finish.reason)?,
            })),
        }
    }
}

/// A verdict on the wire.
pub fn verdict(v: Verdict) -> pb::Verdict {
    match v {
        Verdict::Accepted => pb::Verdict::Accepted,
        Verdict::Partial => pb::Verdict::Partial,
        Verdict::WrongAnswer => pb::Verdict::WrongAnswer,
        Verdict::NoAnswer => pb::Verdict::NoAnswer,
        Verdict::NoCode => pb::Verdict::NoCode,
        Verdict::RuntimeError => pb::Verdict::RuntimeError,
        Verdict::TimeLimit => pb::Verdict::TimeLimit,
        Verdict::MemoryLimit => pb::Verdict::MemoryLimit,
        Verdict::OutputLimit => pb::Verdict::OutputLimit,
        Verdict::VerifierTimeout => pb::Verdict::VerifierTimeout,
        Verdict::VerifierCrashed => pb::Verdict::VerifierCrashed,
        // `Verdict` may grow; a verdict this protocol cannot carry is the verifier's failure
        _ => pb::Verdict::Error,
    }
}

/// A verdict from the wire.
pub fn from_verdict(value: i32) -> Result<Verdict, DecodeError> {
    Ok(match pb::Verdict::try_from(value) {
        Ok(pb::Verdict::Accepted) => Verdict::Accepted,
        Ok(pb::Verdict::Partial) => Verdict::Partial,
        Ok(pb::Verdict::WrongAnswer) => Verdict::WrongAnswer,
        Ok(pb::Verdict::NoAnswer) => Verdict::NoAnswer,
        Ok(pb::Verdict::NoCode) => Verdict::NoCode,
        Ok(pb::Verdict::RuntimeError) => Verdict::RuntimeError,
        Ok(pb::Verdict::TimeLimit) => Verdict::TimeLimit,
        Ok(pb::Verdict::MemoryLimit) => Verdict::MemoryLimit,
        Ok(pb::Verdict::OutputLimit) => Verdict::OutputLimit,
        Ok(pb::Verdict::VerifierTimeout) => Verdict::VerifierTimeout,
        Ok(pb::Verdict::VerifierCrashed) => Verdict::VerifierCrashed,
        Ok(pb::Verdict::Error) => Verdict::Error,
        Ok(pb::Verdict::Unspecified) | Err(_) => {
            return Err(DecodeError::UnknownValue {
                field: "verdict",
                value,
            });
        }
    })
}

/// A reward input and its deadline on the wire.
pub fn reward_input(input: &RewardInput, deadline: Duration) -> pb::RewardInput {
    pb::RewardInput {
        sample_id: input.sample_id,
        item_id: input.item_id.clone(),
        prompt: input.prompt.clone(),
        completion: input.completion.clone(),
        completion_ids: input.completion_ids.clone(),
        finish_reason: finish_reason(input.finish_reason) as i32,
        reference_json: input.reference.to_string(),
        deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
        metadata_json: if input.metadata.is_empty() {
            String::new()
        } else {
            serde_json::Value::Object(input.metadata.clone()).to_string()
        },
    }
}

/// About the bytes [`reward_input`] puts on the wire for `input` (its fields' lengths, the
/// reference and metadata as JSON, counted without being written out), within a few hundred
/// bytes of framing: whether a sample fits under [`MAX_MESSAGE_BYTES`] is known before it is
/// encoded.
pub fn reward_input_size(input: &RewardInput) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut json = Count(0);
    let _ = serde_json::to_writer(&mut json, &input.reference);
    let _ = serde_json::to_writer(&mut json, &input.metadata);
    json.0
        + input.item_id.len()
        + input.prompt.len()
        + input.completion.len()
        + 5 * input.completion_ids.len()
        + 256
}

/// A reward input and its deadline from the wire.
pub fn from_reward_input(input: pb::RewardInput) -> Result<(RewardInput, Duration), DecodeError> {
    let reference =
        serde_json::from_str(&input.reference_json).map_err(|source| DecodeError::Json {
            field: "reference_json",
            source,
        })?;
    let metadata = if input.metadata_json.is_empty() {
        Default::default()
    } else {
        serde_json::from_str(&input.metadata_json).map_err(|source| DecodeError::Json {
            field: "metadata_json",
            source,
        })?
    };
    Ok((
        RewardInput {
            metadata,
            sample_id: input.sample_id,
            item_id: input.item_id,
            prompt: input.prompt,
            completion: input.completion,
            completion_ids: input.completion_ids,
            finish_reason: from_finish_reason(input.finish_reason)?,
            reference,
        },
        Duration::from_millis(input.deadline_ms),
    ))
}

/// A reward on the wire.
pub fn reward(r: &Reward) -> pb::Reward {
    let p = &r.provenance;
    pb::Reward {
        value: r.value,
        verdict: verdict(r.verdict) as i32,
        provenance: Some(pb::Provenance {
            verifier: p.verifier.clone(),
            verifier_version: p.verifier_version.clone(),
            wall_ms: p.wall_ms,
            fuel: p.fuel,
            limits_json: Value::Object(p.limits.clone()).to_string(),
            details_json: Value::Object(p.details.clone()).to_string(),
        }),
    }
}

/// A reward from the wire.
pub fn from_reward(r: pb::Reward) -> Result<Reward, DecodeError> {
    let p = r.provenance.ok_or(DecodeError::Missing("provenance"))?;
    Ok(Reward {
        value: r.value,
        verdict: from_verdict(r.verdict)?,
        provenance: Provenance {
            verifier: p.verifier,
            verifier_version: p.verifier_version,
            wall_ms: p.wall_ms,
            fuel: p.fuel,
            limits: object("limits_json", &p.limits_json)?,
            details: object("details_json", &p.details_json)?,
        },
        // (a verifier's reward: episodes give turns' rewards in the engine)
        turns: Vec::new(),
    })
}

/// Generator statistics on the wire.
pub fn stats(s: &GeneratorStats) -> pb::GeneratorStats {
    pb::GeneratorStats {
        busy_seconds: s.busy_seconds,
        tokens: s.tokens,
        weight_loads: s.weight_loads,
        resume_seconds: s.resume_seconds,
        resumes: s.resumes,
    }
}

/// Generator statistics from the wire.
pub fn from_stats(s: &pb::GeneratorStats) -> GeneratorStats {
    let mut stats =
        GeneratorStats::default().with_resumes(s.weight_loads, s.resumes, s.resume_seconds);
    stats.busy_seconds = s.busy_seconds;
    stats.tokens = s.tokens;
    stats
}

/// The sha256 (hex) of tensors, as [`pb::WeightsHeader::sha256`] defines it: each tensor's
/// name, its shape (u64 little-endian) and its values (f32 little-endian), in the order of
/// their names (so that a safetensors file, which keeps its own order, has the same sum).
pub fn weights_sha256(tensors: &[NamedTensor]) -> String {
    sha256_of(tensors)
}

fn sha256_of<'a>(tensors: impl IntoIterator<Item = &'a NamedTensor>) -> String {
    let mut hash = Sha256::new();
    let mut by_name: Vec<&NamedTensor> = tensors.into_iter().collect();
    by_name.sort_by(|a, b| a.name.cmp(&b.name));
    let mut buffer = Vec::with_capacity(HASH_BLOCK * 4);
    for t in by_name {
        hash_tensor_head(&mut hash, &t.name, t.shape.iter().map(|&d| d as u64));
        for block in t.data.chunks(HASH_BLOCK) {
            buffer.clear();
            le_bytes(block, &mut buffer);
            hash.update(&buffer);
        }
    }
    hex(&hash.finalize())
}

/// Values hashed at once (a 64 KiB buffer: one call per block, not per value).
const HASH_BLOCK: usize = 1 << 14;

/// Append `values` as little-endian bytes.
fn le_bytes(values: &[f32], out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + values.len() * 4, 0);
    for (bytes, v) in out[start..].chunks_exact_mut(4).zip(values) {
        bytes.copy_from_slice(&v.to_le_bytes());
    }
}

fn hash_tensor_head(hash: &mut Sha256, name: &str, shape: impl Iterator<Item = u64>) {
    hash.update((name.len() as u64).to_le_bytes());
    hash.update(name.as_bytes());
    let shape: Vec<u64> = shape.collect();
    hash.update((shape.len() as u64).to_le_bytes());
    for d in shape {
        hash.update(d.to_le_bytes());
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A weight update as the chunks of an `UpdateWeights` stream: the header, then each tensor in
/// parts of at most `part_values` values.
pub fn weight_chunks(update: &WeightUpdate, part_values: usize) -> Vec<pb::WeightChunk> {
    match &update.adapter {
        None => chunks(update, &[update.tensors.as_slice()], None, part_values),
        Some(_) => adapter_chunks(update, &weights_sha256(&update.tensors), true, part_values),
    }
}

/// The chunks of `update`, which has an adapter over the base of sha256 `base_sha256`: the
/// adapter alone, or (`with_base`) the base and then the adapter.
pub fn adapter_chunks(
    update: &WeightUpdate,
    base_sha256: &str,
    with_base: bool,
    part_values: usize,
) -> Vec<pb::WeightChunk> {
    let adapter = update
        .adapter
        .as_deref()
        .expect("an update with an adapter");
    let groups: Vec<&[NamedTensor]> = if with_base {
        vec![update.tensors.as_slice(), adapter.tensors.as_slice()]
    } else {
        vec![adapter.tensors.as_slice()]
    };
    chunks(update, &groups, Some((adapter, base_sha256)), part_values)
}

fn chunks(
    update: &WeightUpdate,
    groups: &[&[NamedTensor]],
    adapter: Option<(&areal_sdk::Adapter, &str)>,
    part_values: usize,
) -> Vec<pb::WeightChunk> {
    use pb::weight_chunk::Chunk;
    let part_values = part_values.max(1);
    let sha256 = sha256_of(groups.iter().flat_map(|g| g.iter()));
    let mut chunks = vec![pb::WeightChunk {
        chunk: Some(Chunk::Header(pb::WeightsHeader {
            header: Some(header()),
            version: update.version,
            architecture_json: update.architecture.to_string(),
            tensors: groups.iter().map(|g| g.len()).sum::<usize>() as u32,
            sha256,
            adapter_config_json: adapter.map_or(String::new(), |(a, _)| a.config.to_string()),
            adapter_tensors: adapter.map_or(0, |(a, _)| a.tensors.len() as u32),
            base_sha256: adapter.map_or(String::new(), |(_, sha)| sha.to_owned()),
        })),
    }];
    for t in groups.iter().flat_map(|g| g.iter()) {
        let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
        let mut offset = 0;
        loop {
            let end = (offset + part_values).min(t.data.len());
            let mut data = Vec::new();
            le_bytes(&t.data[offset..end], &mut data);
            chunks.push(pb::WeightChunk {
                chunk: Some(Chunk::Part(pb::TensorPart {
                    name: t.name.clone(),
                    shape: shape.clone(),
                    offset: offset as u64,
                    data: data.into(),
                })),
            });
            offset = end;
            if offset >= t.data.len() {
                break;
            }
        }
    }
    chunks
}

/// A weight update as it arrived: with an adapter and no base, the sha256 of the base it
/// applies to (which the receiver must hold).
#[derive(Debug)]
pub struct Received {
    /// The update; with an adapter and no base, its `tensors` are empty.
    pub update: WeightUpdate,
    /// With an adapter: the sha256 of its base.
    pub base_sha256: Option<String>,
}

/// Reassembles a weight update from `UpdateWeights` chunks, checking as it goes: the header
/// first and once, parts in order, each tensor exactly the size its shape says and within the
/// receiver's budget, every value finite, the tensor count and the sha256 at the end.
///
/// Nothing a peer announces is allocated ahead of its data: a tensor's buffer grows with the
/// values that arrive, so a shape claiming 2^32 values costs nothing until they are sent, and
/// a shape past the budget is refused before any of it is.
#[derive(Debug)]
pub struct WeightAssembler {
    header: Option<pb::WeightsHeader>,
    tensors: Vec<NamedTensor>,
    /// Values still expected by the last tensor.
    missing: usize,
    /// The most values the whole update may hold (what the receiver can hold).
    budget: usize,
    /// Values announced so far (the shapes of the tensors begun).
    announced: usize,
}

impl Default for WeightAssembler {
    fn default() -> Self {
        Self::new()
    }
}

impl WeightAssembler {
    /// An assembler waiting for the header, holding at most what this machine's memory can
    /// ([`areal_sdk::resources::available_memory`], in f32 values; without a reading, no
    /// more than a message may announce).
    pub fn new() -> Self {
        let bytes = areal_sdk::resources::available_memory()
            .and_then(|b| usize::try_from(b).ok())
            .unwrap_or(MAX_MESSAGE_BYTES * 64 * 4);
        Self::with_budget(bytes / 4)
    }

    /// An assembler that refuses an update of more than `values` values in all.
    pub fn with_budget(values: usize) -> Self {
        Self {
            header: None,
            tensors: Vec::new(),
            missing: 0,
            budget: values,
            announced: 0,
        }
    }

    fn error(&self, message: impl Into<String>) -> DecodeError {
        DecodeError::Weights {
            version: self.header.as_ref().map_or(0, |h| h.version),
            message: message.into(),
        }
    }

    /// Add one chunk.
    pub fn push(&mut self, chunk: pb::WeightChunk) -> Result<(), DecodeError> {
        use pb::weight_chunk::Chunk;
        match chunk.chunk.ok_or(DecodeError::Missing("chunk"))? {
            Chunk::Header(h) => {
                if self.header.is_some() {
                    return Err(self.error("a second header"));
                }
                check_header(h.header.as_ref()).map_err(|s| self.error(s.message().to_owned()))?;
                self.header = Some(h);
                Ok(())
            }
            Chunk::Part(part) => {
                if self.header.is_none() {
                    return Err(self.error("a tensor part before the header"));
                }
                if part.data.len() % 4 != 0 {
                    return Err(self.error(format!(
                        "tensor `{}`: {} bytes is not a whole number of f32 values",
                        part.name,
                        part.data.len()
                    )));
                }
                let values = part
                    .data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                let continues = self.missing > 0;
                if continues {
                    let last = self.tensors.last_mut().expect("a tensor is open");
                    if last.name != part.name || part.offset as usize != last.data.len() {
                        return Err(DecodeError::Weights {
                            version: self.header.as_ref().map_or(0, |h| h.version),
                            message: format!(
                                "tensor `{}` stops at {} of {} values, then `{}` at offset {} arrives",
                                last.name,
                                last.data.len(),
                                last.data.len() + self.missing,
                                part.name,
                                part.offset
                            ),
                        });
                    }
                } else {
                    if part.offset != 0 {
                        return Err(self.error(format!(
                            "tensor `{}` starts at offset {}",
                            part.name, part.offset
                        )));
                    }
                    let size = part
                        .shape
                        .iter()
                        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
                        .filter(|&n| n <= MAX_MESSAGE_BYTES * 64)
                        .ok_or_else(|| {
                            self.error(format!(
                                "tensor `{}` has the impossible shape {:?}",
                                part.name, part.shape
                            ))
                        })?;
                    let announced = self.announced.saturating_add(size);
                    if announced > self.budget {
                        return Err(self.error(format!(
                            "tensor `{}` of shape {:?} takes the update to {} values, more than the {} this server can hold",
                            part.name, part.shape, announced, self.budget
                        )));
                    }
                    self.announced = announced;
                    self.tensors.push(NamedTensor {
                        name: part.name.clone(),
                        shape: part.shape.iter().map(|&d| d as usize).collect(),
                        // grown as values arrive, never ahead of them
                        data: Vec::new(),
                    });
                    self.missing = size;
                }
                let n = part.data.len() / 4;
                if n > self.missing {
                    return Err(self.error(format!(
                        "tensor `{}` gets {n} values where {} remain",
                        part.name, self.missing
                    )));
                }
                let tensor = self.tensors.last_mut().expect("a tensor is open");
                let at = tensor.data.len();
                tensor.data.extend(values);
                if let Some(i) = tensor.data[at..].iter().position(|v| !v.is_finite()) {
                    return Err(DecodeError::Weights {
                        version: self.header.as_ref().map_or(0, |h| h.version),
                        message: format!(
                            "tensor `{}` holds {} at index {}: weights must be finite",
                            part.name,
                            tensor.data[at + i],
                            at + i
                        ),
                    });
                }
                self.missing -= n;
                Ok(())
            }
        }
    }

    /// The update, once every chunk is in and the checksum agrees.
    pub fn finish(mut self) -> Result<Received, DecodeError> {
        let Some(header) = &self.header else {
            return Err(self.error("no header"));
        };
        if self.missing > 0 {
            return Err(self.error(format!(
                "the stream ended {} values short of tensor `{}`",
                self.missing,
                self.tensors.last().map_or("", |t| t.name.as_str())
            )));
        }
        if self.tensors.len() != header.tensors as usize {
            return Err(self.error(format!(
                "{} tensors announced, {} received",
                header.tensors,
                self.tensors.len()
            )));
        }
        let sum = weights_sha256(&self.tensors);
        if sum != header.sha256 {
            return Err(self.error(format!(
                "sha256 {sum} of what arrived differs from the sender's {}",
                header.sha256
            )));
        }
        let architecture: Value =
            serde_json::from_str(&header.architecture_json).map_err(|source| {
                DecodeError::Json {
                    field: "architecture_json",
                    source,
                }
            })?;
        let version = header.version;
        if header.adapter_config_json.is_empty() {
            return Ok(Received {
                update: WeightUpdate::new(version, self.tensors).with_architecture(architecture),
                base_sha256: None,
            });
        }
        let config: Value =
            serde_json::from_str(&header.adapter_config_json).map_err(|source| {
                DecodeError::Json {
                    field: "adapter_config_json",
                    source,
                }
            })?;
        let count = header.adapter_tensors as usize;
        if count == 0 || count > self.tensors.len() {
            return Err(self.error(format!(
                "an adapter of {count} tensors in an update of {}",
                self.tensors.len()
            )));
        }
        let base_sha256 = header.base_sha256.clone();
        let adapter = self.tensors.split_off(self.tensors.len() - count);
        if !self.tensors.is_empty() {
            let sum = weights_sha256(&self.tensors);
            if sum != base_sha256 {
                return Err(self.error(format!(
                    "the base that arrived has sha256 {sum}, the sender's is {base_sha256}"
                )));
            }
        }
        let update = WeightUpdate::adapted(
            version,
            Arc::new(self.tensors),
            areal_sdk::Adapter {
                config,
                tensors: adapter,
            },
        )
        .with_architecture(architecture);
        Ok(Received {
            update,
            base_sha256: Some(base_sha256),
        })
    }
}

#[cfg(test)]
mod tests;
