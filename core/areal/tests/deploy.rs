//! The files of `deploy/` agree with the binary: the subcommands and flags they use parse,
//! the ports are the servers' defaults and match their Services, the trainer's endpoints name
//! every server replica, and the config keys they set are checked by `areal config --check`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn areal(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_areal"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("AREAL_TOKEN")
        .output()
        .expect("run areal")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The port `areal serve KIND` listens on by default, from its help.
fn default_port(kind: &str) -> u16 {
    let help = text(&areal(&["serve".into(), kind.into(), "--help".into()]).stdout);
    let at = help
        .find("[default: 127.0.0.1:")
        .expect("a default address")
        + 20;
    help[at..at + 5].parse().expect("a port")
}

/// `key: value` of the first line in `doc` whose key is `key` (any indentation).
fn field<'a>(doc: &'a str, key: &str) -> Option<&'a str> {
    doc.lines().find_map(|l| {
        l.trim_start()
            .trim_start_matches("- ")
            .strip_prefix(&format!("{key}:"))
            .map(str::trim)
    })
}

/// A Kubernetes document: its kind, its name, and the document.
fn documents(dir: &Path) -> Vec<(String, String, String)> {
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") && !path.ends_with("kustomization.yaml") {
            for doc in std::fs::read_to_string(&path).unwrap().split("\n---\n") {
                let kind = field(doc, "kind").expect("a kind").to_owned();
                let name = field(doc, "name").expect("a name").to_owned();
                docs.push((kind, name, doc.to_owned()));
            }
        }
    }
    docs
}

/// The container's arguments: a flow list (`args: ["a", "b"]`) or a block list of quoted
/// strings.
fn container_args(doc: &str) -> Vec<String> {
    if let Some(flow) = field(doc, "args").filter(|v| v.starts_with('[')) {
        return serde_json::from_str(flow).expect("args are a JSON-style list");
    }
    let mut lines = doc.lines().skip_while(|l| l.trim() != "args:").skip(1);
    let mut args = Vec::new();
    for line in lines.by_ref() {
        let Some(item) = line.trim().strip_prefix("- ") else {
            break;
        };
        args.push(serde_json::from_str(item).expect("each arg is a quoted string"));
    }
    args
}

/// The run config of the ConfigMap, written to `dir`.
fn config_file(docs: &[(String, String, String)], dir: &Path) -> PathBuf {
    let (_, _, doc) = docs
        .iter()
        .find(|(k, n, _)| k == "ConfigMap" && n == "areal-config")
        .expect("the areal-config ConfigMap");
    let body: Vec<&str> = doc
        .lines()
        .skip_while(|l| l.trim() != "config.toml: |")
        .skip(1)
        .map(|l| l.strip_prefix("    ").unwrap_or(l.trim()))
        .collect();
    let path = dir.join("config.toml");
    std::fs::write(&path, body.join("\n")).unwrap();
    path
}

/// `areal config --check` with the trainer's config options (`train` and the run folder
/// options dropped, container paths replaced).
fn check_config(args: &[String], replace: &[(&str, String)]) {
    let mut check = vec!["config".to_owned(), "--check".to_owned()];
    let mut skip = false;
    for arg in args.iter().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        match arg.as_str() {
            "--out" => skip = true,
            "-q" | "--quiet" => {}
            _ => {
                let mut arg = arg.clone();
                for (from, to) in replace {
                    arg = arg.replace(from, to);
                }
                check.push(arg);
            }
        }
    }
    let out = areal(&check);
    assert!(out.status.success(), "{check:?}: {}", text(&out.stderr));
}

#[test]
fn the_kubernetes_files_agree_with_the_binary() {
    let dir = repo().join("deploy/k8s");
    let docs = documents(&dir);
    let scratch = tempfile::tempdir().unwrap();
    let config = config_file(&docs, scratch.path());

    // every file is in the kustomization
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            assert!(
                kustomization.contains(&format!("- {name}")),
                "{name} is not applied"
            );
        }
    }

    // the servers: (StatefulSet name) → (service, replicas, port)
    let mut servers: BTreeMap<String, (String, usize, u16)> = BTreeMap::new();
    for (kind, name, doc) in docs.iter().filter(|(k, _, _)| k == "StatefulSet") {
        let args = container_args(doc);
        assert_eq!(args[0], "serve", "{name}: {args:?}");
        let server_kind = args[1].as_str();
        let port = default_port(server_kind);
        let listen = args
            .iter()
            .skip_while(|a| *a != "--listen")
            .nth(1)
            .expect("--listen");
        assert_eq!(listen, &format!("0.0.0.0:{port}"), "{name}");
        let container_port: u16 = field(doc, "containerPort").unwrap().parse().unwrap();
        assert_eq!(container_port, port, "{name}");
        assert!(
            doc.contains(&format!("name: {}", areal_serve::TOKEN_ENV)),
            "{name} needs the token"
        );
        let service = field(doc, "serviceName").expect("serviceName").to_owned();
        let (_, _, svc) = docs
            .iter()
            .find(|(k, n, _)| k == "Service" && *n == service)
            .unwrap_or_else(|| panic!("{kind} {name}: no Service {service}"));
        assert_eq!(
            field(svc, "clusterIP"),
            Some("None"),
            "{service} is headless"
        );
        assert_eq!(
            field(svc, "port"),
            Some(port.to_string().as_str()),
            "{service}"
        );
        let replicas = field(doc, "replicas").unwrap().parse().unwrap();
        servers.insert(name.clone(), (service, replicas, port));

        // the binary parses the same arguments, and refuses the address without the token
        let local: Vec<String> = args
            .iter()
            .map(|a| a.replace("/config/config.toml", config.to_str().unwrap()))
            .collect();
        let out = areal(&local);
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success()
                && stderr.contains(&format!(
                    "refusing to listen on 0.0.0.0:{port} without a token"
                )),
            "{name}: {stderr}"
        );
    }
    assert_eq!(servers.len(), 2, "a generator and a reward StatefulSet");

    // the trainer: its config options check, and its endpoints are every replica
    let (_, _, job) = docs
        .iter()
        .find(|(k, _, _)| k == "Job")
        .expect("the trainer Job");
    let args = container_args(job);
    assert_eq!(args[0], "train");
    check_config(
        &args,
        &[
            ("/config/config.toml", config.to_str().unwrap().to_owned()),
            (
                "/weights",
                scratch.path().join("weights").to_str().unwrap().to_owned(),
            ),
        ],
    );
    let mut used: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for arg in &args {
        let Some((_, list)) = arg.split_once(".endpoints=") else {
            continue;
        };
        let urls: Vec<String> = serde_json::from_str(list).unwrap();
        for url in urls {
            let host_port = url.strip_prefix("http://").expect("http://");
            let (host, port) = host_port.rsplit_once(':').unwrap();
            let (pod, service) = host.split_once('.').unwrap();
            let (set, index) = pod.rsplit_once('-').unwrap();
            let (svc, _, server_port) = servers
                .get(set)
                .unwrap_or_else(|| panic!("{url}: no StatefulSet {set}"));
            assert_eq!(service, svc, "{url}");
            assert_eq!(port, server_port.to_string(), "{url}");
            used.entry(set.to_owned())
                .or_default()
                .push(index.parse().unwrap());
        }
    }
    for (set, (_, replicas, _)) in &servers {
        let mut indices = used.get(set).cloned().unwrap_or_default();
        indices.sort_unstable();
        assert_eq!(
            indices,
            (0..*replicas).collect::<Vec<_>>(),
            "the trainer's endpoints must name every replica of {set}"
        );
    }
    // what the weights volume is for
    assert!(args.iter().any(|a| a == "generator.weights_dir=/weights"));
}

#[test]
fn the_slurm_script_agrees_with_the_binary() {
    let script = repo().join("deploy/slurm/areal.sbatch");
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(syntax.status.success(), "{}", text(&syntax.stderr));
    let text_of = std::fs::read_to_string(&script).unwrap();
    for (var, kind) in [("GENERATOR_PORT", "generator"), ("REWARD_PORT", "reward")] {
        let value = text_of
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{var}=")))
            .unwrap_or_else(|| panic!("{var}"));
        let port: u16 = value.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(port, default_port(kind), "{var}");
        assert!(
            text_of.contains(&format!(
                "serve {kind} --config \"$CONFIG\" --listen \"0.0.0.0:${{{var}}}\""
            )),
            "the script serves {kind} on {var}"
        );
    }
    assert!(text_of.contains("export AREAL_TOKEN"));
    // the keys it sets, with endpoints as the script builds them
    for set in [
        "generator.kind=remote",
        "generator.endpoints=",
        "reward.kind=remote",
        "reward.endpoints=",
    ] {
        assert!(
            text_of.contains(&format!("--set {set}"))
                || text_of.contains(&format!("--set \"{set}")),
            "{set}"
        );
    }
    let args: Vec<String> = [
        "train",
        "--set",
        "generator.kind=remote",
        "--set",
        "generator.endpoints=[\"http://node1:50051\",\"http://node2:50051\"]",
        "--set",
        "reward.kind=remote",
        "--set",
        "reward.endpoints=[\"http://node1:50061\"]",
    ]
    .map(str::to_owned)
    .to_vec();
    check_config(&args, &[]);
}

#[test]
fn the_container_file_builds_the_binary_the_others_run() {
    let file = std::fs::read_to_string(repo().join("deploy/Containerfile")).unwrap();
    assert!(file.contains("cargo build --release --locked -p areal\n"));
    assert!(file.contains("target/release/areal /usr/local/bin/areal"));
    assert!(file.contains(&format!("ENV {}=", areal_sandbox::INTERPRETER_ENV)));
    let expose = file
        .lines()
        .find_map(|l| l.strip_prefix("EXPOSE "))
        .expect("EXPOSE");
    let ports: Vec<u16> = expose
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(ports, [default_port("generator"), default_port("reward")]);
    assert!(
        repo()
            .join("rewards/sandbox/scripts/build-python-wasi.sh")
            .exists()
    );
}
