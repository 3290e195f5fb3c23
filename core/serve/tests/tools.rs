//! Tool servers on real sockets (loopback): the `remote` tool through them, a session's state
//! kept on the server between its calls and never shared, the bound on sessions, idle sessions
//! dropped, a dead server, the token.

use std::sync::Arc;
use std::time::Duration;

use areal_sdk::{BuildContext, PluginConfig, Tool, ToolOutput, ToolPlugin};
use areal_serve::{Listen, ToolServerOptions, serve_tools};
use areal_testkit::{Shift, ShiftOptions};
use serde_json::{Value, json};

#[path = "support/server.rs"]
#[allow(
    dead_code,
    reason = "the support of every server's tests; this one reads no errors"
)]
mod server;
use server::ServerThread;

/// A tool server of the `testkit-shift` tool on its own thread; dropped, it is killed.
fn start(token: Option<&str>, options: ToolServerOptions) -> ServerThread {
    let listen = Listen::new("127.0.0.1:0".parse().unwrap(), token.map(str::to_owned));
    ServerThread::start(listen, move |listen, on_bound| async move {
        let tools: Vec<Arc<dyn Tool>> = vec![Arc::new(Shift::new(ShiftOptions::default()))];
        serve_tools(tools, options, listen, on_bound, std::future::pending()).await
    })
}

fn config(endpoints: Vec<String>, tool: &str) -> PluginConfig {
    PluginConfig::new("tools[0]", "remote")
        .with("endpoints", json!(endpoints))
        .with("tool", json!(tool))
        .with("connect_timeout_s", json!(2.0))
        .with("call_timeout_s", json!(10.0))
}

fn build(config: &PluginConfig) -> Result<Arc<dyn Tool>, String> {
    ToolPlugin::build_from(config, &BuildContext::new(0, 1)).map_err(|e| e.to_string())
}

/// The error building the tool of `config` gives.
fn build_error(config: &PluginConfig) -> String {
    match build(config) {
        Ok(_) => panic!("{config:?} was accepted"),
        Err(e) => e,
    }
}

fn text(value: Value) -> serde_json::Map<String, Value> {
    json!({ "text": value }).as_object().unwrap().clone()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn sessions_keep_their_state_on_the_server_and_never_share_it() {
    let server = start(None, ToolServerOptions::default());
    let remote = build(&config(vec![server.url()], "testkit-shift")).unwrap();
    assert_eq!(
        remote.schema(),
        Shift::new(ShiftOptions::default()).schema()
    );
    assert_eq!(remote.name(), "remote");
    runtime().block_on(async {
        let mut first = remote.open(1).await.unwrap();
        let mut second = remote.open(2).await.unwrap();
        // the shift grows with each call of a session: 1, then 2
        assert_eq!(
            first.call(&text(json!("ab"))).await.unwrap(),
            ToolOutput::ok("bc")
        );
        assert_eq!(
            first.call(&text(json!("ab"))).await.unwrap(),
            ToolOutput::ok("cd")
        );
        assert_eq!(
            second.call(&text(json!("ab"))).await.unwrap(),
            ToolOutput::ok("bc")
        );
        // the tool's own errors come back as they are
        let wrong = first.call(&text(json!(3))).await.unwrap();
        assert!(wrong.error && wrong.text.contains("`text`"), "{wrong:?}");
    });
}

#[test]
fn a_tool_the_servers_do_not_serve_is_refused_naming_what_they_serve() {
    let server = start(None, ToolServerOptions::default());
    let error = build_error(&config(vec![server.url()], "python"));
    assert!(error.contains("tools[0].tool"), "{error}");
    assert!(error.contains("testkit-shift"), "{error}");
    let nobody = build_error(&config(vec!["http://127.0.0.1:1".into()], "python"));
    assert!(nobody.contains("tools[0].endpoints"), "{nobody}");
}

#[test]
fn sessions_are_bounded_and_idle_ones_are_dropped() {
    let options = ToolServerOptions {
        max_sessions: 2,
        idle: Duration::from_millis(300),
    };
    let server = start(None, options);
    let remote = build(&config(vec![server.url()], "testkit-shift")).unwrap();
    runtime().block_on(async {
        let mut kept = remote.open(1).await.unwrap();
        let mut second = remote.open(2).await.unwrap();
        let third = remote
            .open(3)
            .await
            .err()
            .expect("a third session is refused");
        assert!(third.to_string().contains("2 sessions are open"), "{third}");
        assert_eq!(
            kept.call(&text(json!("a"))).await.unwrap(),
            ToolOutput::ok("b")
        );
        // uncalled for longer than `idle`, sessions are dropped: there is room again (waited
        // for, however late a busy machine runs the sweep) ...
        let mut fresh = None;
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if let Ok(session) = remote.open(4).await {
                fresh = Some(session);
                break;
            }
        }
        let mut fresh = fresh.expect("the idle sessions are dropped within 10 s");
        assert_eq!(
            fresh.call(&text(json!("a"))).await.unwrap(),
            ToolOutput::ok("b")
        );
        // ... and a call to a dropped one says so (`second`, idle the longest, went first)
        let gone = second
            .call(&text(json!("a")))
            .await
            .unwrap_err()
            .to_string();
        assert!(gone.contains("no such session"), "{gone}");
    });
}

#[test]
fn a_closed_session_is_gone_from_the_server() {
    let options = ToolServerOptions {
        max_sessions: 1,
        ..ToolServerOptions::default()
    };
    let server = start(None, options);
    let remote = build(&config(vec![server.url()], "testkit-shift")).unwrap();
    runtime().block_on(async {
        // each episode's session is closed when it ends (the close travels after the drop),
        // so one slot serves them all, each from a fresh state
        for seed in 0..5 {
            let mut waited = 0;
            let mut session = loop {
                match remote.open(seed).await {
                    Ok(session) => break session,
                    Err(e) if waited < 500 => {
                        assert!(e.to_string().contains("sessions are open"), "{e}");
                        waited += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => panic!("the closed session was not dropped: {e}"),
                }
            };
            assert_eq!(
                session.call(&text(json!("a"))).await.unwrap(),
                ToolOutput::ok("b")
            );
        }
    });
}

#[test]
fn a_dead_server_fails_the_call_not_the_client() {
    let server = start(None, ToolServerOptions::default());
    let remote = build(&config(vec![server.url()], "testkit-shift")).unwrap();
    runtime().block_on(async {
        let mut session = remote.open(1).await.unwrap();
        assert_eq!(
            session.call(&text(json!("a"))).await.unwrap(),
            ToolOutput::ok("b")
        );
    });
    drop(server);
    runtime().block_on(async {
        let mut session = remote.open(1).await;
        if let Ok(session) = &mut session {
            assert!(session.call(&text(json!("a"))).await.is_err());
        }
    });
}

#[test]
fn a_server_with_a_token_refuses_a_client_without_it() {
    let server = start(Some("sesame"), ToolServerOptions::default());
    let error = build_error(&config(vec![server.url()], "testkit-shift"));
    assert!(error.contains("tools[0].endpoints"), "{error}");
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "sesame\n").unwrap();
    let with = config(vec![server.url()], "testkit-shift").with("token_file", json!(token.path()));
    let remote = build(&with).unwrap();
    runtime().block_on(async {
        let mut session = remote.open(1).await.unwrap();
        assert_eq!(
            session.call(&text(json!("a"))).await.unwrap(),
            ToolOutput::ok("b")
        );
    });
}
