//! A burn module's parameters as plain data ([`module_weights`]), and its whole training
//! state in a folder, for an exact resume: every parameter by its path
//! (`parameters.safetensors`) and the optimizer's per-parameter state (`optimizer.bpk`,
//! burn's burnpack format).
//!
//! burn keys an optimizer's state by [`ParamId`], which is drawn at random when a module is
//! built, so the ids of the process that saved the state mean nothing to the one that loads
//! it. Here every parameter is keyed by its index in the module's visiting order instead, with
//! its path beside it: loading maps each index to the new module's parameter of that index and
//! refuses a state whose paths or shapes do not match.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use areal_sdk::NamedTensor;
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::ModuleOptimizer;
use burn::tensor::{Bytes, Tensor, TensorData};

use crate::weights_file::{WeightsFileError, read_safetensors, write_replacing, write_safetensors};

/// File of the parameters in a state folder.
pub const PARAMETERS_FILE: &str = "parameters.safetensors";
/// File of the optimizer's state in a state folder.
pub const OPTIMIZER_FILE: &str = "optimizer.bpk";

/// Why a training state could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The parameters file could not be written or read.
    #[error(transparent)]
    Weights(#[from] WeightsFileError),
    /// The optimizer's file could not be written or read.
    #[error("{}: {message}", path.display())]
    Optimizer {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The saved state is not this module's.
    #[error("{}: {message}", path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        message: String,
    },
}

/// Write `module`'s parameters and, when given, `optimizer`'s state for it into `dir`.
pub fn save_state<M: Module>(
    module: &M,
    optimizer: Option<&ModuleOptimizer>,
    dir: &Path,
) -> Result<(), StateError> {
    let entries = walk(module, true);
    let frozen: Vec<&str> = entries
        .iter()
        .filter(|e| e.frozen)
        .map(|e| e.path.as_str())
        .collect();
    let tensors: Vec<NamedTensor> = entries.iter().filter_map(|e| e.values.clone()).collect();
    let mut metadata = HashMap::new();
    // a module that trains some parameters and not others (adapters over a base); one that
    // trains none (a reference) or all has nothing to record
    if !frozen.is_empty() && frozen.len() < entries.len() {
        // what an adapter is trained over: recorded, so that a base changed since is found
        metadata.insert(
            FROZEN_KEY.to_owned(),
            serde_json::to_string(&frozen).expect("names serialise"),
        );
        metadata.insert(
            FROZEN_SHA256_KEY.to_owned(),
            frozen_sha256(&tensors, &frozen),
        );
    }
    write_safetensors(&dir.join(PARAMETERS_FILE), &tensors, &metadata)?;
    let Some(optimizer) = optimizer else {
        return Ok(());
    };
    let path = dir.join(OPTIMIZER_FILE);
    let error = |message: String| StateError::Optimizer {
        path: path.clone(),
        message,
    };
    let index: HashMap<u64, usize> = parameters(module)
        .iter()
        .enumerate()
        .map(|(i, (_, id))| (id.val(), i))
        .collect();
    let bytes = optimizer
        .into_bytes()
        .map_err(|e| error(format!("cannot encode the optimizer's state: {e}")))?;
    let rekeyed = rekey(
        bytes,
        |id| index.get(&id).map(|&i| i as u64),
        &paths(module),
    )
    .map_err(|e| {
        error(format!(
            "cannot key the optimizer's state by parameter: {e}"
        ))
    })?;
    write_replacing(&path, &rekeyed).map_err(|e| error(format!("cannot write: {e}")))
}

/// `module` with the parameters saved in `dir` and, when `optimizer` is given, the optimizer
/// with the state saved for them; both are left as they were on any error.
pub fn load_state<M: Module>(
    module: &M,
    optimizer: Option<&mut ModuleOptimizer>,
    dir: &Path,
) -> Result<M, StateError> {
    let path = dir.join(PARAMETERS_FILE);
    let (tensors, metadata) = read_safetensors(&path)?;
    let expected = paths(module);
    let mismatch = |message: String| StateError::Mismatch {
        path: path.clone(),
        message,
    };
    check_frozen_in(&tensors, &metadata).map_err(&mismatch)?;
    let entries = walk(module, false);
    let frozen = entries.iter().filter(|e| e.frozen).count();
    if frozen > 0 && frozen < entries.len() && !metadata.contains_key(FROZEN_SHA256_KEY) {
        return Err(mismatch(format!(
            "records no sha256 of the {frozen} frozen parameters (the base) this model trains over"
        )));
    }
    let mut by_name: BTreeMap<String, NamedTensor> =
        tensors.into_iter().map(|t| (t.name.clone(), t)).collect();
    if let Some(extra) = by_name.keys().find(|k| !expected.values().any(|p| p == *k)) {
        return Err(mismatch(format!(
            "holds `{extra}`, which this model does not have"
        )));
    }
    let mut setter = SetParameters {
        path: Vec::new(),
        tensors: &mut by_name,
        error: None,
    };
    let loaded = module.clone().map(&mut setter);
    if let Some(message) = setter.error {
        return Err(mismatch(message));
    }
    let Some(optimizer) = optimizer else {
        return Ok(loaded);
    };
    let path = dir.join(OPTIMIZER_FILE);
    let error = |message: String| StateError::Optimizer {
        path: path.clone(),
        message,
    };
    let bytes = std::fs::read(&path).map_err(|e| error(format!("cannot read: {e}")))?;
    let ids: Vec<u64> = parameters(&loaded).iter().map(|(_, id)| id.val()).collect();
    check_paths(&bytes, &expected).map_err(|message| StateError::Mismatch {
        path: path.clone(),
        message,
    })?;
    let rekeyed = rekey(
        Bytes::from_bytes_vec(bytes),
        |i| ids.get(i as usize).copied(),
        &BTreeMap::new(),
    )
    .map_err(|e| error(format!("not an optimizer state of this model: {e}")))?;
    let restored = optimizer
        .clone()
        .from_bytes(Bytes::from_bytes_vec(rekeyed))
        .map_err(|e| error(format!("cannot decode: {e}")))?;
    *optimizer = restored;
    Ok(loaded)
}

/// Metadata key of a parameters file: the paths of the frozen parameters (those that take no
/// gradient: the base an adapter trains over), as a JSON list.
const FROZEN_KEY: &str = "areal.frozen";
/// Metadata key of a parameters file: the sha256 of its frozen parameters when it was saved.
const FROZEN_SHA256_KEY: &str = "areal.frozen_sha256";

/// The sha256 of the tensors of `tensors` named in `names`, in that order (each name, shape
/// and little-endian values; a name `tensors` lacks hashes as such).
fn frozen_sha256(tensors: &[NamedTensor], names: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let by_name: HashMap<&str, &NamedTensor> =
        tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut hash = Sha256::new();
    for name in names {
        hash.update((name.len() as u64).to_le_bytes());
        hash.update(name.as_bytes());
        match by_name.get(name) {
            Some(t) => {
                hash.update((t.shape.len() as u64).to_le_bytes());
                for &d in &t.shape {
                    hash.update((d as u64).to_le_bytes());
                }
                for &x in &t.data {
                    hash.update(x.to_le_bytes());
                }
            }
            None => hash.update(u64::MAX.to_le_bytes()),
        }
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// That the frozen parameters of a parameters file are what it recorded when it was saved.
fn check_frozen_in(
    tensors: &[NamedTensor],
    metadata: &HashMap<String, String>,
) -> Result<(), String> {
    let (Some(names), Some(recorded)) = (metadata.get(FROZEN_KEY), metadata.get(FROZEN_SHA256_KEY))
    else {
        return match metadata.contains_key(FROZEN_KEY) || metadata.contains_key(FROZEN_SHA256_KEY) {
            true => Err(format!(
                "records its frozen parameters without their sha256 ({FROZEN_KEY} and {FROZEN_SHA256_KEY} go together)"
            )),
            false => Ok(()),
        };
    };
    let names: Vec<String> = serde_json::from_str(names)
        .map_err(|e| format!("the list of its frozen parameters does not read: {e}"))?;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let sum = frozen_sha256(tensors, &names);
    if sum != *recorded {
        return Err(format!(
            "its frozen parameters (the base the adapters were trained over, {} tensors) have sha256 {sum}, \
             but {recorded} when they were saved: the base was changed",
            names.len()
        ));
    }
    Ok(())
}

/// That the frozen parameters (the base an adapter trains over) of the training state saved in
/// `dir` are those it was saved with: the check [`load_state`] makes, without a module, for a
/// caller that decides between checkpoints before it loads one. A state with no frozen
/// parameters, or no state at all in `dir`, passes.
pub fn check_frozen(dir: &Path) -> Result<(), String> {
    let path = dir.join(PARAMETERS_FILE);
    if !path.exists() {
        return Ok(());
    }
    let (tensors, metadata) = read_safetensors(&path).map_err(|e| e.to_string())?;
    check_frozen_in(&tensors, &metadata).map_err(|why| format!("{}: {why}", path.display()))
}

/// Every float parameter of `module` as a [`NamedTensor`], named by its path in the module
/// tree (`layers.0.attention.weight`).
pub fn module_weights<M: Module>(module: &M) -> Vec<NamedTensor> {
    walk(module, true)
        .into_iter()
        .filter_map(|e| e.values)
        .collect()
}

/// Every float parameter of `module` with its path, in visiting order.
fn parameters<M: Module>(module: &M) -> Vec<(String, ParamId)> {
    walk(module, false)
        .into_iter()
        .map(|e| (e.path, e.id))
        .collect()
}

/// A float parameter met walking a module.
struct Entry {
    path: String,
    id: ParamId,
    /// Whether it takes no gradient.
    frozen: bool,
    /// Its values, when asked for.
    values: Option<NamedTensor>,
}

/// Every float parameter of `module` in visiting order: its path, its id, whether it is
/// frozen and, with `values`, itself as plain data.
fn walk<M: Module>(module: &M, values: bool) -> Vec<Entry> {
    struct Walk {
        path: Vec<String>,
        values: bool,
        out: Vec<Entry>,
    }
    impl ModuleVisitor for Walk {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_owned());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let name = self.path.join(".");
            let tensor = self.values.then(|| {
                let data = param.val().into_data().convert::<f32>();
                NamedTensor {
                    name: name.clone(),
                    shape: data.shape().to_vec(),
                    data: data
                        .try_to_vec::<f32>()
                        .expect("tensor data was converted to f32"),
                }
            });
            self.out.push(Entry {
                frozen: !param.val().is_require_grad(),
                path: name,
                id: param.id,
                values: tensor,
            });
        }
    }
    let mut walk = Walk {
        path: Vec::new(),
        values,
        out: Vec::new(),
    };
    module.visit(&mut walk);
    walk.out
}

/// Index (as text, the optimizer record's metadata key) → parameter path.
fn paths<M: Module>(module: &M) -> BTreeMap<String, String> {
    parameters(module)
        .into_iter()
        .enumerate()
        .map(|(i, (path, _))| (i.to_string(), path))
        .collect()
}

/// The optimizer record `bytes` with every parameter key `k` (the prefix of tensor and scalar
/// names, the tensors' parameter ids, the metadata keys) replaced by `key(k)`; the metadata
/// becomes `paths` when it is not empty. Entries come out sorted by name, so the same state
/// always gives the same bytes.
fn rekey(
    bytes: Bytes,
    key: impl Fn(u64) -> Option<u64>,
    paths: &BTreeMap<String, String>,
) -> Result<Vec<u8>, String> {
    let reader = burn_pack::Reader::from_bytes(bytes).map_err(|e| e.to_string())?;
    let swap = |name: &str| -> Result<String, String> {
        let (id, rest) = name.split_once('.').unwrap_or((name, ""));
        let id: u64 = id
            .parse()
            .map_err(|_| format!("entry `{name}` is not keyed by a parameter"))?;
        let new = key(id).ok_or_else(|| format!("entry `{name}` names no parameter"))?;
        Ok(if rest.is_empty() {
            new.to_string()
        } else {
            format!("{new}.{rest}")
        })
    };
    let scalars: BTreeMap<String, burn_pack::Scalar> = reader
        .scalars()
        .iter()
        .map(|(k, v)| Ok((swap(k)?, *v)))
        .collect::<Result<_, String>>()?;
    let metadata: BTreeMap<String, String> = if paths.is_empty() {
        reader
            .metadata()
            .iter()
            .map(|(k, v)| Ok((swap(k)?, v.clone())))
            .collect::<Result<_, String>>()?
    } else {
        paths.clone()
    };
    let mut tensors = reader.into_tensors().map_err(|e| e.to_string())?;
    for tensor in &mut tensors {
        tensor.name = swap(&tensor.name)?;
        tensor.param_id = match tensor.param_id {
            Some(id) => Some(
                key(id).ok_or_else(|| format!("tensor `{}` names no parameter", tensor.name))?,
            ),
            None => None,
        };
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut writer = burn_pack::Writer::new(tensors);
    for (k, v) in &scalars {
        writer = writer.with_scalar(k, *v);
    }
    for (k, v) in &metadata {
        writer = writer.with_metadata(k, v);
    }
    let out = writer.into_bytes().map_err(|e| e.to_string())?;
    Ok(out.to_vec())
}

/// Whether the parameter paths a saved optimizer state names (its metadata) are this model's.
fn check_paths(bytes: &[u8], expected: &BTreeMap<String, String>) -> Result<(), String> {
    let reader = burn_pack::Reader::from_bytes(Bytes::from_bytes_vec(bytes.to_vec()))
        .map_err(|e| format!("not an optimizer state: {e}"))?;
    for (index, path) in reader.metadata() {
        match expected.get(index) {
            Some(p) if p == path => {}
            Some(p) => {
                return Err(format!(
                    "parameter {index} is `{path}` in the saved optimizer state but `{p}` in this model"
                ));
            }
            None => {
                return Err(format!(
                    "the saved optimizer state has a parameter {index} (`{path}`) this model lacks"
                ));
            }
        }
    }
    Ok(())
}

/// Replaces each float parameter's value by the tensor of its path, keeping its id, device and
/// gradient setting.
struct SetParameters<'a> {
    path: Vec<String>,
    tensors: &'a mut BTreeMap<String, NamedTensor>,
    error: Option<String>,
}

impl ModuleMapper for SetParameters<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let name = self.path.join(".");
        let Some(saved) = self.tensors.remove(&name) else {
            self.error
                .get_or_insert_with(|| format!("has no `{name}`, a parameter of this model"));
            return param;
        };
        let shape = param.lazy_shape().to_vec();
        if saved.shape != shape {
            self.error.get_or_insert_with(|| {
                format!(
                    "`{name}` has shape {:?}, this model's has {shape:?}",
                    saved.shape
                )
            });
            return param;
        }
        param.map(|current| {
            let device = current.device();
            let grad = current.is_require_grad();
            Tensor::<D>::from_data(TensorData::new(saved.data, saved.shape), &device)
                .set_require_grad(grad)
        })
    }
}

#[cfg(test)]
mod tests {
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::{AdamWConfig, GradientsParams};
    use burn::tensor::{Device, Distribution};

    use super::*;

    #[derive(Module, Debug)]
    struct Net {
        a: Linear,
        b: Linear,
    }

    fn net(device: &Device) -> Net {
        Net {
            a: LinearConfig::new(3, 4).init(device),
            b: LinearConfig::new(4, 2).init(device),
        }
    }

    fn step(net: Net, optimizer: &mut ModuleOptimizer, x: &Tensor<2>) -> Net {
        let loss = net
            .b
            .forward(net.a.forward(x.clone()).tanh())
            .powi_scalar(2)
            .mean();
        let grads = GradientsParams::from_grads(loss.backward(), &net);
        optimizer.step(0.01, net, grads)
    }

    fn bits(net: &Net) -> Vec<(String, Vec<u32>)> {
        module_weights(net)
            .into_iter()
            .map(|t| (t.name, t.data.iter().map(|x| x.to_bits()).collect()))
            .collect()
    }

    /// Issue 45: a state whose frozen base was changed (its file's checksum made to match)
    /// loaded and trained. Now the sha256 of the frozen parameters is recorded with them and
    /// a changed base is refused, by `load_state` and by `check_frozen`, which a resume runs
    /// before it picks a checkpoint.
    #[test]
    fn a_frozen_base_changed_since_it_was_saved_is_refused() {
        let device = Device::default().autodiff();
        let frozen = |net: Net| Net {
            a: net.a.no_grad(),
            b: net.b,
        };
        let trained = frozen(net(&device));
        let dir = tempfile::tempdir().unwrap();
        save_state(&trained, None, dir.path()).unwrap();
        let path = dir.path().join(PARAMETERS_FILE);
        let (tensors, metadata) = read_safetensors(&path).unwrap();
        assert!(metadata[FROZEN_KEY].contains("a.weight"), "{metadata:?}");
        check_frozen(dir.path()).unwrap();
        load_state(&frozen(net(&device)), None, dir.path()).unwrap();

        // what is trained may change; the base may not
        let edit = |name: &str, metadata: &HashMap<String, String>| {
            let mut changed = tensors.clone();
            changed.iter_mut().find(|t| t.name == name).unwrap().data[0] += 1.0;
            write_safetensors(&path, &changed, metadata).unwrap();
        };
        edit("b.weight", &metadata);
        check_frozen(dir.path()).unwrap();
        edit("a.weight", &metadata);
        let why = check_frozen(dir.path()).unwrap_err();
        assert!(why.contains("the base was changed"), "{why}");
        let why = load_state(&frozen(net(&device)), None, dir.path())
            .unwrap_err()
            .to_string();
        assert!(why.contains("the base was changed"), "{why}");
        // nor may its record go
        edit("b.weight", &HashMap::new());
        check_frozen(dir.path()).unwrap();
        let why = load_state(&frozen(net(&device)), None, dir.path())
            .unwrap_err()
            .to_string();
        assert!(why.contains("records no sha256"), "{why}");
        // a model that trains everything records nothing, and loads without
        save_state(&net(&device), None, dir.path()).unwrap();
        assert!(!read_safetensors(&path).unwrap().1.contains_key(FROZEN_KEY));
        load_state(&net(&device), None, dir.path()).unwrap();
    }

    /// Saved after three AdamW steps and loaded into a model and optimizer built afresh (new
    /// parameter ids), two more steps give the same bits as five steps without a break.
    #[test]
    fn a_state_loaded_into_a_fresh_model_continues_bit_for_bit() {
        let device = Device::default().autodiff();
        let xs: Vec<Tensor<2>> = (0..5)
            .map(|_| Tensor::random([2, 3], Distribution::Default, &device))
            .collect();
        let adamw = || AdamWConfig::new().with_weight_decay(0.01).init();
        let initial = net(&device);
        let mut straight = initial.clone();
        let mut optimizer = adamw();
        for x in &xs {
            straight = step(straight, &mut optimizer, x);
        }

        let mut first = initial.clone();
        let mut optimizer = adamw();
        for x in &xs[..3] {
            first = step(first, &mut optimizer, x);
        }
        let dir = tempfile::tempdir().unwrap();
        save_state(&first, Some(&optimizer), dir.path()).unwrap();
        let bytes = std::fs::read(dir.path().join(OPTIMIZER_FILE)).unwrap();
        save_state(&first, Some(&optimizer), dir.path()).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join(OPTIMIZER_FILE)).unwrap(),
            bytes,
            "the same state gives the same file"
        );

        // another model (other ids, other values) and an optimizer with no state
        let other = net(&device);
        let mut fresh = adamw();
        let mut resumed = load_state(&other, Some(&mut fresh), dir.path()).unwrap();
        assert_eq!(bits(&resumed), bits(&first));
        for x in &xs[3..] {
            resumed = step(resumed, &mut fresh, x);
        }
        assert_eq!(bits(&resumed), bits(&straight));
        assert_ne!(bits(&initial), bits(&straight));
    }

    #[test]
    fn a_state_of_another_model_is_refused_by_name_and_changes_nothing() {
        let device = Device::default().autodiff();
        let dir = tempfile::tempdir().unwrap();
        let wide = Net {
            a: LinearConfig::new(3, 5).init(&device),
            b: LinearConfig::new(5, 2).init(&device),
        };
        let mut optimizer = AdamWConfig::new().init();
        let x: Tensor<2> = Tensor::random([2, 3], Distribution::Default, &device);
        let wide = {
            let loss = wide.b.forward(wide.a.forward(x)).mean();
            let grads = GradientsParams::from_grads(loss.backward(), &wide);
            optimizer.step(0.01, wide, grads)
        };
        save_state(&wide, Some(&optimizer), dir.path()).unwrap();
        let mine = net(&device);
        let mut fresh = AdamWConfig::new().init();
        let e = load_state(&mine, Some(&mut fresh), dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("parameters.safetensors") && e.contains("a.weight"),
            "{e}"
        );
        assert!(e.contains("[3, 5]") && e.contains("[3, 4]"), "{e}");
        std::fs::remove_file(dir.path().join(PARAMETERS_FILE)).unwrap();
        let e = load_state(&mine, None, dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("cannot read") && e.contains(PARAMETERS_FILE),
            "{e}"
        );
    }
}
