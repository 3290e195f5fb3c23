//! Static plugin registries (collected at link time) and the macros that add to them.
//!
//! A plugin crate registers a constructor under a name; the engine builds the plugin named by
//! a config section's `kind`. Registration is static: the final binary must link the plugin's
//! crate (the `areal` binary names every built-in plugin crate; a user's own binary names
//! theirs), or the name is unknown at run time.

use std::sync::Arc;

use crate::config::BuildContext;
use crate::episode::{Episode, SINGLE_TURN, SingleTurn};
use crate::error::PluginError;
use crate::generator::Generator;
use crate::task::Task;
use crate::tool::Tool;
use crate::verifier::RewardVerifier;

/// What every registry entry tells about itself.
pub trait Registration: Sync + 'static {
    /// The plugin kind, as shown by `areal plugins` ("generator", "reward", ...).
    const KIND: &'static str;
    /// The registered name.
    fn name(&self) -> &'static str;
    /// One line saying what it is.
    fn description(&self) -> &'static str;
}

/// A registered plugin, for listings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PluginInfo {
    /// Kind of plugin.
    pub kind: &'static str,
    /// Registered name.
    pub name: &'static str,
    /// One-line description.
    pub description: &'static str,
}

/// All entries of registry `R`, sorted by name.
pub fn entries<R>() -> Vec<&'static R>
where
    R: Registration + inventory::Collect,
{
    let mut all: Vec<&'static R> = inventory::iter::<R>.into_iter().collect();
    all.sort_by_key(|r| r.name());
    all
}

/// Listing of registry `R`.
pub fn infos<R>() -> Vec<PluginInfo>
where
    R: Registration + inventory::Collect,
{
    entries::<R>()
        .into_iter()
        .map(|r| PluginInfo {
            kind: R::KIND,
            name: r.name(),
            description: r.description(),
        })
        .collect()
}

/// The entry of registry `R` named `name`; `key` is the config key that asked for it.
pub fn lookup<R>(name: &str, key: &str) -> Result<&'static R, PluginError>
where
    R: Registration + inventory::Collect,
{
    let all = entries::<R>();
    let found: Vec<_> = all.iter().filter(|r| r.name() == name).collect();
    match found.as_slice() {
        [one] => Ok(**one),
        [] => Err(PluginError::UnknownPlugin {
            kind: R::KIND,
            name: name.to_owned(),
            key: key.to_owned(),
            known: all.iter().map(|r| r.name().to_owned()).collect(),
        }),
        _ => Err(PluginError::config(
            key,
            format!(
                "{} {name:?} is registered {} times; plugin names must be unique",
                R::KIND,
                found.len()
            ),
        )),
    }
}

/// A built plugin must answer to the name it is registered under: that name is the one a
/// config writes, metrics and provenance carry, and error messages cite.
#[doc(hidden)]
pub fn check_name(kind: &str, registered: &str, built: &str) -> Result<(), PluginError> {
    if built == registered {
        return Ok(());
    }
    Err(PluginError::failed(
        registered,
        format!(
            "the {kind} plugin registered as {registered:?} built a {kind} named {built:?}; \
             its name() must return the name it is registered under (declare it once, as a \
             constant, and use it in both places)"
        ),
    ))
}

/// Defines a registry entry type (used by this crate and by `areal-sdk-train`; not public
/// API): `name`, `description`, and `build: fn(&PluginConfig, &$context) -> Result<$object>`.
#[doc(hidden)]
#[macro_export]
macro_rules! __registry {
    ($(#[$doc:meta])* $entry:ident, $kind:literal, $object:ty, $context:ty) => {
        $(#[$doc])*
        pub struct $entry {
            /// Name used in config `kind = "..."`.
            pub name: &'static str,
            /// One line shown by `areal plugins`.
            pub description: &'static str,
            /// Builds the plugin from its config section.
            pub build: fn(
                &$crate::PluginConfig,
                &$context,
            ) -> ::std::result::Result<$object, $crate::PluginError>,
        }

        $crate::__private::inventory::collect!($entry);

        impl $crate::registry::Registration for $entry {
            const KIND: &'static str = $kind;
            fn name(&self) -> &'static str {
                self.name
            }
            fn description(&self) -> &'static str {
                self.description
            }
        }

        impl $entry {
            /// Build the plugin that `config.kind()` names.
            pub fn build_from(
                config: &$crate::PluginConfig,
                ctx: &$context,
            ) -> ::std::result::Result<$object, $crate::PluginError> {
                let key = format!("{}.kind", config.path());
                let entry = $crate::registry::lookup::<Self>(config.kind(), &key)?;
                let built = (entry.build)(config, ctx)?;
                $crate::registry::check_name(
                    <Self as $crate::registry::Registration>::KIND,
                    entry.name,
                    built.name(),
                )?;
                Ok(built)
            }
        }
    };
}

crate::__registry!(
    /// A registered [`Generator`]; add one with [`register_generator!`](crate::register_generator).
    GeneratorPlugin,
    "generator",
    Arc<dyn Generator>,
    BuildContext
);
crate::__registry!(
    /// A registered [`RewardVerifier`]; add one with [`register_reward!`](crate::register_reward).
    RewardPlugin,
    "reward",
    Arc<dyn RewardVerifier>,
    BuildContext
);
crate::__registry!(
    /// A registered [`Task`]; add one with [`register_task!`](crate::register_task).
    TaskPlugin,
    "task",
    Arc<dyn Task>,
    BuildContext
);

crate::__registry!(
    /// A registered [`Tool`]; add one with [`register_tool!`](crate::register_tool).
    ToolPlugin,
    "tool",
    Arc<dyn Tool>,
    BuildContext
);

crate::__registry!(
    /// A registered [`Episode`]; add one with [`register_episode!`](crate::register_episode).
    EpisodePlugin,
    "episode",
    Arc<dyn Episode>,
    BuildContext
);

crate::register_episode!(
    SINGLE_TURN,
    "one generation after the prompt, its text verified (the default)",
    |_, _| Ok(Arc::new(SingleTurn))
);

/// Every plugin registered with the base SDK's macros (generators, rewards, tasks, tools,
/// episodes).
pub fn registered() -> Vec<PluginInfo> {
    let mut all = infos::<GeneratorPlugin>();
    all.extend(infos::<RewardPlugin>());
    all.extend(infos::<TaskPlugin>());
    all.extend(infos::<ToolPlugin>());
    all.extend(infos::<EpisodePlugin>());
    all
}

/// Register a [`Generator`] constructor under a name.
///
/// ```
/// use std::sync::Arc;
/// use areal_sdk::{BuildContext, Generator, PluginConfig, PluginError};
/// # struct Mine;
/// # #[areal_sdk::async_trait]
/// # impl Generator for Mine {
/// #     fn name(&self) -> &str { "mine" }
/// #     async fn generate(&self, _: areal_sdk::GenerateRequest) -> Result<areal_sdk::Completion, PluginError> { unreachable!() }
/// #     async fn update_weights(&self, _: areal_sdk::WeightUpdate) -> Result<(), PluginError> { Ok(()) }
/// # }
/// fn build(_cfg: &PluginConfig, _ctx: &BuildContext) -> Result<Arc<dyn Generator>, PluginError> {
///     Ok(Arc::new(Mine))
/// }
/// areal_sdk::register_generator!("mine", "my generator", build);
/// ```
#[macro_export]
macro_rules! register_generator {
    ($name:expr, $description:expr, $build:expr $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::registry::GeneratorPlugin { name: $name, description: $description, build: $build }
        }
    };
}

/// Register a [`RewardVerifier`] constructor under a name (see
/// [`register_generator!`](crate::register_generator) for the shape).
#[macro_export]
macro_rules! register_reward {
    ($name:expr, $description:expr, $build:expr $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::registry::RewardPlugin { name: $name, description: $description, build: $build }
        }
    };
}

/// Register a [`Task`] constructor under a name (see
/// [`register_generator!`](crate::register_generator) for the shape).
#[macro_export]
macro_rules! register_task {
    ($name:expr, $description:expr, $build:expr $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::registry::TaskPlugin { name: $name, description: $description, build: $build }
        }
    };
}

/// Register a [`Tool`] constructor under a name (see
/// [`register_generator!`](crate::register_generator) for the shape).
#[macro_export]
macro_rules! register_tool {
    ($name:expr, $description:expr, $build:expr $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::registry::ToolPlugin { name: $name, description: $description, build: $build }
        }
    };
}

/// Register an [`Episode`] constructor under a name (see
/// [`register_generator!`](crate::register_generator) for the shape).
#[macro_export]
macro_rules! register_episode {
    ($name:expr, $description:expr, $build:expr $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::registry::EpisodePlugin { name: $name, description: $description, build: $build }
        }
    };
}
