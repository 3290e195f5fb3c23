//! Registries of [`Policy`] and [`Algorithm`] plugins (see `areal_sdk::registry`).

use std::sync::Arc;

use areal_sdk::registry::{Registration, infos, lookup};
use areal_sdk::{BuildContext, PluginConfig, PluginError, PluginInfo};
use burn::tensor::Device;

use crate::algorithm::Algorithm;
use crate::policy::Policy;

/// What a policy is built with.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PolicyContext {
    /// Seed and thread budget.
    pub build: BuildContext,
    /// Device to put the parameters on (autodiff enabled).
    pub device: Device,
}

impl PolicyContext {
    /// A context for `device`.
    pub fn new(build: BuildContext, device: Device) -> Self {
        Self { build, device }
    }
}

/// A registered [`Policy`]; add one with [`register_policy!`](crate::register_policy).
pub struct PolicyPlugin {
    /// Name used in config `kind = "..."`.
    pub name: &'static str,
    /// One line shown by `areal plugins`.
    pub description: &'static str,
    /// Builds the policy from its config section.
    pub build: fn(&PluginConfig, &PolicyContext) -> Result<Box<dyn Policy>, PluginError>,
}

inventory::collect!(PolicyPlugin);

impl Registration for PolicyPlugin {
    const KIND: &'static str = "policy";
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        self.description
    }
}

impl PolicyPlugin {
    /// Build the policy that `config.kind()` names.
    pub fn build_from(
        config: &PluginConfig,
        ctx: &PolicyContext,
    ) -> Result<Box<dyn Policy>, PluginError> {
        let entry = lookup::<Self>(config.kind(), &format!("{}.kind", config.path()))?;
        (entry.build)(config, ctx)
    }
}

/// A registered [`Algorithm`]; add one with [`register_algorithm!`](crate::register_algorithm).
pub struct AlgorithmPlugin {
    /// Name used in config `kind = "..."`.
    pub name: &'static str,
    /// One line shown by `areal plugins`.
    pub description: &'static str,
    /// Builds the algorithm from its config section.
    pub build: fn(&PluginConfig, &BuildContext) -> Result<Arc<dyn Algorithm>, PluginError>,
}

inventory::collect!(AlgorithmPlugin);

impl Registration for AlgorithmPlugin {
    const KIND: &'static str = "algorithm";
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        self.description
    }
}

impl AlgorithmPlugin {
    /// Build the algorithm that `config.kind()` names.
    pub fn build_from(
        config: &PluginConfig,
        ctx: &BuildContext,
    ) -> Result<Arc<dyn Algorithm>, PluginError> {
        let entry = lookup::<Self>(config.kind(), &format!("{}.kind", config.path()))?;
        (entry.build)(config, ctx)
    }
}

/// Every registered policy and algorithm.
pub fn registered() -> Vec<PluginInfo> {
    let mut all = infos::<PolicyPlugin>();
    all.extend(infos::<AlgorithmPlugin>());
    all
}

/// Register a [`Policy`] constructor under a name.
#[macro_export]
macro_rules! register_policy {
    ($name:expr, $description:expr, $build:expr $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::registry::PolicyPlugin { name: $name, description: $description, build: $build }
        }
    };
}

/// Register an [`Algorithm`] constructor under a name.
#[macro_export]
macro_rules! register_algorithm {
    ($name:expr, $description:expr, $build:expr $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::registry::AlgorithmPlugin { name: $name, description: $description, build: $build }
        }
    };
}
