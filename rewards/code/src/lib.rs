//! LiveCodeBench grading on the wasm sandbox (DESIGN.md §6), as the `lcb` reward plugin.
//!
//! - [`Problem::from_record`] reads LiveCodeBench's records, including compressed private
//!   tests through a decoder that unpickles one string and nothing else.
//! - [`grade_completion`] takes the last fenced code block of a response and runs it on every
//!   test, each in a fresh sandbox, stopping at the first failure. Expected outputs never
//!   enter the sandbox: stdout, or the return value in a closed encoding, comes out and the
//!   host compares it with LiveCodeBench's rules ([`compare`]).
//! - [`reward_of`] turns a [`Grade`] into a [`Reward`] whose provenance names the guest binary
//!   (sha256) and snapshot that ran, wasmtime's version and every limit used.
//!
//! As a plugin: `[reward] kind = "lcb"` with the keys of [`GradeOptions`]; the task's
//! reference for each item is the record itself.

pub mod compare;
mod grade;
pub mod record;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use areal_sandbox::{Mode, Sandbox, SandboxError, Settings};
use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, VerifyContext,
};

pub use grade::{
    Grade, GradeOptions, PRELUDE, PROGRAM, TestRun, bounds, grade_code, grade_completion,
    grade_completion_before,
};
pub use record::{Problem, RecordError, TestCase, TestKind, extract_code};

/// The process's grading sandbox for `mode`, built on first use: one wasmtime engine per
/// process and mode, its interpreter pre-initialised with the harness and LiveCodeBench's
/// prelude (snapshotted once and cached; each test starts from the snapshot).
pub fn shared_sandbox(mode: Mode) -> Result<Arc<Sandbox>, SandboxError> {
    static SANDBOXES: Mutex<Option<HashMap<Mode, Arc<Sandbox>>>> = Mutex::new(None);
    let mut map = SANDBOXES.lock().unwrap_or_else(|p| p.into_inner());
    let map = map.get_or_insert_with(HashMap::new);
    if let Some(sb) = map.get(&mode) {
        return Ok(Arc::clone(sb));
    }
    let sb = Arc::new(Sandbox::new(&Settings {
        mode,
        preinit: Some(grade::harness_source()),
        ..Settings::default()
    })?);
    map.insert(mode, Arc::clone(&sb));
    Ok(sb)
}

/// The version string of every reward: this crate, the guest binary that ran, wasmtime.
pub fn verifier_version(sandbox: &Sandbox) -> String {
    format!(
        "areal-reward-code {}; guest sha256 {}; wasmtime {}",
        env!("CARGO_PKG_VERSION"),
        sandbox.guest_sha256(),
        areal_sandbox::wasmtime_version()
    )
}

/// The reward of a grade, with its full provenance.
pub fn reward_of(grade: &Grade, options: &GradeOptions, sandbox: &Sandbox) -> Reward {
    let limits = options.limits();
    let mut reward = Reward::new(grade.reward(options), grade.verdict)
        .with_version(verifier_version(sandbox))
        .with_limit("timeout_s", options.timeout_s)
        .with_limit("time_scale", options.time_scale)
        .with_limit("cpu_s", limits.cpu.as_secs_f64())
        .with_limit("wall_s", limits.wall.as_secs_f64())
        .with_limit("memory_mb", options.memory_mb as u64)
        .with_limit("output_bytes", options.output_bytes as u64)
        .with_limit("mode", sandbox.mode().as_str())
        .with_detail("passed", grade.passed as u64)
        .with_detail("total", grade.total as u64)
        .with_detail("guest_sha256", sandbox.guest_sha256())
        .with_detail("guest_module", sandbox.module());
    if sandbox.mode() == Mode::Deterministic {
        reward = reward.with_limit("fuel", options.fuel);
    }
    if let Some(i) = grade.failed_test {
        reward = reward.with_detail("failed_test", i as u64);
    }
    if let Some(m) = &grade.message {
        reward = reward.with_detail("message", m.as_str());
    }
    // How the program ran (the harness's `program.py`): a function's body, or as written.
    if let Some(as_function) = grade.runs.iter().find_map(|r| r.as_function) {
        let ran_as = if as_function { "function" } else { "module" };
        reward = reward.with_detail("ran_as", ran_as);
    }
    reward.provenance.verifier = NAME.into();
    reward.provenance.wall_ms = grade.wall_ms;
    reward.provenance.fuel = grade.fuel();
    reward
}

/// The name the `lcb` reward is registered under (`[reward] kind = "lcb"`) and signs its
/// rewards with.
pub const NAME: &str = "lcb";

/// The `lcb` reward: LiveCodeBench grading of the response's last code block.
pub struct LcbVerifier {
    sandbox: Arc<Sandbox>,
    options: GradeOptions,
}

impl std::fmt::Debug for LcbVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LcbVerifier")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl LcbVerifier {
    /// A verifier on `sandbox` with `options`.
    pub fn new(sandbox: Arc<Sandbox>, options: GradeOptions) -> Self {
        Self { sandbox, options }
    }
}

impl RewardVerifier for LcbVerifier {
    fn name(&self) -> &str {
        NAME
    }

    fn verify(&self, input: &RewardInput, ctx: &VerifyContext) -> Result<Reward, PluginError> {
        let max_tests = self.options.max_tests_bytes();
        let problem = Problem::from_record_within(&input.reference, max_tests).map_err(|e| {
            PluginError::failed(
                NAME,
                format!(
                    "item {}: reference is not a LiveCodeBench record: {e}",
                    input.item_id
                ),
            )
        })?;
        let grade = grade_completion_before(
            &self.sandbox,
            &problem,
            &input.completion,
            &self.options,
            Some(ctx.deadline()),
        );
        Ok(reward_of(&grade, &self.options, &self.sandbox))
    }

    fn cache_identity(&self) -> Option<String> {
        let options = serde_json::to_string(&self.options).ok()?;
        Some(format!(
            "{}; {}; options {options}",
            verifier_version(&self.sandbox),
            self.sandbox.module()
        ))
    }
}

fn build_verifier(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    let options: GradeOptions = config.parse()?;
    if let Some((key, message)) = options.check().into_iter().next() {
        return Err(config.invalid(key, message));
    }
    let sandbox =
        shared_sandbox(options.mode).map_err(|e| PluginError::failed(NAME, e.to_string()))?;
    Ok(Arc::new(LcbVerifier::new(sandbox, options)))
}

areal_sdk::register_reward!(
    NAME,
    "LiveCodeBench grading: the response's last code block runs on the record's tests in a wasm sandbox",
    build_verifier
);
