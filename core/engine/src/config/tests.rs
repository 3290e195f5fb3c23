//! Tests of loading, merging and checking configs.

use std::path::Path;

use super::*;

#[test]
fn defaults_round_trip_through_toml() {
    let config = ConfigLoader::new().load().unwrap();
    assert_eq!(config, Config::default());
    let text = config.to_toml();
    let again = ConfigLoader::new()
        .toml(&text, Path::new("resolved.toml"))
        .unwrap()
        .load()
        .unwrap();
    assert_eq!(again, config);
}

#[test]
fn file_then_overrides() {
    let file =
        "seed = 7\n[rollout]\nmax_staleness = 2\n[algorithm]\nkind = \"ppo\"\neps_clip = 0.3\n";
    let loader = ConfigLoader::new()
        .toml(file, Path::new("run.toml"))
        .unwrap()
        .set_all([
            "rollout.max_staleness=0",
            "rollout.group_size=2",
            "task.max_terms=6",
        ])
        .unwrap();
    let c = loader.load().unwrap();
    assert_eq!(c.seed, 7);
    assert_eq!(c.rollout.max_staleness, 0);
    assert_eq!(c.rollout.group_size, 2);
    assert_eq!(c.rollout.batch_size, 8);
    assert_eq!(
        c.algorithm,
        serde_json::json!({"kind": "ppo", "eps_clip": 0.3})
    );
    assert_eq!(
        c.task,
        serde_json::json!({"kind": "chain-sum", "max_terms": 6})
    );
    assert_eq!(
        loader.origin("rollout.max_staleness"),
        Origin::Override("rollout.max_staleness=0".into())
    );
    assert_eq!(loader.origin("seed"), Origin::File("run.toml".into()));
    assert_eq!(loader.origin("train.lr"), Origin::Default);
    assert_eq!(
        loader.origin("rollout.batch_size"),
        Origin::Default,
        "the file sets another key of [rollout]"
    );
    assert_eq!(
        loader.origin("algorithm.eps_clip"),
        Origin::File("run.toml".into())
    );
}

#[test]
fn changing_a_plugin_kind_drops_the_old_options() {
    let file = "[algorithm]\nkind = \"ppo\"\neps_clip = 0.3\n";
    let c = ConfigLoader::new()
        .toml(file, Path::new("run.toml"))
        .unwrap()
        .set("algorithm.kind=decoupled-ppo")
        .unwrap()
        .load()
        .unwrap();
    assert_eq!(c.algorithm, serde_json::json!({"kind": "decoupled-ppo"}));
    // the default transformer's options do not follow a switch to another model
    let c = ConfigLoader::new()
        .set("policy.kind=testkit-bigram")
        .unwrap()
        .load()
        .unwrap();
    assert_eq!(c.policy, serde_json::json!({"kind": "testkit-bigram"}));
}

fn problems(e: ConfigError) -> Vec<ConfigProblem> {
    match e {
        ConfigError::Invalid { problems } => problems,
        other => panic!("expected invalid config, got {other}"),
    }
}

#[test]
fn errors_name_key_origin_and_value() {
    let e = ConfigLoader::new()
        .set("rollout.max_staleness=abc")
        .unwrap()
        .load()
        .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("`rollout.max_staleness`"), "{text}");
    assert!(text.contains("--set rollout.max_staleness=abc"), "{text}");
    assert!(text.contains("\"abc\""), "{text}");

    let e = ConfigLoader::new()
        .toml("[rollout]\nmax_stalenes = 3\n", Path::new("my.toml"))
        .unwrap()
        .load()
        .unwrap_err();
    let p = problems(e);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].key, "rollout.max_stalenes");
    assert_eq!(p[0].origin, Origin::File("my.toml".into()));
    assert!(p[0].message.contains("unknown field"), "{}", p[0].message);

    let e = ConfigLoader::new()
        .toml("[rollout\n", Path::new("bad.toml"))
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("bad.toml") && text.contains("line 1"),
        "{text}"
    );

    let e = ConfigLoader::new().set("rollout").unwrap_err();
    assert!(e.to_string().contains("key=value"), "{e}");
}

#[test]
fn every_validation_problem_is_reported() {
    let e = ConfigLoader::new()
        .set_all([
            "rollout.batch_size=0",
            "train.lr=-1",
            "rollout.top_p=1.5",
            "train.device=tpu",
        ])
        .unwrap()
        .load()
        .unwrap_err();
    let keys: Vec<String> = problems(e).into_iter().map(|p| p.key).collect();
    for k in [
        "rollout.batch_size",
        "train.lr",
        "rollout.top_p",
        "train.device",
    ] {
        assert!(keys.contains(&k.to_owned()), "{k} missing from {keys:?}");
    }
}

#[test]
fn generating_ahead_is_refused_outside_deterministic_mode() {
    let load = |sets: &[&str]| ConfigLoader::new().set_all(sets).unwrap().load();
    let e = load(&["rollout.generate_ahead=true"]).unwrap_err();
    let p = problems(e);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].key, "rollout.generate_ahead");
    assert!(
        p[0].message.contains("deterministic = true"),
        "{}",
        p[0].message
    );
    assert!(load(&["rollout.generate_ahead=true", "deterministic=true"]).is_ok());
}

#[test]
fn non_finite_numbers_and_huge_integers_are_named_not_mangled() {
    // nan and inf once became `null` ("invalid type: null"); a seed past 2^63 a "string".
    for value in ["nan", "inf", "-inf", "+nan"] {
        let e = ConfigLoader::new()
            .set(&format!("train.lr={value}"))
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("`train.lr`") && text.contains("not a finite number"),
            "{value}: {text}"
        );
    }
    let e = ConfigLoader::new()
        .toml("[train]\nlr = nan\n", Path::new("nan.toml"))
        .unwrap_err();
    let p = problems(e);
    assert_eq!(p[0].key, "train.lr");
    assert_eq!(p[0].origin, Origin::File("nan.toml".into()));
    let e = ConfigLoader::new()
        .toml(
            "[algorithm]\nkind = \"ppo\"\nweights = [1.0, inf]\n",
            Path::new("a.toml"),
        )
        .unwrap_err();
    assert_eq!(problems(e)[0].key, "algorithm.weights[1]");
    for seed in [
        "9223372036854775808",
        "18446744073709551615",
        "-9223372036854775809",
    ] {
        let text = ConfigLoader::new()
            .set(&format!("seed={seed}"))
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("`seed`") && text.contains("out of range") && !text.contains("string"),
            "{text}"
        );
    }
    let c = ConfigLoader::new()
        .set("seed=9223372036854775807")
        .unwrap()
        .load()
        .unwrap();
    assert_eq!(c.seed, i64::MAX as u64);
    assert!(c.to_toml().contains("seed = 9223372036854775807"));
    let c = Config {
        seed: u64::MAX,
        ..Config::default()
    };
    assert!(
        c.problems()
            .iter()
            .any(|(k, m)| k == "seed" && m.contains("2^63"))
    );
}

#[test]
fn sizes_are_bounded_and_products_never_wrap() {
    let keys = |overrides: &[&str]| -> Vec<String> {
        let loader = ConfigLoader::new().set_all(overrides).unwrap();
        match loader.load() {
            Ok(_) => Vec::new(),
            Err(e) => problems(e).into_iter().map(|p| p.key).collect(),
        }
    };
    // 2^62 samples per prompt once wrapped batch × group and was OOM-killed at 23.8 GB.
    assert!(
        keys(&["rollout.group_size=4611686018427387904"])
            .contains(&"rollout.group_size".to_owned())
    );
    assert!(keys(&["rollout.batch_size=1000000000000"]).contains(&"rollout.batch_size".to_owned()));
    assert!(
        keys(&["rollout.max_new_tokens=1000000000"]).contains(&"rollout.max_new_tokens".to_owned())
    );
    // Each within its own bound, together past what a machine holds: the estimate says so.
    if areal_sdk::resources::total_memory().is_some() {
        let k = keys(&[
            "rollout.batch_size=65536",
            "rollout.group_size=256",
            "rollout.max_new_tokens=65536",
        ]);
        assert_eq!(k, ["rollout"]);
        let e = ConfigLoader::new()
            .set_all([
                "rollout.batch_size=65536",
                "rollout.group_size=256",
                "rollout.max_new_tokens=65536",
            ])
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("needs about") && e.contains("this machine has"),
            "{e}"
        );
    }
    // The largest staleness is fine: the buffer is bounded by the steps.
    assert!(keys(&["rollout.max_staleness=9223372036854775807"]).is_empty());
    assert!(keys(&["train.threads=100000"]).contains(&"train.threads".to_owned()));
    assert!(
        keys(&["reward_service.deadline_ms=0"]).contains(&"reward_service.deadline_ms".to_owned())
    );
    assert!(keys(&[]).is_empty(), "the defaults are within every bound");
}

#[test]
fn plugin_sections_must_be_tables() {
    let e = ConfigLoader::new()
        .toml("reward = \"math\"\n", Path::new("r.toml"))
        .unwrap()
        .load()
        .unwrap_err();
    let p = problems(e);
    assert_eq!(p[0].key, "reward");
    assert_eq!(p[0].origin, Origin::File("r.toml".into()));
    assert!(p[0].message.contains("kind"), "{}", p[0].message);
}

#[test]
fn only_plugin_sections_are_plugin_configs() {
    let config = Config::default();
    for name in super::PLUGIN_SECTIONS {
        assert_eq!(config.plugin(name).unwrap().path(), name);
    }
    let error = config.plugin("rollout").unwrap_err().to_string();
    assert!(
        error.contains("rollout") && error.contains("policy, generator, task, reward, algorithm"),
        "{error}"
    );
}
