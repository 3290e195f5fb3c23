//! Round trips through the wire format, and what a peer may get wrong.

use super::*;
use serde_json::json;

fn tensors() -> Vec<NamedTensor> {
    vec![
        NamedTensor {
            name: "embed.weight".into(),
            shape: vec![3, 4],
            data: (0..12).map(|i| i as f32 * 0.5 - 1.0).collect(),
        },
        NamedTensor {
            name: "norm.weight".into(),
            shape: vec![4],
            data: vec![1.0, -0.0, f32::MIN_POSITIVE, 3.25],
        },
        NamedTensor {
            name: "empty".into(),
            shape: vec![0],
            data: vec![],
        },
    ]
}

fn update() -> WeightUpdate {
    WeightUpdate::new(7, tensors()).with_architecture(json!({"hidden_size": 4}))
}

fn assemble(chunks: Vec<pb::WeightChunk>) -> Result<WeightUpdate, DecodeError> {
    let mut a = WeightAssembler::new();
    for c in chunks {
        a.push(c)?;
    }
    a.finish().map(|r| r.update)
}

#[test]
fn weights_arrive_bit_for_bit_whatever_the_part_size() {
    for part in [1, 3, 5, 1 << 20] {
        let got = assemble(weight_chunks(&update(), part)).unwrap();
        assert_eq!(got.version, 7);
        assert_eq!(*got.tensors, tensors(), "part size {part}");
        assert_eq!(*got.architecture, json!({"hidden_size": 4}));
        let bits = |ts: &[NamedTensor]| -> Vec<u32> {
            ts.iter()
                .flat_map(|t| t.data.iter().map(|v| v.to_bits()))
                .collect()
        };
        assert_eq!(bits(&got.tensors), bits(&tensors()), "-0.0 stays -0.0");
    }
}

#[test]
fn damaged_or_incomplete_weights_are_refused_with_the_reason() {
    use pb::weight_chunk::Chunk;
    // one value flipped in transit: the checksum says so
    let mut chunks = weight_chunks(&update(), 4);
    if let Some(Chunk::Part(p)) = &mut chunks[1].chunk {
        let mut data = p.data.to_vec();
        data[0] ^= 1;
        p.data = data.into();
    }
    let e = assemble(chunks).unwrap_err().to_string();
    assert!(e.contains("version 7") && e.contains("sha256"), "{e}");
    // a part lost
    let mut chunks = weight_chunks(&update(), 4);
    chunks.remove(2);
    let e = assemble(chunks).unwrap_err().to_string();
    assert!(e.contains("embed.weight"), "{e}");
    // the stream cut short
    let mut chunks = weight_chunks(&update(), 4);
    chunks.truncate(2);
    let e = assemble(chunks).unwrap_err().to_string();
    assert!(e.contains("short") || e.contains("announced"), "{e}");
    // parts before the header, a second header
    let chunks = weight_chunks(&update(), 4);
    let e = assemble(chunks[1..].to_vec()).unwrap_err().to_string();
    assert!(e.contains("before the header"), "{e}");
    let mut chunks = weight_chunks(&update(), 4);
    chunks.push(chunks[0].clone());
    let e = assemble(chunks).unwrap_err().to_string();
    assert!(e.contains("second header"), "{e}");
    // a shape whose size overflows is refused before anything is allocated
    let mut chunks = weight_chunks(&update(), 1 << 20);
    if let Some(Chunk::Part(p)) = &mut chunks[1].chunk {
        p.shape = vec![u64::MAX, 2];
    }
    let e = assemble(chunks).unwrap_err().to_string();
    assert!(e.contains("impossible shape"), "{e}");
    // bytes that are not whole f32 values
    let mut chunks = weight_chunks(&update(), 1 << 20);
    if let Some(Chunk::Part(p)) = &mut chunks[1].chunk {
        p.data.truncate(p.data.len() - 1);
    }
    let e = assemble(chunks).unwrap_err().to_string();
    assert!(e.contains("whole number"), "{e}");
}

#[test]
fn another_protocol_version_is_refused_naming_both() {
    assert!(check_header(Some(&header())).is_ok());
    let status = check_header(Some(&pb::Header { protocol: 99 })).unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("99") && status.message().contains("protocol 1"),
        "{}",
        status.message()
    );
    let status = check_header(None).unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    // weights from another version are refused too
    let mut chunks = weight_chunks(&update(), 4);
    if let Some(pb::weight_chunk::Chunk::Header(h)) = &mut chunks[0].chunk {
        h.header = Some(pb::Header { protocol: 2 });
    }
    assert!(
        assemble(chunks)
            .unwrap_err()
            .to_string()
            .contains("protocol")
    );
}

#[test]
fn a_completion_streams_and_comes_back_whole() {
    let completion = Completion {
        token_ids: vec![5, 6, 2],
        behaviour_logprobs: vec![-0.5, -1.25, -0.0],
        versions: vec![3, 3, 4],
        finish_reason: FinishReason::Stop,
    };
    let mut builder = CompletionBuilder::new(16);
    let mut done = None;
    for event in completion_events(&completion) {
        assert!(done.is_none(), "nothing after the finish");
        done = builder.push(event).unwrap();
    }
    assert_eq!(done.unwrap(), completion);
    // an interrupted sample with no tokens yet
    let empty = Completion {
        token_ids: vec![],
        behaviour_logprobs: vec![],
        versions: vec![],
        finish_reason: FinishReason::Interrupted,
    };
    let events = completion_events(&empty);
    assert_eq!(events.len(), 1);
    let mut builder = CompletionBuilder::new(16);
    assert_eq!(builder.push(events[0].clone()).unwrap().unwrap(), empty);
    // lists of different lengths, an unknown finish reason
    let bad = pb::GenerateEvent {
        event: Some(pb::generate_event::Event::Tokens(pb::TokenChunk {
            token_ids: vec![1, 2],
            behaviour_logprobs: vec![-1.0],
            versions: vec![0, 0],
        })),
    };
    assert!(matches!(
        CompletionBuilder::new(16).push(bad),
        Err(DecodeError::ChunkLengths {
            tokens: 2,
            logprobs: 1,
            versions: 2
        })
    ));
    let unknown = pb::GenerateEvent {
        event: Some(pb::generate_event::Event::Finish(pb::Finish { reason: 42 })),
    };
    let e = CompletionBuilder::new(16).push(unknown).unwrap_err();
    assert!(e.to_string().contains("42"), "{e}");
    // Issue 32: an endless stream was kept until the sample ended (3 GB in 10 s); it is cut
    // at the request's budget.
    let mut builder = CompletionBuilder::new(3);
    let mut events = completion_events(&completion);
    assert!(
        builder.push(events.remove(0)).unwrap().is_none(),
        "3 tokens of 3"
    );
    let mut builder = CompletionBuilder::new(2);
    let e = builder
        .push(completion_events(&completion).remove(0))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("3 tokens streamed for a request of max_new_tokens 2"),
        "{e}"
    );
}

#[test]
fn requests_rewards_and_stats_round_trip() {
    let request = GenerateRequest {
        sample_id: 11,
        input_ids: vec![1, 2, 3],
        max_new_tokens: 16,
        sampling: SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            seed: 5,
        },
        stop_token_ids: vec![0],
    };
    assert_eq!(
        from_generate_request(generate_request(&request)).unwrap(),
        request
    );
    let input = RewardInput {
        metadata: json!({"data_source": "chain-sum", "split": "train"})
            .as_object()
            .cloned()
            .unwrap(),
        sample_id: 9,
        item_id: "item-3".into(),
        prompt: "a5b8=".into(),
        completion: "a5=5,b8=13>13".into(),
        completion_ids: vec![4, 5],
        finish_reason: FinishReason::Length,
        reference: json!({"terms": [5, 8], "answer": 13}),
    };
    let (back, deadline) =
        from_reward_input(reward_input(&input, Duration::from_millis(2500))).unwrap();
    assert_eq!(
        (back, deadline),
        (input.clone(), Duration::from_millis(2500))
    );
    let reward = Reward::new(0.5, Verdict::Partial)
        .with_version("math 1")
        .with_limit("timeout_s", 6)
        .with_detail("failed_test", 2);
    assert_eq!(from_reward(super::reward(&reward)).unwrap(), reward);
    let mut stats = GeneratorStats::default().with_resumes(2, 1, 0.25);
    stats.tokens = 40;
    assert_eq!(from_stats(&super::stats(&stats)), stats);
    let measured = GeneratorStats::new(1.5, 40);
    assert_eq!(from_stats(&super::stats(&measured)), measured);
    // malformed data from a peer is an error, never a panic
    let mut bad = reward_input(&input, Duration::ZERO);
    bad.reference_json = "{not json".into();
    assert!(matches!(
        from_reward_input(bad),
        Err(DecodeError::Json {
            field: "reference_json",
            ..
        })
    ));
    let mut bad = super::reward(&reward);
    bad.verdict = 0;
    assert!(from_reward(bad).is_err());
    let mut bad = super::reward(&reward);
    bad.provenance.as_mut().unwrap().details_json = "[1]".into();
    assert!(matches!(from_reward(bad), Err(DecodeError::NotAnObject(_))));
}

/// Issue 32: one 4-byte part claiming shape [2^32] made the server reserve 16 GiB before any
/// data arrived (it aborted under an 8 GiB limit). A shape past the receiver's budget is
/// refused before anything is allocated, and within it nothing is reserved ahead of the
/// values that arrive.
#[test]
fn what_a_peer_announces_is_checked_before_anything_is_allocated() {
    use pb::weight_chunk::Chunk;
    let header = weight_chunks(&update(), 4).remove(0);
    let claim = |shape: Vec<u64>| pb::WeightChunk {
        chunk: Some(Chunk::Part(pb::TensorPart {
            name: "huge".into(),
            shape,
            offset: 0,
            data: vec![0u8; 4].into(),
        })),
    };
    // 2^32 values of f32 are 16 GiB: past a budget of 8 GiB
    let mut a = WeightAssembler::with_budget(2 << 30);
    a.push(header.clone()).unwrap();
    let e = a.push(claim(vec![1 << 32])).unwrap_err().to_string();
    assert!(
        e.contains("`huge`") && e.contains("[4294967296]") && e.contains("can hold"),
        "{e}"
    );
    // within the budget, the claim costs what arrived, not what it announced
    let mut a = WeightAssembler::with_budget(usize::MAX);
    a.push(header.clone()).unwrap();
    a.push(claim(vec![1 << 30])).unwrap();
    assert!(
        a.tensors[0].data.capacity() < 1 << 10,
        "{}",
        a.tensors[0].data.capacity()
    );
    // the budget counts the whole update, tensor after tensor
    let mut a = WeightAssembler::with_budget(12 + 4);
    let e = assemble_with(&mut a, weight_chunks(&update(), 4));
    assert!(e.is_ok(), "{e:?}");
    let mut a = WeightAssembler::with_budget(12 + 3);
    let e = assemble_with(&mut a, weight_chunks(&update(), 4)).unwrap_err();
    assert!(e.to_string().contains("`norm.weight`"), "{e}");
    // the machine's own budget is what its memory holds
    assert!(WeightAssembler::new().budget > 0);
}

fn assemble_with(a: &mut WeightAssembler, chunks: Vec<pb::WeightChunk>) -> Result<(), DecodeError> {
    for c in chunks {
        a.push(c)?;
    }
    Ok(())
}

/// Issue 32: NaN or infinite weights with a matching checksum were loaded, and generation
/// then answered NaN logprobs as if all were well. They are refused, naming the tensor.
#[test]
fn weights_that_are_not_finite_are_refused() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut ts = tensors();
        ts[1].data[2] = bad;
        let update = WeightUpdate::new(3, ts);
        let e = assemble(weight_chunks(&update, 2)).unwrap_err().to_string();
        assert!(
            e.contains("`norm.weight`") && e.contains("index 2") && e.contains("finite"),
            "{e}"
        );
    }
}

/// An adapter travels alone over a base the receiver holds, or with its base; either way it
/// arrives bit for bit, with the sha256 of its base.
#[test]
fn an_adapter_arrives_alone_or_with_its_base() {
    let adapter = areal_sdk::Adapter {
        config: json!({"r": 2, "lora_alpha": 4}),
        tensors: vec![NamedTensor {
            name: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight".into(),
            shape: vec![2, 3],
            data: vec![0.5, -1.0, 2.0, 0.25, 3.0, -0.125],
        }],
    };
    let update = WeightUpdate::adapted(9, std::sync::Arc::new(tensors()), adapter.clone())
        .with_architecture(json!({"hidden_size": 4}));
    let base = crate::weights_sha256(&update.tensors);
    let receive = |chunks: Vec<pb::WeightChunk>| {
        let mut a = WeightAssembler::new();
        for c in chunks {
            a.push(c).unwrap();
        }
        a.finish()
    };
    let alone = receive(crate::adapter_chunks(&update, &base, false, 4)).unwrap();
    assert_eq!(alone.base_sha256.as_deref(), Some(base.as_str()));
    assert!(alone.update.tensors.is_empty());
    assert_eq!(alone.update.adapter.as_deref(), Some(&adapter));
    assert_eq!(alone.update.version, 9);
    let whole = receive(crate::adapter_chunks(&update, &base, true, 4)).unwrap();
    assert_eq!(*whole.update.tensors, tensors());
    assert_eq!(whole.update.adapter.as_deref(), Some(&adapter));
    // a base that is not the one named is refused
    let e = receive(crate::adapter_chunks(&update, &"0".repeat(64), true, 4)).unwrap_err();
    assert!(
        e.to_string().contains("the base that arrived has sha256"),
        "{e}"
    );
}
