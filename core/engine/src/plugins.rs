//! Building a run's plugins from its config, and the one path from a config loader to a
//! checked config with its plugins built (`areal train`, `areal eval`, every bench).

use std::sync::Arc;

use areal_sdk::{
    BuildContext, Episode, EpisodePlugin, Generator, GeneratorPlugin, PluginError, RewardPlugin,
    RewardVerifier, Task, TaskPlugin, Tokenizer, Tool, ToolPlugin, mix_seed,
};
use areal_sdk_train::burn::tensor::Device;
use areal_sdk_train::{Algorithm, AlgorithmPlugin, Policy, PolicyContext, PolicyPlugin};

use crate::config::{Config, ConfigError, ConfigLoader};
use crate::error::EngineError;

/// Load the config of `loader`, check it and build its plugins: the engine's problems and
/// every plugin's are reported together, each naming its key, where the value came from and
/// the value.
pub fn resolve(loader: &ConfigLoader) -> Result<(Config, Plugins), ConfigError> {
    resolve_with(loader, Plugins::build_all)
}

/// [`resolve`] for a reward server: the config checked and only its `[reward]` plugin built,
/// with `reward_service.threads` threads in its build context.
pub fn resolve_reward(
    loader: &ConfigLoader,
) -> Result<(Config, Arc<dyn RewardVerifier>), ConfigError> {
    resolve_with(loader, |config| build_reward(config).map_err(|e| vec![e]))
}

/// [`resolve`] for a tool server: the config checked and only its `[[tools]]` built, as a run
/// would build them.
pub fn resolve_tools(loader: &ConfigLoader) -> Result<(Config, Vec<Arc<dyn Tool>>), ConfigError> {
    resolve_with(loader, |config| build_tools(config).map_err(|e| vec![e]))
}

/// [`resolve`] for a generator server: the config checked and only its `[generator]` plugin
/// built, as a run would build it.
pub fn resolve_generator(
    loader: &ConfigLoader,
) -> Result<(Config, Arc<dyn Generator>), ConfigError> {
    resolve_with(loader, |config| {
        build_generator(config).map_err(|e| vec![e])
    })
}

/// The tokenizer of `config`'s `[policy]` (a generator server's `/tokenize`): the policy is
/// built as a run builds it, and only its tokenizer kept.
pub fn policy_tokenizer(config: &Config) -> Result<Arc<dyn Tokenizer>, PluginError> {
    let device = areal_sdk_train::parse_device(&config.train.device)
        .map(Device::autodiff)
        .map_err(|m| PluginError::config("train.device", m))?;
    let section = config.plugin("policy")?;
    let ctx = PolicyContext::new(BuildContext::new(mix_seed(config.seed, 1), 1), device);
    let policy = PolicyPlugin::build_from(&section, &ctx).map_err(|e| in_section("policy", e))?;
    Ok(policy.tokenizer())
}

/// The `[generator]` plugin (a run's and a generator server's).
fn build_generator(config: &Config) -> Result<Arc<dyn Generator>, PluginError> {
    let section = config.plugin("generator")?;
    let ctx = BuildContext::new(mix_seed(config.seed, 2), 1);
    GeneratorPlugin::build_from(&section, &ctx).map_err(|e| in_section("generator", e))
}

/// The `[reward]` plugin, on `reward_service.threads` threads (a run's and a reward server's).
fn build_reward(config: &Config) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    let section = config.plugin("reward")?;
    let ctx = BuildContext::new(mix_seed(config.seed, 4), config.reward_service.threads);
    RewardPlugin::build_from(&section, &ctx).map_err(|e| in_section("reward", e))
}

/// The `[[tools]]` plugins, each name once.
fn build_tools(config: &Config) -> Result<Vec<Arc<dyn Tool>>, PluginError> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    for (i, section) in config.tool_sections()?.into_iter().enumerate() {
        let ctx = BuildContext::new(mix_seed(config.seed, 8 + i as u64), 1);
        let key = format!("tools[{i}]");
        let tool = ToolPlugin::build_from(&section, &ctx).map_err(|e| in_section(&key, e))?;
        let name = tool.schema().name;
        if tools.iter().any(|t| t.schema().name == name) {
            return Err(PluginError::config(
                key,
                format!("a tool named {name:?} is given twice; each name once"),
            ));
        }
        tools.push(tool);
    }
    Ok(tools)
}

/// A config checked and something built from it, every problem reported together.
fn resolve_with<T>(
    loader: &ConfigLoader,
    build: impl FnOnce(&Config) -> Result<T, Vec<PluginError>>,
) -> Result<(Config, T), ConfigError> {
    let config = loader.load_unchecked()?;
    let mut problems = loader.problems(&config);
    match build(&config) {
        Ok(built) if problems.is_empty() => Ok((config, built)),
        Ok(_) => Err(ConfigError::Invalid { problems }),
        Err(errors) => {
            for error in &errors {
                let problem = loader.problem_from_plugin_error(error);
                if !problems.contains(&problem) {
                    problems.push(problem);
                }
            }
            Err(ConfigError::Invalid { problems })
        }
    }
}

/// The plugins of a run.
pub struct Plugins {
    /// The trainable model.
    pub policy: Box<dyn Policy>,
    /// Sample generation.
    pub generator: Arc<dyn areal_sdk::Generator>,
    /// Prompt source.
    pub task: Arc<dyn Task>,
    /// Reward verifier.
    pub verifier: Arc<dyn areal_sdk::RewardVerifier>,
    /// Loss and advantages.
    pub algorithm: Arc<dyn Algorithm>,
    /// What the policy does with one prompt.
    pub episode: Arc<dyn Episode>,
    /// The tools episodes may call.
    pub tools: Vec<Arc<dyn Tool>>,
}

impl Plugins {
    /// Build every plugin section of `config`; all failures are reported together.
    pub fn build(config: &Config) -> Result<Self, EngineError> {
        Self::build_all(config).map_err(|errors| EngineError::Build { errors })
    }

    fn build_all(config: &Config) -> Result<Self, Vec<PluginError>> {
        let mut errors: Vec<PluginError> = Vec::new();
        let ctx =
            |stream: u64, threads: usize| BuildContext::new(mix_seed(config.seed, stream), threads);
        let device = keep(
            &mut errors,
            areal_sdk_train::parse_device(&config.train.device)
                .map(Device::autodiff)
                .map_err(|m| PluginError::config("train.device", m)),
        );
        let policy = keep(&mut errors, config.plugin("policy"))
            .zip(device)
            .and_then(|(section, device)| {
                let ctx = PolicyContext::new(ctx(1, 1), device);
                let built = PolicyPlugin::build_from(&section, &ctx);
                keep(&mut errors, built.map_err(|e| in_section("policy", e)))
            });
        let generator = keep(&mut errors, build_generator(config));
        let task = keep(&mut errors, config.plugin("task")).and_then(|section| {
            let built = TaskPlugin::build_from(&section, &ctx(3, 1));
            keep(&mut errors, built.map_err(|e| in_section("task", e)))
        });
        let verifier = keep(&mut errors, build_reward(config));
        let algorithm = keep(&mut errors, config.plugin("algorithm")).and_then(|section| {
            let ctx = ctx(5, 1).with_max_new_tokens(config.rollout.max_new_tokens);
            let built = AlgorithmPlugin::build_from(&section, &ctx);
            keep(&mut errors, built.map_err(|e| in_section("algorithm", e)))
        });
        let episode = keep(&mut errors, config.plugin("episode")).and_then(|section| {
            let built = EpisodePlugin::build_from(&section, &ctx(7, 1));
            keep(&mut errors, built.map_err(|e| in_section("episode", e)))
        });
        let tools = keep(&mut errors, build_tools(config));
        // What the algorithm needs from the policy: a value head is part of the model from
        // the start; a reference copy is taken when RL starts, but checked now.
        let policy = match (policy, &algorithm) {
            (Some(mut policy), Some(algorithm)) => {
                let needs = algorithm.requirements();
                let name = policy.name().to_owned();
                let mut check = |what: &str, result: Result<(), PluginError>| {
                    result.map_err(|e| {
                        errors.push(PluginError::config(
                            "algorithm.kind",
                            format!(
                                "{} needs {what}, but policy {name} cannot give it: {e}",
                                algorithm.name(),
                            ),
                        ))
                    })
                };
                let values = if needs.values {
                    check("a critic (values)", policy.enable_values())
                } else {
                    Ok(())
                };
                let reference = if needs.reference {
                    check("a reference policy", policy.snapshot().map(drop))
                } else {
                    Ok(())
                };
                (values.is_ok() && reference.is_ok()).then_some(policy)
            }
            (policy, _) => policy,
        };
        match (policy, generator, task, verifier, algorithm, episode, tools) {
            (
                Some(policy),
                Some(generator),
                Some(task),
                Some(verifier),
                Some(algorithm),
                Some(episode),
                Some(tools),
            ) => Ok(Self {
                policy,
                generator,
                task,
                verifier,
                algorithm,
                episode,
                tools,
            }),
            _ => Err(errors),
        }
    }
}

/// The value, or `None` with the error recorded.
fn keep<T>(errors: &mut Vec<PluginError>, result: Result<T, PluginError>) -> Option<T> {
    result.map_err(|e| errors.push(e)).ok()
}

/// A plugin's build error filed under its config section: a config error keeps its own key;
/// any other failure (a missing interpreter, a model that cannot fit) is the section's
/// (`reward`, `policy`), never an empty key.
fn in_section(section: &str, error: PluginError) -> PluginError {
    match error {
        e @ (PluginError::Config { .. } | PluginError::UnknownPlugin { .. }) => e,
        other => PluginError::config(section, crate::error::chain(&other)),
    }
}
