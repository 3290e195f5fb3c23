//! The `sglang` and `vllm` generators against servers of those APIs on real sockets
//! (`serve_inference_api`, what `areal serve generator --api ...` runs): the check every
//! generator passes, weights handed over on disk and removed once no server holds them, a
//! server killed mid-sample, tokenizers that disagree, and requests a server must refuse.

use std::sync::Arc;
use std::time::Duration;

use areal_sdk::{FinishReason, Generator, PluginError, Tokenizer, WeightUpdate};
use areal_sdk_train::Policy;
use areal_serve::{
    GeneratorFleet, GeneratorFleetOptions, InferenceApi, Listen, serve_inference_api,
};
use areal_testkit::{LetterTokenizer, conformance};
use serde_json::json;
use support::server::{explained, weight_version_route};
use support::{Chained, ServerThread, bigram, eventually, policy, request};

mod support;

/// A tokenizer that reads the letters backwards: the same vocabulary, other ids.
struct Backwards(LetterTokenizer);

impl Tokenizer for Backwards {
    fn encode(&self, text: &str) -> Result<Vec<u32>, PluginError> {
        let n = self.0.letters();
        Ok(self
            .0
            .encode(text)?
            .into_iter()
            .map(|id| n - 1 - id)
            .collect())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, PluginError> {
        let n = self.0.letters();
        let ids: Vec<u32> = ids
            .iter()
            .map(|&id| if id < n { n - 1 - id } else { id })
            .collect();
        self.0.decode(&ids)
    }
    fn stop_token_ids(&self) -> Vec<u32> {
        self.0.stop_token_ids()
    }
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
}

/// A server of `api` serving the testkit's bigram generator, which sleeps `token_delay_us`
/// after each token.
struct Server;

impl Server {
    fn start(api: InferenceApi, token_delay_us: u64) -> ServerThread {
        Self::with_tokenizer(api, token_delay_us, Arc::new(LetterTokenizer::new(8)))
    }

    fn with_tokenizer(
        api: InferenceApi,
        token_delay_us: u64,
        tokenizer: Arc<dyn Tokenizer>,
    ) -> ServerThread {
        let listen = Listen::new("127.0.0.1:0".parse().unwrap(), None);
        Self::listening(api, token_delay_us, tokenizer, listen)
    }

    /// [`with_tokenizer`](Self::with_tokenizer) as `listen` says (TLS, say).
    fn listening(
        api: InferenceApi,
        token_delay_us: u64,
        tokenizer: Arc<dyn Tokenizer>,
        listen: Listen,
    ) -> ServerThread {
        ServerThread::start(listen, move |listen, on_bound| {
            let generator = Arc::new(bigram(token_delay_us));
            serve_inference_api(
                api,
                generator,
                1 << 22,
                Some(tokenizer),
                None,
                &[],
                listen,
                on_bound,
                std::future::pending(),
            )
        })
    }
}

fn client(
    api: InferenceApi,
    endpoints: Vec<String>,
    dir: &std::path::Path,
    extra: serde_json::Value,
) -> GeneratorFleet {
    let mut options = json!({ "weights_dir": dir });
    options
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    support::server::fleet(api.name(), endpoints, options)
}

fn versions_on_disk(dir: &std::path::Path) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    left.sort();
    left
}

/// Two servers of each API behind one client pass the check every generator plugin passes:
/// weights load on both (through the shared folder), completions are well formed and carry
/// the loaded version, greedy decoding is deterministic, and pause (abort mode) interrupts
/// what runs while resume lets held samples go on the new weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_and_vllm_servers_pass_the_conformance_check_over_http() {
    for api in [InferenceApi::Sglang, InferenceApi::Vllm] {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (Server::start(api, 200), Server::start(api, 200));
        let generator = Arc::new(client(api, vec![a.url(), b.url()], dir.path(), json!({})));
        let policy = policy();
        generator
            .check_tokenizer(policy.tokenizer().as_ref())
            .await
            .unwrap();
        conformance::check_generator(
            generator.clone(),
            WeightUpdate::new(3, policy.weights()),
            policy.tokenizer().as_ref(),
            "cab",
        )
        .await;
        assert_eq!(generator.reissued(), 0, "{api:?}");
        assert_eq!(generator.endpoint_failures(), 0, "{api:?}");
        // the check ends by loading version 3 again: what no server holds is gone
        eventually("old versions are removed", async || {
            versions_on_disk(dir.path()) == ["v0000000003"]
        })
        .await;
        let stats = generator.stats();
        assert!(stats.tokens > 0 && stats.weight_loads >= 4, "{stats:?}");
    }
}

/// The version a server reports is the one named at its load; a sample generated after it
/// carries it, and the folder holds what HF tools read (`config.json`, `model.safetensors`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_is_a_checkpoint_folder_and_the_server_reports_it() {
    for api in [InferenceApi::Sglang, InferenceApi::Vllm] {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(api, 0);
        let generator = client(api, vec![server.url()], dir.path(), json!({}));
        let policy = policy();
        for version in [4, 5] {
            generator
                .update_weights(WeightUpdate::new(version, policy.weights()))
                .await
                .unwrap();
            let c = generator.generate(request(1, 6)).await.unwrap();
            assert!(c.versions.iter().all(|&v| v == version), "{:?}", c.versions);
            let route = weight_version_route(api);
            let said = get(&format!("{}/{route}", server.url())).await;
            assert_eq!(said, json!({ "weight_version": version.to_string() }));
        }
        let folder = dir.path().join("v0000000005");
        assert!(folder.join("model.safetensors").exists() && folder.join("config.json").exists());
        assert_eq!(versions_on_disk(dir.path()), ["v0000000005"]);
    }
}

/// Each sample of a group draws its own tokens, and the same sample draws the same ones again
/// whatever runs beside it: the client names a seed per sample, and the server, like SGLang and
/// vLLM, samples a seeded request the same whatever else it serves (it once keyed its random
/// stream on the order requests arrived in, and the client sent one seed for the whole run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_draws_its_own_tokens_and_the_same_ones_again() {
    for api in [InferenceApi::Sglang, InferenceApi::Vllm] {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(api, 0);
        let generator = client(api, vec![server.url()], dir.path(), json!({}));
        generator
            .update_weights(WeightUpdate::new(1, policy().weights()))
            .await
            .unwrap();
        let draw = |ids: Vec<u64>| {
            let generator = &generator;
            async move {
                let answers = futures_util::future::join_all(
                    ids.iter().map(|&id| generator.generate(request(id, 12))),
                )
                .await;
                ids.into_iter()
                    .zip(answers)
                    .map(|(id, c)| (id, c.unwrap().token_ids))
                    .collect::<std::collections::BTreeMap<u64, Vec<u32>>>()
            }
        };
        let first = draw((0..8).collect()).await;
        let again = draw((0..8).rev().collect()).await;
        let alone = draw(vec![5]).await;
        assert_eq!(again, first, "{api:?}: the same samples, other company");
        assert_eq!(alone[&5], first[&5], "{api:?}: a sample alone");
        let distinct: std::collections::BTreeSet<&Vec<u32>> = first.values().collect();
        assert!(
            distinct.len() > 1,
            "{api:?}: one completion for the whole group: {first:?}"
        );
    }
}

async fn get(url: &str) -> serde_json::Value {
    http(url, None).await.1
}

/// A bare HTTP/1.1 call: the status and the JSON answer.
async fn http(url: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let head = match body {
        Some(b) => format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        ),
        None => format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    };
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    (
        status,
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

/// A server killed while it has samples costs each of them one re-issue to the other server:
/// every sample completes with the version that was loaded, and the death counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_sample_costs_one_reissue_per_sample_and_loses_none() {
    let dir = tempfile::tempdir().unwrap();
    let api = InferenceApi::Sglang;
    // 4 s a sample on the slow server: whatever it is given is in flight when it dies
    let slow = Server::start(api, 200_000);
    let fast = Server::start(api, 0);
    let generator = Arc::new(client(
        api,
        vec![slow.url(), fast.url()],
        dir.path(),
        json!({}),
    ));
    generator
        .update_weights(WeightUpdate::new(2, policy().weights()))
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
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(slow);
    let mut done = 0;
    while let Some(result) = samples.join_next().await {
        let c = result.unwrap().unwrap();
        assert_eq!((c.len(), c.finish_reason), (20, FinishReason::Length));
        assert!(c.versions.iter().all(|&v| v == 2));
        done += 1;
    }
    assert_eq!(done, 16);
    assert!(
        (1..=16).contains(&generator.reissued()),
        "the slow server had samples"
    );
    assert_eq!(generator.endpoint_failures(), 1, "one server died once");
}

/// A server whose tokenizer gives other ids for the same text is refused before it gets
/// work, with the ids that differ; the run does not start on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_another_tokenizer_is_refused_naming_the_difference() {
    let dir = tempfile::tempdir().unwrap();
    let api = InferenceApi::Vllm;
    let other = Server::with_tokenizer(api, 0, Arc::new(Backwards(LetterTokenizer::new(8))));
    let generator = client(api, vec![other.url()], dir.path(), json!({}));
    let error = generator
        .check_tokenizer(policy().tokenizer().as_ref())
        .await
        .unwrap_err()
        .chained();
    assert!(
        error.contains("tokenizer differs from the trainer's")
            && error.contains(&other.url())
            && error.contains("first differing at position 0"),
        "{error}"
    );
    let error = generator
        .generate(request(1, 3))
        .await
        .unwrap_err()
        .chained();
    assert!(error.contains("refuses us"), "{error}");
}

/// What a server cannot honour exactly is refused with 400 naming the field; the server goes
/// on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_server_cannot_honour_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let sglang = Server::start(InferenceApi::Sglang, 0);
    let generator = client(
        InferenceApi::Sglang,
        vec![sglang.url()],
        dir.path(),
        json!({}),
    );
    generator
        .update_weights(WeightUpdate::new(1, policy().weights()))
        .await
        .unwrap();
    // (the first update may come before the probe found the server)
    eventually("the server holds version 1", async || {
        generator.report().contains("holding version 1")
    })
    .await;
    let url = format!("{}/generate", sglang.url());
    let cases = [
        (
            r#"{"input_ids":[1],"sampling_params":{"max_new_tokens":2,"top_k":5}}"#,
            "sampling_params.top_k = 5 is not supported",
        ),
        (
            r#"{"input_ids":[1],"sampling_params":{"max_new_tokens":2,"regex":"a+"}}"#,
            "sampling_params.regex is not supported",
        ),
        (
            r#"{"input_ids":[1],"sampling_params":{"max_new_tokens":2},"stream":true}"#,
            "stream = true",
        ),
        (
            r#"{"input_ids":[1],"sampling_params":{"max_new_tokens":"two"}}"#,
            "sampling_params.max_new_tokens",
        ),
        (
            r#"{"text":"abc","sampling_params":{"max_new_tokens":2}}"#,
            "input_ids",
        ),
    ];
    for (body, expected) in cases {
        let (status, answer) = http(&url, Some(body)).await;
        let message = answer["message"].as_str().unwrap_or_default().to_owned();
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(message.contains(expected), "{body}: {message}");
    }
    let (status, answer) = http(
        &format!("{}/pause_generation", sglang.url()),
        Some(r#"{"mode":"in_place"}"#),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("only \"abort\"")
    );
    let (status, answer) = http(
        &format!("{}/update_weights_from_disk", sglang.url()),
        Some(r#"{"model_path":"/no/such/folder","weight_version":"9"}"#),
    )
    .await;
    assert_eq!((status, answer["success"].clone()), (400, json!(false)));
    // neutral values pass, and the server still serves
    let (status, answer) = http(
        &url,
        Some(r#"{"input_ids":[1],"sampling_params":{"max_new_tokens":2,"top_k":-1,"temperature":0},"return_logprob":true}"#),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["meta_info"]["output_token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(answer["meta_info"]["weight_version"], "1");
    let c = generator.generate(request(2, 3)).await.unwrap();
    assert_eq!(c.len(), 3);
}

/// A sample that reaches a server just after its pause is held there and runs after the
/// update: SGLang names the version in its answer, which the tokens then carry; vLLM does not,
/// so the answer is not kept and the sample comes back interrupted with nothing, to run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_crossed_a_pause_keeps_a_version_only_if_the_server_names_it() {
    for api in [InferenceApi::Sglang, InferenceApi::Vllm] {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(api, 0);
        let generator = Arc::new(client(api, vec![server.url()], dir.path(), json!({})));
        let policy = policy();
        generator
            .update_weights(WeightUpdate::new(1, policy.weights()))
            .await
            .unwrap();
        eventually("the server holds version 1", async || {
            generator.report().contains("holding version 1")
        })
        .await;
        // the server is paused behind the client's back, as if the client's pause overtook
        // the sample on the way
        let (route, body) = match api {
            InferenceApi::Sglang => ("pause_generation", r#"{"mode":"abort"}"#),
            InferenceApi::Vllm => ("pause?mode=abort", "{}"),
        };
        let url = format!("{}/{route}", server.url());
        assert_eq!(http(&url, Some(body)).await.0, 200);
        let held = tokio::spawn({
            let generator = generator.clone();
            async move { generator.generate(request(9, 5)).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        if held.is_finished() {
            panic!(
                "{api:?}: the paused server let the sample go: {:?}",
                held.await
            );
        }
        generator.pause().await.unwrap();
        generator
            .update_weights(WeightUpdate::new(2, policy.weights()))
            .await
            .unwrap();
        generator.resume().await.unwrap();
        let c = tokio::time::timeout(Duration::from_secs(20), held)
            .await
            .expect("the held sample returns after the resume")
            .unwrap()
            .unwrap();
        match api {
            InferenceApi::Sglang => {
                assert_eq!(c.finish_reason, FinishReason::Length);
                assert_eq!(c.versions, vec![2; 5], "the version SGLang names");
                assert_eq!(generator.dropped(), 0);
            }
            InferenceApi::Vllm => {
                assert_eq!(c.finish_reason, FinishReason::Interrupted);
                assert!(c.is_empty(), "{c:?}");
                assert_eq!(generator.dropped(), 1);
            }
        }
    }
}

/// An SGLang server that lies as asked: its answer to `/generate` never ends (a chunked body
/// that goes on), or names a weight version the run never sent it.
fn lying_sglang(lie: &'static str) -> (String, tokio::task::JoinHandle<()>) {
    use axum::routing::{get, post};
    let held = Arc::new(std::sync::Mutex::new(String::from("default")));
    let (load, version) = (held.clone(), held.clone());
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/continue_generation", post(|| async { "{}" }))
        .route(
            "/update_weights_from_disk",
            post(move |body: axum::Json<serde_json::Value>| async move {
                *load.lock().unwrap() = body["weight_version"].as_str().unwrap().to_owned();
                axum::Json(json!({ "success": true, "message": "" }))
            }),
        )
        .route(
            "/get_weight_version",
            get(move || async move {
                axum::Json(json!({ "weight_version": *version.lock().unwrap() }))
            }),
        )
        .route(
            "/generate",
            post(move || async move {
                let answer = json!({
                    "text": "",
                    "meta_info": {
                        "finish_reason": { "type": "length" },
                        "output_token_logprobs": [[-0.5, 1, null]],
                        "weight_version": "999999",
                    },
                });
                if lie == "endless" {
                    let chunk = bytes::Bytes::from(vec![b' '; 1 << 16]);
                    let endless = futures_util::stream::repeat_with(move || {
                        Ok::<_, std::convert::Infallible>(chunk.clone())
                    });
                    axum::body::Body::from_stream(endless)
                } else {
                    axum::body::Body::from(answer.to_string())
                }
            }),
        );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, task)
}

/// Issue 32: the trainer's client read whole answers with no limit (a never-ending chunked
/// body took it past 4 GB in 5–7 s), and trained on tokens of `weight_version = "999999"`
/// with a lag of 0. Each is refused naming the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_server_answers_is_read_within_bounds_and_accounted_for() {
    for (lie, says) in [
        ("endless", "passed 64 MiB"),
        (
            "version",
            "weight version 999999, which this run never sent",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (url, server) = lying_sglang(lie);
        let generator = client(
            InferenceApi::Sglang,
            vec![url.clone()],
            dir.path(),
            json!({ "check_tokenizer": false, "grace_s": 5.0 }),
        );
        generator
            .update_weights(WeightUpdate::new(1, policy().weights()))
            .await
            .unwrap();
        let e = generator
            .generate(request(1, 4))
            .await
            .unwrap_err()
            .chained();
        assert!(e.contains(&url) && e.contains(says), "{lie}: {e}");
        server.abort();
    }
}

/// Issue 32, what the served API is sent: a request the generator refuses as malformed (an
/// id outside the vocabulary) is the client's error, 400 (it was 500); a request past the
/// server's bound on tokens is refused; a checkpoint folder with NaN weights, or whose
/// weights file is a link to `/dev/zero`, is not loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_api_refuses_what_it_cannot_honour_as_a_client_error() {
    let sglang = Server::start(InferenceApi::Sglang, 0);
    let dir = tempfile::tempdir().unwrap();
    let folder = |name: &str, tensors: &[areal_sdk::NamedTensor]| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        areal_sdk_train::weights_file::write_safetensors(
            &path.join("model.safetensors"),
            tensors,
            &Default::default(),
        )
        .unwrap();
        std::fs::write(path.join("config.json"), "{}").unwrap();
        path
    };
    let good = folder("good", &policy().weights());
    let mut tensors = policy().weights();
    tensors[0].data[3] = f32::INFINITY;
    let nan = folder("nan", &tensors);
    let zero = folder("zero", &policy().weights());
    std::fs::remove_file(zero.join("model.safetensors")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero.join("model.safetensors")).unwrap();
    let load = |path: &std::path::Path| {
        format!(
            r#"{{"model_path":"{}","weight_version":"1"}}"#,
            path.display()
        )
    };
    let route = format!("{}/update_weights_from_disk", sglang.url());
    for (path, says) in [(&nan, "finite"), (&zero, "not a regular file")] {
        let (status, answer) = http(&route, Some(&load(path))).await;
        assert_eq!(status, 400, "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(says),
            "{answer}"
        );
    }
    let (status, answer) = http(&route, Some(&load(&good))).await;
    assert_eq!(status, 200, "{answer}");
    let url = format!("{}/generate", sglang.url());
    for (body, says) in [
        (
            r#"{"input_ids":[100],"sampling_params":{"max_new_tokens":2}}"#,
            "token id 100 is outside the vocabulary",
        ),
        (
            r#"{"input_ids":[1],"sampling_params":{"max_new_tokens":4194305}}"#,
            "bound of 4194304",
        ),
    ] {
        let (status, answer) = http(&url, Some(body)).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(says),
            "{answer}"
        );
    }
}

/// Issue 32, the HTTP servers: a half-sent body is given up on after 10 s (408), and a
/// shutdown ends within its grace with such a client, and a silent one, still connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_servers_shut_down_whatever_clients_do() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound, addr) = tokio::sync::oneshot::channel();
    let generator = Arc::new(bigram(0));
    let server = tokio::spawn(serve_inference_api(
        InferenceApi::Sglang,
        generator,
        1 << 22,
        None,
        None,
        &[],
        Listen::new("127.0.0.1:0".parse().unwrap(), None),
        move |a| bound.send(a).unwrap(),
        async move {
            let _ = stopped.await;
        },
    ));
    let addr = addr.await.unwrap();
    let half = |addr| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"input_ids\"")
            .await
            .unwrap();
        s
    };
    let mut waiting = half(addr).await;
    let mut answer = String::new();
    let read = tokio::time::timeout(
        Duration::from_secs(120),
        waiting.read_to_string(&mut answer),
    )
    .await;
    assert!(
        read.is_ok(),
        "a half-sent body held its connection for ever"
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let _held = half(addr).await;
    let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.send(()).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), server).await;
    assert!(
        ended.is_ok(),
        "the server ignored its shutdown with clients holding on"
    );
}

/// TLS works the same for every kind of server: an SGLang or vLLM server started with a
/// certificate answers a client that trusts its authority through `https://` (weights,
/// samples, pause and resume), and an `https://` endpoint without an authority to trust is
/// refused when the plugin is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_servers_answer_clients_that_trust_their_authority() {
    use areal_serve::ServerTls;
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    for api in [InferenceApi::Sglang, InferenceApi::Vllm] {
        let tls = ServerTls::from_files(&fixtures.join("server.pem"), &fixtures.join("server.key"))
            .unwrap();
        let listen = Listen {
            tls: Some(tls),
            ..Listen::new("127.0.0.1:0".parse().unwrap(), None)
        };
        let server = Server::listening(api, 0, Arc::new(LetterTokenizer::new(8)), listen);
        let url = format!("https://localhost:{}", server.addr.port());
        let dir = tempfile::tempdir().unwrap();
        let ca = fixtures.join("ca.pem");
        let generator = client(
            api,
            vec![url.clone()],
            dir.path(),
            json!({ "tls_ca_file": ca }),
        );
        let policy = policy();
        generator
            .check_tokenizer(policy.tokenizer().as_ref())
            .await
            .unwrap();
        generator
            .update_weights(WeightUpdate::new(2, policy.weights()))
            .await
            .unwrap();
        let completion = generator.generate(request(1, 6)).await.unwrap();
        assert_eq!(completion.len(), 6, "{api:?}");
        assert!(completion.versions.iter().all(|&v| v == 2), "{api:?}");
        generator.pause().await.unwrap();
        generator.resume().await.unwrap();
        assert_eq!(generator.generate(request(2, 3)).await.unwrap().len(), 3);

        // a plain-HTTP client gets no answer from a TLS server
        let plain = client(
            api,
            vec![server.url()],
            dir.path(),
            json!({ "grace_s": 0.3, "check_tokenizer": false }),
        );
        assert!(plain.generate(request(3, 2)).await.is_err(), "{api:?}");

        let mut options: GeneratorFleetOptions = serde_json::from_value(json!({
            "endpoints": [url],
            "weights_dir": dir.path(),
        }))
        .unwrap();
        let (key, error) = explained(GeneratorFleet::new(api.name(), &options, None).unwrap_err());
        assert_eq!(key, "endpoints");
        assert!(error.contains("tls_ca_file"), "{error}");
        options.tls_ca_file = Some(fixtures.join("server.key"));
        let (key, error) = explained(GeneratorFleet::new(api.name(), &options, None).unwrap_err());
        assert_eq!(key, "tls_ca_file");
        assert!(error.contains("holds no PEM certificate"), "{error}");
    }
}
