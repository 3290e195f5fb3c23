//! Backward, optimizer step and weight export for any burn module.

use std::path::Path;

use areal_sdk::{NamedTensor, PluginError};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::Tensor;

use crate::policy::StepStats;

/// A burn module with a gradient accumulator: the training half of a [`Policy`](crate::Policy).
///
/// A model plugin keeps one of these, implements the forward pass itself and forwards
/// `backward`, `step` and `weights` here.
pub struct TrainableModule<M: Module> {
    module: Option<M>,
    accumulator: GradientsAccumulator<M>,
    pending: usize,
}

impl<M: Module> std::fmt::Debug for TrainableModule<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainableModule")
            .field("module", &self.module)
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl<M: Module + 'static> TrainableModule<M> {
    /// Wrap `module` (whose parameters live on an autodiff device).
    pub fn new(module: M) -> Self {
        Self {
            module: Some(module),
            accumulator: GradientsAccumulator::new(),
            pending: 0,
        }
    }

    /// Replace the module (and drop any accumulated gradient).
    pub fn replace(&mut self, module: M) {
        self.module = Some(module);
        self.accumulator = GradientsAccumulator::new();
        self.pending = 0;
    }

    /// The module.
    pub fn module(&self) -> &M {
        self.module
            .as_ref()
            .expect("module is only taken during a step")
    }

    /// Accumulate the gradient of `loss`.
    pub fn backward(&mut self, loss: Tensor<1>) {
        let module = self
            .module
            .as_ref()
            .expect("module is only taken during a step");
        let grads = GradientsParams::from_grads(loss.backward(), module);
        self.accumulator.accumulate(module, grads);
        self.pending += 1;
    }

    /// Apply the accumulated gradient, clipped to a global L2 norm of `max_grad_norm`.
    pub fn step(
        &mut self,
        optimizer: &mut ModuleOptimizer,
        lr: f64,
        max_grad_norm: Option<f64>,
    ) -> Result<StepStats, PluginError> {
        if self.pending == 0 {
            return Err(PluginError::failed(
                "trainer",
                "optimizer step without any accumulated gradient",
            ));
        }
        self.pending = 0;
        let mut grads = self.accumulator.grads();
        let module = self
            .module
            .take()
            .expect("module is only taken during a step");

        let mut norm = SquaredNorm {
            grads: &grads,
            sum: 0.0,
        };
        module.visit(&mut norm);
        let grad_norm = norm.sum.sqrt();
        if !grad_norm.is_finite() {
            self.module = Some(module);
            return Err(PluginError::failed(
                "trainer",
                format!("gradient norm is {grad_norm}; the step was skipped"),
            ));
        }
        let clipped = matches!(max_grad_norm, Some(max) if grad_norm > max);
        if let (true, Some(max)) = (clipped, max_grad_norm) {
            let mut scale = ScaleGrads {
                grads: &mut grads,
                factor: (max / grad_norm) as f32,
            };
            module.visit(&mut scale);
        }
        self.module = Some(optimizer.step(lr, module, grads));
        Ok(StepStats { grad_norm, clipped })
    }

    /// The parameters as named plain-data tensors.
    pub fn weights(&self) -> Vec<NamedTensor> {
        crate::state::module_weights(self.module())
    }

    /// [`Policy::save_state`](crate::Policy::save_state) for this module: its parameters and
    /// the optimizer's state for them, keyed by parameter path ([`crate::state`]).
    pub fn save_state(
        &self,
        name: &str,
        optimizer: Option<&ModuleOptimizer>,
        dir: &Path,
    ) -> Result<(), PluginError> {
        crate::state::save_state(self.module(), optimizer, dir)
            .map_err(|e| PluginError::caused_by(name, "cannot save the training state", e))
    }

    /// [`Policy::load_state`](crate::Policy::load_state) for this module; on failure the module
    /// and the optimizer are as they were.
    pub fn load_state(
        &mut self,
        name: &str,
        optimizer: Option<&mut ModuleOptimizer>,
        dir: &Path,
    ) -> Result<(), PluginError> {
        let module = crate::state::load_state(self.module(), optimizer, dir)
            .map_err(|e| PluginError::caused_by(name, "cannot load the training state", e))?;
        self.replace(module);
        Ok(())
    }
}

struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    sum: f64,
}

impl ModuleVisitor for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(grad) = self.grads.get::<D>(param.id) {
            self.sum += f64::from(grad.powi_scalar(2).sum().into_scalar::<f32>());
        }
    }
}

struct ScaleGrads<'a> {
    grads: &'a mut GradientsParams,
    factor: f32,
}

impl ModuleVisitor for ScaleGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(grad) = self.grads.remove::<D>(param.id) {
            self.grads.register(param.id, grad.mul_scalar(self.factor));
        }
    }
}
