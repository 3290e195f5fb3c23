//! Choosing the training device from the config.

use burn::tensor::Device;

/// The device named by `train.device` (`cpu` or `cuda:N`, see
/// [`areal_sdk_train::parse_device`]), with autodiff enabled.
pub fn parse_device(name: &str) -> Result<Device, String> {
    areal_sdk_train::parse_device(name).map(Device::autodiff)
}
