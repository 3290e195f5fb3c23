//! Registries of [`Policy`] and [`Algorithm`] plugins (see `areal_sdk::registry`).

use std::sync::Arc;

use areal_sdk::registry::infos;
use areal_sdk::{BuildContext, PluginInfo};
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

areal_sdk::__registry!(
    /// A registered [`Policy`]; add one with [`register_policy!`](crate::register_policy).
    PolicyPlugin,
    "policy",
    Box<dyn Policy>,
    PolicyContext
);

areal_sdk::__registry!(
    /// A registered [`Algorithm`]; add one with [`register_algorithm!`](crate::register_algorithm).
    AlgorithmPlugin,
    "algorithm",
    Arc<dyn Algorithm>,
    BuildContext
);

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
