//! Reward servers on real sockets (loopback): the `remote` reward through them, a dead server,
//! the token.

use std::sync::Arc;
use std::time::Duration;

use areal_sdk::{FinishReason, RewardInput, RewardVerifier, VerifyContext};
use areal_serve::{
    Listen, RemoteRewardOptions, RemoteVerifier, ServeError, ServerTls, serve_reward,
};
use areal_testkit::{SuccessorVerifier, conformance};
use serde_json::json;

#[path = "support/server.rs"]
mod server;
use server::{Chained, ServerThread, explained};

/// A reward server on its own thread and runtime; dropped, it is killed.
struct Server;

impl Server {
    fn start(token: Option<&str>) -> ServerThread {
        Self::start_listening(Listen::new(
            "127.0.0.1:0".parse().unwrap(),
            token.map(str::to_owned),
        ))
    }

    fn start_listening(listen: Listen) -> ServerThread {
        ServerThread::start(listen, |listen, on_bound| async move {
            let config = areal_core::RewardServiceConfig {
                threads: 2,
                ..Default::default()
            };
            serve_reward(
                Arc::new(SuccessorVerifier),
                &config,
                listen,
                on_bound,
                std::future::pending(),
            )
            .await
        })
    }
}

fn options(endpoints: Vec<String>) -> RemoteRewardOptions {
    serde_json::from_value(json!({
        "endpoints": endpoints,
        "connect_timeout_s": 2.0,
        "grace_s": 0.5,
        "probe_interval_s": 0.05,
    }))
    .unwrap()
}

fn input(sample_id: u64, completion: &str) -> RewardInput {
    RewardInput {
        metadata: Default::default(),
        sample_id,
        item_id: "x".into(),
        prompt: "c".into(),
        completion: completion.into(),
        completion_ids: vec![],
        finish_reason: FinishReason::Stop,
        reference: json!({"letters": 8, "length": 4}),
    }
}

fn ctx() -> VerifyContext {
    VerifyContext::with_timeout(Duration::from_secs(30))
}

/// The remote reward passes the same conformance check as the verifier it serves, and its
/// rewards are the served verifier's, with the provenance the server's reward service adds
/// (the verifier's name, its time).
#[test]
fn a_served_verifier_passes_the_conformance_check_through_the_wire() {
    let server = Server::start(None);
    let remote = RemoteVerifier::new(&options(vec![server.url()]), None).unwrap();
    let local = SuccessorVerifier.verify(&input(1, "dex"), &ctx()).unwrap();
    let through = remote.verify(&input(1, "dex"), &ctx()).unwrap();
    assert_eq!(
        (through.value, through.verdict, &through.provenance.details),
        (local.value, local.verdict, &local.provenance.details)
    );
    assert_eq!(
        through.provenance.verifier_version,
        local.provenance.verifier_version
    );
    assert_eq!(through.provenance.verifier, "testkit-successor");
    assert!(through.provenance.wall_ms >= 0.0);
    conformance::check_verifier(
        Arc::new(remote),
        &[
            (input(1, "defg"), 1.0),
            (input(2, "dex"), 0.5),
            (input(3, "dffg"), 0.5),
        ],
    );
}

/// A server that is gone is taken out by its probe and samples go to the live one, none lost;
/// with every server gone for the grace period a sample fails naming each endpoint.
#[test]
fn a_dead_server_is_taken_out_and_every_server_gone_fails_naming_them() {
    let dead = Server::start(None);
    let dead_url = dead.url();
    drop(dead);
    let alive = Server::start(None);
    let remote = RemoteVerifier::new(&options(vec![dead_url.clone(), alive.url()]), None).unwrap();
    for id in 0..4 {
        let reward = remote.verify(&input(id, "defg"), &ctx()).unwrap();
        assert_eq!(reward.value, 1.0);
    }
    assert!(remote.reissued() <= 4, "at most once a sample");
    assert_eq!(
        remote.endpoint_failures(),
        0,
        "a server never up is not a failure"
    );
    let alive_url = alive.url();
    drop(alive);
    let error = remote
        .verify(&input(9, "defg"), &ctx())
        .unwrap_err()
        .chained();
    assert!(
        error.contains(&dead_url)
            && error.contains(&alive_url)
            && error.contains("sample 9")
            && error.contains("grace period"),
        "{error}"
    );
    assert_eq!(remote.endpoint_failures(), 1, "the live one died once");
}

/// A server with a token refuses calls without it, and says where the token goes; any address
/// but loopback needs a token.
#[test]
fn the_token_guards_a_server_and_non_loopback_needs_one() {
    let server = Server::start(Some("s3cret"));
    let without = RemoteVerifier::new(&options(vec![server.url()]), None).unwrap();
    let error = without
        .verify(&input(1, "defg"), &ctx())
        .unwrap_err()
        .chained();
    assert!(error.contains("AREAL_TOKEN"), "{error}");
    let wrong = RemoteVerifier::new(&options(vec![server.url()]), Some("guess")).unwrap();
    let error = wrong
        .verify(&input(1, "defg"), &ctx())
        .unwrap_err()
        .chained();
    assert!(error.contains("wrong token"), "{error}");
    let with = RemoteVerifier::new(&options(vec![server.url()]), Some("s3cret")).unwrap();
    assert_eq!(with.verify(&input(1, "defg"), &ctx()).unwrap().value, 1.0);

    let open = Listen::new("0.0.0.0:0".parse().unwrap(), None);
    assert!(matches!(
        open.check(),
        Err(ServeError::TokenRequired { .. })
    ));
    let guarded = Listen {
        token: Some("s3cret".into()),
        ..open
    };
    assert!(guarded.check().is_ok());
}

/// No endpoint, or a malformed one, is refused when the plugin is built.
#[test]
fn bad_endpoints_are_refused_up_front() {
    let (key, error) = explained(RemoteVerifier::new(&options(vec![]), None).unwrap_err());
    assert_eq!(key, "endpoints");
    assert!(error.contains("at least one endpoint"), "{error}");
    let (key, error) =
        explained(RemoteVerifier::new(&options(vec!["not a url".into()]), None).unwrap_err());
    assert_eq!(key, "endpoints");
    assert!(error.contains("not a url"), "{error}");
    let mut slow = options(vec!["http://127.0.0.1:1".into()]);
    slow.grace_s = -1.0;
    let (key, error) = explained(RemoteVerifier::new(&slow, None).unwrap_err());
    assert_eq!(key, "grace_s");
    assert!(error.contains("-1"), "{error}");
}

/// With a certificate a server speaks TLS: a client that trusts its authority verifies through
/// `https://`, a plain-HTTP client gets nothing, and an `https://` endpoint without an
/// authority to trust is refused when the plugin is built.
#[test]
fn a_tls_server_answers_clients_that_trust_its_authority() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    let tls =
        ServerTls::from_files(&fixtures.join("server.pem"), &fixtures.join("server.key")).unwrap();
    let server = Server::start_listening(Listen {
        tls: Some(tls),
        ..Listen::new("127.0.0.1:0".parse().unwrap(), None)
    });
    let url = format!("https://localhost:{}", server.addr.port());
    let mut trusting = options(vec![url.clone()]);
    trusting.tls_ca_file = Some(fixtures.join("ca.pem"));
    let remote = RemoteVerifier::new(&trusting, None).unwrap();
    assert_eq!(remote.verify(&input(1, "defg"), &ctx()).unwrap().value, 1.0);

    let plain = RemoteVerifier::new(&options(vec![server.url()]), None).unwrap();
    assert!(plain.verify(&input(2, "defg"), &ctx()).is_err());

    let (key, error) = explained(RemoteVerifier::new(&options(vec![url]), None).unwrap_err());
    assert_eq!(key, "endpoints");
    assert!(error.contains("tls_ca_file"), "{error}");
    let mut missing = trusting.clone();
    missing.tls_ca_file = Some(fixtures.join("none.pem"));
    let (key, error) = explained(RemoteVerifier::new(&missing, None).unwrap_err());
    assert_eq!(key, "tls_ca_file");
    assert!(error.contains("none.pem"), "{error}");
    let error = ServerTls::from_files(&fixtures.join("ca.pem"), &fixtures.join("ca.pem"))
        .unwrap_err()
        .chained();
    assert!(error.contains("no PEM private key"), "{error}");
}

/// A reward server that answers every sample with the same value, whatever its verifier.
struct Lying(f64);

#[tonic::async_trait]
impl areal_proto::pb::verifier_server::Verifier for Lying {
    async fn verify(
        &self,
        request: tonic::Request<areal_proto::pb::VerifyBatch>,
    ) -> Result<tonic::Response<areal_proto::pb::VerifyResults>, tonic::Status> {
        use areal_proto::pb;
        let results = request
            .into_inner()
            .samples
            .iter()
            .map(|s| pb::VerifyResult {
                sample_id: s.sample_id,
                outcome: Some(pb::verify_result::Outcome::Reward(pb::Reward {
                    value: self.0,
                    verdict: pb::Verdict::Accepted as i32,
                    provenance: Some(pb::Provenance {
                        verifier: "lying".into(),
                        ..Default::default()
                    }),
                })),
            })
            .collect();
        Ok(tonic::Response::new(pb::VerifyResults { results }))
    }

    async fn health(
        &self,
        _request: tonic::Request<areal_proto::pb::Ping>,
    ) -> Result<tonic::Response<areal_proto::pb::RewardHealth>, tonic::Status> {
        Ok(tonic::Response::new(areal_proto::pb::RewardHealth {
            plugin: "lying".into(),
            protocol: areal_proto::PROTOCOL_VERSION,
            threads: 1,
        }))
    }
}

impl Lying {
    fn serve(value: f64) -> ServerThread {
        ServerThread::start(
            Listen::new("127.0.0.1:0".parse().unwrap(), None),
            move |listen, on_bound| async move {
                let listener = tokio::net::TcpListener::bind(listen.addr).await?;
                on_bound(listener.local_addr()?);
                tonic::transport::Server::builder()
                    .add_service(areal_proto::pb::verifier_server::VerifierServer::new(
                        Lying(value),
                    ))
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                    .await
                    .map_err(std::io::Error::other)
            },
        )
    }
}

/// Issue 32: a reward server's finite 1e308 (or an infinity, a NaN) was refused without
/// naming the server. Each is refused with the endpoint and the documented range.
#[test]
fn rewards_out_of_range_are_refused_naming_the_server() {
    for value in [1e308, -1e7, f64::INFINITY, f64::NAN] {
        let server = Lying::serve(value);
        let remote = RemoteVerifier::new(&options(vec![server.url()]), None).unwrap();
        let error = remote
            .verify(&input(1, "defg"), &ctx())
            .unwrap_err()
            .chained();
        assert!(
            error.contains(&server.url())
                && (error.contains("outside ±1e6") || error.contains("not finite")),
            "{value}: {error}"
        );
    }
    let server = Lying::serve(-1e6);
    let remote = RemoteVerifier::new(&options(vec![server.url()]), None).unwrap();
    assert_eq!(
        remote.verify(&input(1, "defg"), &ctx()).unwrap().value,
        -1e6
    );
}

/// A verifier that holds each sample until `need` are in together (or 30 s pass), then
/// grades it as the successor reward does: the most it held at once is how many samples the
/// client had in flight.
struct Gate {
    /// Samples held, and whether `need` have been in together.
    held: std::sync::Mutex<(usize, bool)>,
    all_in: std::sync::Condvar,
    need: usize,
    peak: std::sync::atomic::AtomicUsize,
}

impl RewardVerifier for Gate {
    fn name(&self) -> &str {
        "gate"
    }

    fn verify(
        &self,
        input: &RewardInput,
        ctx: &VerifyContext,
    ) -> Result<areal_sdk::Reward, areal_sdk::PluginError> {
        let mut held = self.held.lock().unwrap();
        held.0 += 1;
        held.1 |= held.0 >= self.need;
        self.peak
            .fetch_max(held.0, std::sync::atomic::Ordering::SeqCst);
        self.all_in.notify_all();
        let (mut held, _) = self
            .all_in
            .wait_timeout_while(held, Duration::from_secs(30), |(_, open)| !*open)
            .unwrap();
        held.0 -= 1;
        drop(held);
        SuccessorVerifier.verify(input, ctx)
    }
}

/// Issue 33: a remote reward went async → a reward thread → `block_on` → async, so the
/// default `reward_service.threads = 2` allowed two verifications in flight, and each call
/// carried one sample. Now the reward service awaits the remote reward without a thread: 32
/// samples are on the server at once with two threads here, and samples that wait together
/// (here, for the server to come up) travel in one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_remote_verifications_are_in_flight_with_two_threads_and_travel_together() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let gate = Arc::new(Gate {
        held: std::sync::Mutex::new((0, false)),
        all_in: std::sync::Condvar::new(),
        need: 32,
        peak: AtomicUsize::new(0),
    });
    let addr = {
        let reserved = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        reserved.local_addr().unwrap()
    };
    let mut late = options(vec![format!("http://{addr}")]);
    late.grace_s = 60.0;
    let remote = Arc::new(RemoteVerifier::new(&late, None).unwrap());
    let config = areal_core::RewardServiceConfig {
        threads: 2,
        deadline_ms: 60_000,
        ..Default::default()
    };
    let service = Arc::new(areal_core::RewardService::from_config(
        remote.clone(),
        &config,
    ));
    // every sample submitted (polled once) before the server is up
    let submitted = Arc::new(AtomicUsize::new(0));
    let samples: Vec<_> = (0..32)
        .map(|id| {
            let (service, submitted) = (service.clone(), submitted.clone());
            tokio::spawn(async move {
                let verified = service.verify(input(id, "defg"));
                tokio::pin!(verified);
                let first =
                    std::future::poll_fn(|cx| std::task::Poll::Ready(verified.as_mut().poll(cx)))
                        .await;
                if let std::task::Poll::Ready(done) = first {
                    return done;
                }
                submitted.fetch_add(1, Ordering::SeqCst);
                verified.await
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while submitted.load(Ordering::SeqCst) < 32 {
        assert!(std::time::Instant::now() < deadline, "never submitted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let served = gate.clone();
    let _server = ServerThread::start(
        Listen::new(addr, None),
        move |listen, on_bound| async move {
            let config = areal_core::RewardServiceConfig {
                threads: 32,
                ..Default::default()
            };
            serve_reward(served, &config, listen, on_bound, std::future::pending()).await
        },
    );
    for sample in samples {
        let verified = sample.await.unwrap();
        assert_eq!(verified.reward.value, 1.0, "{:?}", verified.reward);
    }
    assert_eq!(
        gate.peak.load(Ordering::SeqCst),
        32,
        "all 32 in flight at once"
    );
    assert_eq!(service.live_threads(), 2);
    assert_eq!(remote.calls(), 1, "the 32 waiting samples went in one call");
}
