//! Choosing the training device from the config.

use burn::tensor::Device;

/// The device named by `train.device`, with autodiff enabled.
///
/// `cpu` is burn's `flex` backend. `cuda` / `cuda:N` need the `cuda` feature.
pub fn parse_device(name: &str) -> Result<Device, String> {
    match name {
        "cpu" => Ok(Device::flex().autodiff()),
        cuda if cuda == "cuda" || cuda.starts_with("cuda:") => {
            let index = match cuda.strip_prefix("cuda:") {
                None => 0usize,
                Some(n) => n
                    .parse::<usize>()
                    .map_err(|_| format!("`{cuda}`: the CUDA device index must be a number"))?,
            };
            cuda_device(index)
        }
        other => Err(format!(
            "unknown device {other:?}; expected \"cpu\" or \"cuda:N\""
        )),
    }
}

#[cfg(feature = "cuda")]
fn cuda_device(index: usize) -> Result<Device, String> {
    Ok(Device::cuda(index).autodiff())
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(index: usize) -> Result<Device, String> {
    Err(format!(
        "cuda:{index} asked for, but this build has no CUDA support (build areal-cli with --features cuda)"
    ))
}
