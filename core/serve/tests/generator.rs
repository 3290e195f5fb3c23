//! Generator servers on real sockets (loopback): the `remote` generator through them, weights
//! streamed and through a shared folder, a server that joins late, one that dies mid-sample,
//! every server gone, and messages a server must refuse without falling over.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use areal_proto::pb;
use areal_proto::pb::generator_client::GeneratorClient;
use areal_sdk::{FinishReason, Generator, WeightUpdate};
use areal_sdk_train::Policy;
use areal_serve::{GeneratorFleet, Listen, serve_generator};
use areal_testkit::{BigramGenerator, conformance};
use serde_json::json;
use support::{Chained, ServerThread, bigram, eventually, policy, request};

mod support;

/// A generator server of the testkit's bigram generator, which sleeps `token_delay_us` after
/// each token.
struct Server;

impl Server {
    fn start(token_delay_us: u64) -> ServerThread {
        Self::start_on("127.0.0.1:0".parse().unwrap(), token_delay_us)
    }

    fn start_on(addr: SocketAddr, token_delay_us: u64) -> ServerThread {
        ServerThread::start(Listen::new(addr, None), move |listen, on_bound| {
            let generator = Arc::new(bigram(token_delay_us));
            serve_generator(generator, 1 << 22, listen, on_bound, std::future::pending())
        })
    }
}

fn remote(endpoints: Vec<String>, extra: serde_json::Value) -> GeneratorFleet {
    support::server::fleet("remote", endpoints, extra)
}

async fn health(url: &str) -> Option<pb::GeneratorHealth> {
    let mut client = GeneratorClient::connect(url.to_owned()).await.ok()?;
    let ping = pb::Ping {
        header: Some(areal_proto::header()),
    };
    client.health(ping).await.ok().map(|r| r.into_inner())
}

/// Two servers behind one `remote` generator pass the check every generator plugin passes:
/// weights load on both, completions are well formed and carry the loaded version, greedy
/// decoding is deterministic, and the interruption protocol holds across servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_served_generators_pass_the_conformance_check_through_the_wire() {
    let (a, b) = (Server::start(200), Server::start(200));
    let generator = Arc::new(remote(vec![a.url(), b.url()], json!({})));
    let policy = policy();
    let weights = WeightUpdate::new(3, policy.weights());
    conformance::check_generator(
        generator.clone(),
        weights,
        policy.tokenizer().as_ref(),
        "cab",
    )
    .await;
    assert_eq!(generator.reissued(), 0);
    assert_eq!(generator.endpoint_failures(), 0);
    for server in [&a, &b] {
        let h = health(&server.url()).await.unwrap();
        assert_eq!((h.plugin.as_str(), h.paused), ("testkit-bigram", false));
        assert!(h.version.is_some(), "every server holds the weights");
    }
}

/// With `weights_dir`, each version is written once and every server loads it from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_go_through_a_shared_folder_when_there_is_one() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Server::start(0), Server::start(0));
    let generator = remote(vec![a.url(), b.url()], json!({ "weights_dir": dir.path() }));
    let policy = policy();
    for version in [4, 5] {
        generator
            .update_weights(WeightUpdate::new(version, policy.weights()))
            .await
            .unwrap();
        // the first update may come before the probes found the servers
        eventually("both servers hold the weights", async || {
            let (ha, hb) = (health(&a.url()).await, health(&b.url()).await);
            ha.and_then(|h| h.version) == Some(version)
                && hb.and_then(|h| h.version) == Some(version)
        })
        .await;
        let c = generator.generate(request(1, 6)).await.unwrap();
        assert!(c.versions.iter().all(|&v| v == version), "{:?}", c.versions);
    }
    assert!(dir.path().join("v0000000005/model.safetensors").exists());
}

/// A server that starts after the weights were sent is brought to the current version by its
/// probe before it gets work, then shares the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_joins_late_is_brought_to_the_current_weights() {
    let a = Server::start(0);
    let late_addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let late_url = format!("http://{late_addr}");
    let generator = remote(vec![a.url(), late_url.clone()], json!({}));
    let policy = policy();
    eventually("the first server takes work", async || {
        health(&a.url()).await.is_some()
    })
    .await;
    generator
        .update_weights(WeightUpdate::new(7, policy.weights()))
        .await
        .unwrap();
    let c = generator.generate(request(1, 4)).await.unwrap();
    assert_eq!(c.versions, vec![7; 4]);
    let late = Server::start_on(late_addr, 0);
    eventually("the late server holds version 7", async || {
        health(&late.url()).await.and_then(|h| h.version) == Some(7)
    })
    .await;
    // the server holds the weights a moment before its probe has heard back and marks it ready
    eventually(
        "the fleet counts the late server ready at version 7",
        async || {
            generator
                .report()
                .contains(&format!("{late_url} (ready, holding version 7)"))
        },
    )
    .await;
    assert_eq!(
        generator.endpoint_failures(),
        0,
        "a server never seen is not a failure"
    );
}

/// A server killed while it has samples costs each of them one re-issue to the other server:
/// every sample completes, with the version that was loaded, and the death counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_sample_costs_one_reissue_per_sample_and_loses_none() {
    // 4 s a sample on the slow server: whatever it is given is in flight when it dies
    let slow = Server::start(200_000);
    let fast = Server::start(0);
    let generator = Arc::new(remote(vec![slow.url(), fast.url()], json!({})));
    let policy = policy();
    generator
        .update_weights(WeightUpdate::new(2, policy.weights()))
        .await
        .unwrap();
    eventually("both servers hold the weights", async || {
        generator.report().matches("holding version 2").count() == 2
    })
    .await;
    let mut samples = tokio::task::JoinSet::new();
    for id in 0..16 {
        let generator = generator.clone();
        samples.spawn(async move { generator.generate(request(id, 20)).await });
    }
    // the least loaded of two: about half went to the slow server
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(slow);
    let mut done = 0;
    while let Some(result) = samples.join_next().await {
        let c = result.unwrap().unwrap();
        assert_eq!(c.len(), 20);
        assert_eq!(c.finish_reason, FinishReason::Length);
        assert!(c.versions.iter().all(|&v| v == 2));
        done += 1;
    }
    assert_eq!(done, 16);
    assert!(generator.reissued() >= 1, "the slow server had samples");
    assert!(generator.reissued() <= 16);
    assert_eq!(generator.endpoint_failures(), 1, "one server died once");
}

/// With every server gone for the grace period, calls fail naming each endpoint and what it
/// last said; from then on they fail at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_gone_for_the_grace_period_fails_naming_them() {
    let gone = Server::start(0);
    let url = gone.url();
    drop(gone);
    let generator = remote(vec![url.clone()], json!({ "grace_s": 2.0 }));
    let started = Instant::now();
    let error = generator
        .generate(request(3, 4))
        .await
        .unwrap_err()
        .chained();
    assert!(
        error.contains("no generator server has taken work")
            && error.contains(&url)
            && error.contains("unreachable")
            && error.contains("sample 3"),
        "{error}"
    );
    assert!(started.elapsed() >= Duration::from_millis(1900));
    let again = Instant::now();
    assert!(generator.generate(request(4, 4)).await.is_err());
    assert!(
        // half the grace period, which a second wait would take whole
        again.elapsed() < Duration::from_millis(1000),
        "no second wait"
    );
}

/// Another protocol version, a malformed request and damaged weights get a clear error each;
/// the server goes on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_refused_and_the_server_survives() {
    use pb::weight_chunk::Chunk;
    let server = Server::start(0);
    let mut client = GeneratorClient::connect(server.url()).await.unwrap();
    let mut wire = areal_proto::generate_request(&request(1, 4));
    wire.header = Some(pb::Header { protocol: 99 });
    let status = client.generate(wire.clone()).await.err().unwrap();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("protocol version 99"),
        "{}",
        status.message()
    );
    wire.header = Some(areal_proto::header());
    wire.sampling = None;
    let status = client.generate(wire).await.err().unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("sampling"),
        "{}",
        status.message()
    );

    let policy = policy();
    let mut chunks = areal_proto::weight_chunks(&WeightUpdate::new(1, policy.weights()), 16);
    if let Some(Chunk::Part(p)) = &mut chunks[1].chunk {
        let mut data = p.data.to_vec();
        data[0] ^= 1;
        p.data = data.into();
    }
    let status = client
        .update_weights(tokio_stream_iter(chunks))
        .await
        .err()
        .unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("sha256"), "{}", status.message());

    // a generate before any weights: the plugin's failure, not the server's
    let status = client
        .generate(areal_proto::generate_request(&request(2, 4)))
        .await
        .err()
        .unwrap();
    assert_eq!(status.code(), tonic::Code::Aborted);
    assert!(
        status.message().contains("before any weights"),
        "{}",
        status.message()
    );

    let h = health(&server.url()).await.expect("still answering");
    assert_eq!(h.version, None);
    assert_eq!(h.protocol, areal_proto::PROTOCOL_VERSION);
}

fn tokio_stream_iter(
    chunks: Vec<pb::WeightChunk>,
) -> impl tokio_stream::Stream<Item = pb::WeightChunk> + Send + 'static {
    tokio_stream::iter(chunks)
}

/// A weight load that takes longer than the grace period does not count as every server gone:
/// a sample asked for meanwhile waits for the load and then runs on the new weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_longer_than_the_grace_period_is_not_taken_for_dead_servers() {
    let server = Server::start(0);
    let generator = Arc::new(remote(vec![server.url()], json!({ "grace_s": 0.05 })));
    let policy = policy();
    generator
        .update_weights(WeightUpdate::new(0, policy.weights()))
        .await
        .unwrap();
    eventually("the server holds version 0", async || {
        generator.report().contains("holding version 0")
    })
    .await;
    // 128 MB: long enough to load that a sample comes in the middle
    let mut tensors = policy.weights();
    tensors.push(areal_sdk::NamedTensor {
        name: "padding".into(),
        shape: vec![1 << 25],
        data: vec![0.25; 1 << 25],
    });
    let loading = {
        let generator = generator.clone();
        tokio::spawn(async move {
            generator
                .update_weights(WeightUpdate::new(1, tensors))
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !generator.report().contains("loading weights of version 1") {
        assert!(
            Instant::now() < deadline,
            "never loading: {}",
            generator.report()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let c = generator.generate(request(1, 4)).await.unwrap();
    assert_eq!(c.versions, vec![1; 4], "it waited for the new weights");
    loading.await.unwrap().unwrap();
    assert_eq!(generator.endpoint_failures(), 0);
}

/// The bigram generator, lying as asked: its tokens carry a version the run never sent, or
/// it streams ten times the tokens asked for.
struct Lying {
    inner: BigramGenerator,
    lie: &'static str,
}

#[areal_sdk::async_trait]
impl Generator for Lying {
    fn name(&self) -> &str {
        "lying"
    }

    async fn generate(
        &self,
        mut request: areal_sdk::GenerateRequest,
    ) -> Result<areal_sdk::Completion, areal_sdk::PluginError> {
        if self.lie == "endless" {
            request.max_new_tokens *= 10;
        }
        let mut c = self.inner.generate(request).await?;
        if self.lie == "version" {
            c.versions.iter_mut().for_each(|v| *v = 999_999);
        }
        if self.lie == "vocab" {
            c.token_ids.iter_mut().for_each(|t| *t = 1000);
        }
        Ok(c)
    }

    async fn update_weights(&self, update: WeightUpdate) -> Result<(), areal_sdk::PluginError> {
        if self.lie == "stuck" && update.version > 0 {
            std::future::pending::<()>().await;
        }
        self.inner.update_weights(update).await
    }
}

impl Lying {
    /// A generator server of the bigram generator lying as `lie` says.
    fn serve(lie: &'static str) -> ServerThread {
        ServerThread::start(
            Listen::new("127.0.0.1:0".parse().unwrap(), None),
            move |listen, on_bound| {
                let generator = Arc::new(Lying {
                    inner: bigram(0),
                    lie,
                });
                serve_generator(generator, 1 << 22, listen, on_bound, std::future::pending())
            },
        )
    }
}

/// This process's resident memory, in bytes.
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// Issue 32, what a peer controls: a 4-byte part claiming shape [2^34] (a 64 GiB reservation
/// before any data arrived), NaN weights with a matching checksum, a NaN temperature and a
/// request for more tokens than the server's bound are each refused by name, and the server
/// answers on; tokens of a version the run never sent, more tokens than asked for, or ids
/// outside the trainer's vocabulary are refused by the client naming the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_peer_sends_is_checked_before_it_is_held_or_trained_on() {
    use pb::weight_chunk::Chunk;
    let server = Server::start(0);
    let mut client = GeneratorClient::connect(server.url()).await.unwrap();
    let policy = policy();
    let before = resident();
    let mut chunks = areal_proto::weight_chunks(&WeightUpdate::new(1, policy.weights()), 1 << 20);
    chunks.truncate(1);
    chunks.push(pb::WeightChunk {
        chunk: Some(Chunk::Part(pb::TensorPart {
            name: "huge".into(),
            shape: vec![1 << 34],
            offset: 0,
            data: vec![0u8; 4].into(),
        })),
    });
    let status = client
        .update_weights(tokio_stream_iter(chunks))
        .await
        .err()
        .unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("`huge`"), "{}", status.message());
    assert!(
        resident() < before + (256 << 20),
        "the server took {} MB for a 4-byte part",
        (resident() - before) >> 20
    );

    let mut tensors = policy.weights();
    tensors[0].data[1] = f32::NAN;
    let status = client
        .update_weights(tokio_stream_iter(areal_proto::weight_chunks(
            &WeightUpdate::new(1, tensors),
            16,
        )))
        .await
        .err()
        .unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("finite"), "{}", status.message());

    let held = client
        .update_weights(tokio_stream_iter(areal_proto::weight_chunks(
            &WeightUpdate::new(1, policy.weights()),
            16,
        )))
        .await
        .unwrap();
    assert_eq!(held.into_inner().version, 1);
    let mut nan = request(1, 4);
    nan.sampling.temperature = f32::NAN;
    let mut greedy_forever = request(2, 4);
    greedy_forever.max_new_tokens = (1 << 22) + 1;
    for (bad, says) in [
        (nan, "temperature NaN"),
        (greedy_forever, "bound of 4194304"),
    ] {
        let status = client
            .generate(areal_proto::generate_request(&bad))
            .await
            .err()
            .unwrap();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(says), "{}", status.message());
    }
    assert!(health(&server.url()).await.is_some(), "still answering");

    for (lie, says) in [
        (
            "version",
            "weight version 999999, which this run never sent",
        ),
        (
            "endless",
            "40 tokens streamed for a request of max_new_tokens 4",
        ),
        (
            "vocab",
            "token id 1000 is outside the trainer's vocabulary of",
        ),
    ] {
        let liar = Lying::serve(lie);
        let generator = remote(vec![liar.url()], json!({}));
        generator
            .check_tokenizer(policy.tokenizer().as_ref())
            .await
            .unwrap();
        generator
            .update_weights(WeightUpdate::new(3, policy.weights()))
            .await
            .unwrap();
        let e = generator
            .generate(request(1, 4))
            .await
            .unwrap_err()
            .chained();
        assert!(e.contains(&liar.url()) && e.contains(says), "{lie}: {e}");
    }
}

/// Issue 32: a server that answers its health checks but never finishes a weight load kept the
/// run waiting for ever (each new attempt counted as a live server, so `grace_s` never fired).
/// Now the wait ends after the grace period and one load's time, naming the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_never_finish_a_load_do_not_keep_the_run_waiting() {
    let stuck = Lying::serve("stuck");
    let generator = remote(
        vec![stuck.url()],
        json!({ "grace_s": 0.5, "weights_timeout_s": 0.5 }),
    );
    let policy = policy();
    generator
        .update_weights(WeightUpdate::new(0, policy.weights()))
        .await
        .unwrap();
    generator.generate(request(1, 2)).await.unwrap();
    // version 1 never loads: every attempt times out, and the next one starts
    let _ = generator
        .update_weights(WeightUpdate::new(1, policy.weights()))
        .await;
    let started = Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(60), generator.generate(request(2, 2)))
        .await
        .expect("the wait ends")
        .unwrap_err()
        .chained();
    assert!(
        e.contains("no generator server has taken work") && e.contains(&stuck.url()),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Issue 32: a server ignored SIGTERM while any client held a connection open (a silent TCP
/// socket, a stalled weight stream), and silent connections were kept for ever (under a
/// 256-descriptor limit they lock every other client out). Now a silent connection is closed
/// after 10 s, and a shutdown ends within its 5 s grace whatever the clients do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_and_silent_connections_are_bounded_whatever_clients_do() {
    use tokio::io::AsyncReadExt;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound, addr) = tokio::sync::oneshot::channel();
    let generator = Arc::new(bigram(0));
    let server = tokio::spawn(serve_generator(
        generator,
        1 << 22,
        Listen::new("127.0.0.1:0".parse().unwrap(), None),
        move |a| bound.send(a).unwrap(),
        async move {
            let _ = stopped.await;
        },
    ));
    let addr = addr.await.unwrap();
    // a socket that never says anything is closed unread
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(60), silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the silent connection stays open: {read:?}"
    );
    // a weight stream that stops after its header, and another silent socket, at shutdown
    let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut client = GeneratorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let header =
        areal_proto::weight_chunks(&WeightUpdate::new(1, policy().weights()), 16).remove(0);
    tx.send(header).await.unwrap();
    let stalled = tokio::spawn(async move {
        client
            .update_weights(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let signalled = Instant::now();
    stop.send(()).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), server).await;
    assert!(
        ended.is_ok(),
        "the server ignored its shutdown with clients holding on"
    );
    assert!(signalled.elapsed() < Duration::from_secs(60));
    drop(tx);
    let _ = stalled.await;
}

/// A TCP relay to `to` that hands what the server sends to the client a few bytes at a
/// time, so that each HTTP/2 frame arrives on its own (as on a busy or distant link: a
/// sample's last event reaches the client before the trailers that end its stream), and
/// counts the streams the client resets (its `RST_STREAM` frames).
async fn trickling_relay(to: String) -> (String, Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let to = to.trim_start_matches("http://").to_owned();
    let resets = Arc::new(AtomicU64::new(0));
    let counted = resets.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(&to).await.unwrap();
            client.set_nodelay(true).unwrap();
            let (mut client_in, mut client_out) = client.into_split();
            let (mut server_in, mut server_out) = server.into_split();
            let resets = counted.clone();
            tokio::spawn(async move {
                // the client's preface, then frames: 3 bytes of length, the type, ...
                let mut preface = [0u8; 24];
                client_in.read_exact(&mut preface).await?;
                server_out.write_all(&preface).await?;
                loop {
                    let mut head = [0u8; 9];
                    client_in.read_exact(&mut head).await?;
                    let len = usize::from(head[0]) << 16
                        | usize::from(head[1]) << 8
                        | usize::from(head[2]);
                    let mut payload = vec![0u8; len];
                    client_in.read_exact(&mut payload).await?;
                    if head[3] == 0x3 {
                        resets.fetch_add(1, Ordering::SeqCst);
                    }
                    server_out.write_all(&head).await?;
                    server_out.write_all(&payload).await?;
                }
                #[expect(unreachable_code, reason = "the loop ends with the connection")]
                Ok::<(), std::io::Error>(())
            });
            tokio::spawn(async move {
                let mut buf = [0u8; 16];
                loop {
                    match server_in.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if client_out.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                            tokio::task::yield_now().await;
                        }
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), resets)
}

/// Thousands of generations on one connection, each read to its last event while the
/// server's trailers are still on the way: the client resets none of their streams, so the
/// connection lives on however long the run (a stream dropped before its end is reset, and h2
/// ends a connection after 1 024 of the resets it has to make itself for frames that then
/// reach a stream it has forgotten: `locally-reset streams reached limit (1024)`). Samples
/// abandoned mid-way are reset, as they must be (the server stops sampling them), and the
/// connection still serves every sample after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_generations_reset_no_stream_and_wear_out_no_connection() {
    use std::sync::atomic::Ordering;
    let server = Server::start(0);
    let (relay, resets) = trickling_relay(server.url()).await;
    let generator = Arc::new(remote(vec![relay], json!({})));
    let policy = policy();
    generator
        .update_weights(WeightUpdate::new(1, policy.weights()))
        .await
        .unwrap();
    let mut next = 0u64;
    let mut generate = async |abandon: bool| {
        let mut calls = tokio::task::JoinSet::new();
        for k in 0..100u64 {
            next += 1;
            let (generator, request) = (generator.clone(), request(next, 8));
            calls.spawn(async move {
                if abandon {
                    let sample = generator.generate(request);
                    let _ =
                        tokio::time::timeout(Duration::from_micros(50 * (k % 10)), sample).await;
                } else {
                    let completion = generator.generate(request).await.expect("every sample");
                    assert_eq!(completion.token_ids.len(), 8);
                }
            });
        }
        while let Some(done) = calls.join_next().await {
            done.unwrap();
        }
    };
    for _ in 0..30 {
        generate(false).await;
    }
    assert_eq!(
        resets.load(Ordering::SeqCst),
        0,
        "3 000 samples read to their end"
    );
    for _ in 0..5 {
        generate(true).await;
    }
    for _ in 0..5 {
        generate(false).await;
    }
    // (a server's guard against floods of resets ended the connection here: 20 reset before
    // it took them, and every sample after was cut and sent again)
    assert_eq!(generator.endpoint_failures(), 0);
    assert_eq!(generator.reissued(), 0);
}
