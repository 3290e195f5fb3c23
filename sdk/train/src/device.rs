//! Naming a burn device in a config: `cpu` or `cuda:N`.

use burn::tensor::Device;

/// The device named `name`, without autodiff (generators decode on it; trainers add
/// `.autodiff()`).
///
/// `cpu` is burn's `flex` backend. `cuda` / `cuda:N` need the `cuda` feature of this crate
/// (areal-cli's `cuda` feature turns it on).
pub fn parse_device(name: &str) -> Result<Device, String> {
    match name {
        "cpu" => Ok(Device::flex()),
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
    Ok(Device::cuda(index))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(index: usize) -> Result<Device, String> {
    Err(format!(
        "cuda:{index} asked for, but this build has no CUDA support (build areal-cli with --features cuda)"
    ))
}

#[cfg(test)]
mod tests {
    use super::parse_device;

    #[test]
    fn names_are_checked() {
        assert!(parse_device("cpu").is_ok());
        assert!(
            parse_device("cuda:x")
                .unwrap_err()
                .contains("must be a number")
        );
        assert!(
            parse_device("tpu")
                .unwrap_err()
                .contains("expected \"cpu\" or \"cuda:N\"")
        );
        #[cfg(not(feature = "cuda"))]
        assert!(
            parse_device("cuda:1")
                .unwrap_err()
                .contains("--features cuda")
        );
    }
}
