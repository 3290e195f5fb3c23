//! `[[tools]] kind = "wasm"` with the `tally` component (`rewards/components/tally`, built by
//! `make reward-components`): state kept across an episode's calls and never across episodes,
//! and every limit a call runs under costs that call and the instance, never the session.

use std::path::PathBuf;
use std::sync::Arc;

use areal_sdk::{BuildContext, PluginConfig, Tool, ToolOutput, ToolPlugin, ToolSession};
use serde_json::{Map, Value, json};

use areal_tools as _;

fn component() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/components/tally.wasm");
    assert!(
        path.is_file(),
        "build the components: make reward-components"
    );
    path
}

fn config(options: Value) -> PluginConfig {
    let mut config = PluginConfig::new("tools[0]", "wasm").with("path", json!(component()));
    for (k, v) in options.as_object().unwrap().clone() {
        config = config.with(&k, v);
    }
    config
}

fn tool(options: Value) -> Arc<dyn Tool> {
    ToolPlugin::build_from(&config(options), &BuildContext::new(0, 1)).expect("the tool")
}

fn arguments(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn call(session: &mut Box<dyn ToolSession>, args: Value) -> ToolOutput {
    session
        .call(&arguments(args))
        .await
        .expect("the host works")
}

#[test]
fn the_component_describes_itself_and_keeps_an_episodes_state() {
    let tally = tool(json!({"options": {"start": 10}}));
    let schema = tally.schema();
    assert_eq!(schema.name, "tally");
    assert_eq!(
        tally.name(),
        "wasm",
        "the plugin's kind; calls name the schema's"
    );
    assert_eq!(schema.parameters["required"], json!(["add"]));
    runtime().block_on(async {
        let mut first = tally.open(1).await.unwrap();
        let mut second = tally.open(2).await.unwrap();
        assert_eq!(
            call(&mut first, json!({"add": 2})).await,
            ToolOutput::ok("12")
        );
        assert_eq!(
            call(&mut first, json!({"add": 3})).await,
            ToolOutput::ok("15")
        );
        // another episode starts from the options, not from the first one's total
        assert_eq!(
            call(&mut second, json!({"add": 1})).await,
            ToolOutput::ok("11")
        );
        assert_eq!(
            call(&mut first, json!({"seed": true})).await,
            ToolOutput::ok("1")
        );
        assert_eq!(
            call(&mut second, json!({"seed": true})).await,
            ToolOutput::ok("2")
        );
        // a bad argument is the tool's own error, and the state stays
        let bad = call(&mut first, json!({"add": "x"})).await;
        assert!(
            bad.error && bad.text.contains("`add` must be an integer"),
            "{bad:?}"
        );
        assert_eq!(
            call(&mut first, json!({"add": 0})).await,
            ToolOutput::ok("15")
        );
    });
}

#[test]
fn every_limit_costs_the_call_and_the_instance_never_the_session() {
    let tally = tool(json!({"timeout_s": 0.3, "memory_mb": 32, "output_bytes": 256}));
    runtime().block_on(async {
        let mut session = tally.open(7).await.unwrap();
        let stopped = [
            (json!({"spin": true}), "past its time limit"),
            (json!({"hoard_mb": 64}), "more memory than its limit"),
            (json!({"shout": 10_000}), "more than its output limit"),
            (json!({"panic": true}), "trapped"),
        ];
        for (args, why) in stopped {
            assert_eq!(
                call(&mut session, json!({"add": 5})).await,
                ToolOutput::ok("5")
            );
            let out = call(&mut session, args.clone()).await;
            assert!(out.error, "{args}: {out:?}");
            assert!(out.text.contains(why), "{args}: {}", out.text);
            assert!(out.text.contains("what it kept is gone"), "{}", out.text);
            // a new instance: the total starts again
            assert_eq!(
                call(&mut session, json!({"add": 1})).await,
                ToolOutput::ok("1")
            );
            assert_eq!(
                call(&mut session, json!({"add": -1})).await,
                ToolOutput::ok("0")
            );
        }
        // memory below the limit is kept between calls
        let held = call(&mut session, json!({"hoard_mb": 8})).await;
        assert_eq!(held, ToolOutput::ok("holding 8 MB"));
        let held = call(&mut session, json!({"hoard_mb": 8})).await;
        assert_eq!(held, ToolOutput::ok("holding 16 MB"));
    });
}

/// The error building the tool of `config` gives.
fn build_error(config: &PluginConfig) -> String {
    match ToolPlugin::build_from(config, &BuildContext::new(0, 1)) {
        Ok(_) => panic!("{config:?} was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_options_and_files_stop_the_run_at_start_naming_them() {
    let refused = build_error(&config(json!({"options": {"stars": 3}})));
    assert!(refused.contains("tools[0].options"), "{refused}");
    assert!(refused.contains("unknown option `stars`"), "{refused}");
    let not_a_component =
        build_error(&PluginConfig::new("tools[0]", "wasm").with("path", json!(file!())));
    assert!(not_a_component.contains("wasm.rs"), "{not_a_component}");
    let missing = build_error(&PluginConfig::new("tools[0]", "wasm"));
    assert!(missing.contains("tools[0].path"), "{missing}");
    let timeout = build_error(&config(json!({"timeout_s": 0.0})));
    assert!(timeout.contains("tools[0].timeout_s"), "{timeout}");
}
