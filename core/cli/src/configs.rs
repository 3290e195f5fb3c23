//! The config options every command shares (`--config`, `--set`, `--seed`), the loaders built
//! from them (a new run's, a resumed run's), and `areal config`.

use std::path::{Path, PathBuf};

use areal_core::{ConfigError, ConfigLoader};
use clap::Args;

#[derive(Debug, Args)]
pub(crate) struct ConfigCommandArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Also build every plugin, as `areal train` would, so that plugin options are checked
    /// too (a remote plugin's endpoints are not contacted).
    #[arg(long)]
    check: bool,
}

/// The config options every command shares: `--config`, `--set`, `--seed`.
#[derive(Clone, Debug, Args)]
pub struct ConfigArgs {
    /// A TOML config file merged over the built-in defaults.
    #[arg(long, short)]
    pub(crate) config: Option<PathBuf>,
    /// Override one key, e.g. `--set rollout.max_staleness=0` (repeatable, applied in order).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) set: Vec<String>,
    /// The run's seed (same as `--set seed=N`), from 0 to 2^63 − 1.
    #[arg(long, value_parser = clap::value_parser!(u64).range(..=i64::MAX as u64))]
    pub(crate) seed: Option<u64>,
}

impl ConfigArgs {
    /// The same options as command-line arguments (for a child process).
    pub fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        if let Some(path) = &self.config {
            args.push("--config".into());
            args.push(path.clone().into_os_string());
        }
        for set in &self.set {
            args.push("--set".into());
            args.push(set.into());
        }
        if let Some(seed) = self.seed {
            args.push("--seed".into());
            args.push(seed.to_string().into());
        }
        args
    }
}

/// `areal config`: the resolved config as TOML; with `--check`, every plugin built too.
#[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
pub(crate) fn run(args: ConfigCommandArgs) -> anyhow::Result<()> {
    let loader = loader(&args.config)?;
    let config = if args.check {
        areal_core::resolve(&loader)?.0
    } else {
        loader.load()?
    };
    print!("{}", config.to_toml());
    Ok(())
}

/// The loader of `args`: the built-in defaults, the file, then each `--set` and `--seed`.
pub fn loader(args: &ConfigArgs) -> Result<ConfigLoader, ConfigError> {
    let mut loader = ConfigLoader::new();
    if let Some(path) = &args.config {
        loader = loader.file(path)?;
    }
    loader = loader.set_all(&args.set)?;
    if let Some(seed) = args.seed {
        loader = loader.set(&format!("seed={seed}"))?;
    }
    Ok(loader)
}

/// The config of the run in `dir` (its `config.toml`), with `args` on top only if they change
/// nothing, or `allow` says the changes are meant (then each is logged); `policy` and
/// `rollout.group_size` never change.
pub(crate) fn resume_loader(
    dir: &Path,
    args: &ConfigArgs,
    allow: bool,
) -> anyhow::Result<ConfigLoader> {
    let own = dir.join("config.toml");
    if !own.exists() {
        anyhow::bail!(
            "{} is not a run folder (it has no config.toml): --resume takes the folder of a run",
            dir.display()
        );
    }
    let run = ConfigLoader::new().file(&own)?;
    let run_config = run.load()?;
    let mut loader = run;
    if let Some(path) = &args.config {
        loader = loader.file(path)?;
    }
    loader = loader.set_all(&args.set)?;
    if let Some(seed) = args.seed {
        loader = loader.set(&format!("seed={seed}"))?;
    }
    let changes = match areal_core::resume_changes(&run_config, &loader.load()?, allow) {
        Ok(changes) => changes,
        Err(areal_core::ResumeRefusal::Fixed(list)) => anyhow::bail!(
            "resuming {} cannot change what its checkpoints were trained with:\n{list}",
            dir.display()
        ),
        Err(areal_core::ResumeRefusal::NotAllowed(list)) => anyhow::bail!(
            "the config given differs from the run's own ({}):\n{list}\nresume without --config/--set, or add --allow-config-change to change it on purpose",
            own.display()
        ),
    };
    for change in &changes {
        tracing::warn!(target: "areal::train", key = %change.key, before = %change.before, after = %change.after, "config changed on resume");
    }
    Ok(loader)
}
