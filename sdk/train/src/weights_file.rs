//! Weights as a `.safetensors` file: what a checkpoint holds and what a generator server
//! loads from a shared filesystem. Written as float32; read from float32, bfloat16 or float16.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use areal_sdk::NamedTensor;
use safetensors::tensor::{Dtype, TensorView};

/// Why a weights file could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WeightsFileError {
    /// The file cannot be read or written.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// "read" or "write".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not safetensors, or a tensor does not match its shape.
    #[error("{}: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// Write `tensors` as float32 with `metadata` (the header's `__metadata__`; `format = pt` is
/// added), atomically: a reader sees the old file or the whole new one.
pub fn write_safetensors(
    path: &Path,
    tensors: &[NamedTensor],
    metadata: &HashMap<String, String>,
) -> Result<(), WeightsFileError> {
    let format = |message: String| WeightsFileError::Format {
        path: path.to_owned(),
        message,
    };
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.data.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, data)| {
            TensorView::new(Dtype::F32, t.shape.clone(), data)
                .map(|view| (t.name.clone(), view))
                .map_err(|e| format(format!("tensor `{}`: {e}", t.name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut metadata = metadata.clone();
    metadata.insert("format".to_owned(), "pt".to_owned());
    let serialized = safetensors::serialize(views, Some(metadata))
        .map_err(|e| format(format!("cannot serialise: {e}")))?;
    write_replacing(path, &serialized).map_err(|source| WeightsFileError::Io {
        action: "write",
        path: path.to_owned(),
        source,
    })
}

/// Write `bytes` to `path` through a temporary file renamed over it, so that a reader sees
/// the old file or the whole new one, with the permissions a plain create gives (the
/// umask's, not a temporary file's owner-only ones).
pub(crate) fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let mut builder = tempfile::Builder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut staged = builder.tempfile_in(dir.unwrap_or(Path::new(".")))?;
    std::io::Write::write_all(&mut staged, bytes)?;
    staged.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Every tensor of a `.safetensors` file as float32, in the file's order, with the header's
/// metadata.
pub fn read_safetensors(
    path: &Path,
) -> Result<(Vec<NamedTensor>, HashMap<String, String>), WeightsFileError> {
    // Within what this process can still hold, and only a regular file: a name a peer or a
    // folder gives may be a link to `/dev/zero`.
    let memory = areal_sdk::resources::available_memory().unwrap_or(u64::MAX);
    let bytes =
        areal_sdk::resources::read_file(path, memory).map_err(|source| WeightsFileError::Io {
            action: "read",
            path: path.to_owned(),
            source,
        })?;
    let format = |message: String| WeightsFileError::Format {
        path: path.to_owned(),
        message,
    };
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| format(format!("not a safetensors file: {e}")))?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let file = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| format(format!("not a safetensors file: {e}")))?;
    let mut out = Vec::new();
    for (name, view) in file.iter() {
        let raw = view.data();
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => raw
                .chunks_exact(2)
                .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
                .collect(),
            Dtype::F16 => raw
                .chunks_exact(2)
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            other => return Err(format(format!("tensor `{name}` has dtype {other:?}"))),
        };
        out.push(NamedTensor {
            name: name.to_owned(),
            shape: view.shape().to_vec(),
            data,
        });
    }
    Ok((out, metadata))
}

/// IEEE half to single precision.
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, _) => {
            // subnormal: normalise
            let mut e = 127 - 15 + 1;
            let mut f = frac;
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((f & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (frac << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_and_metadata_survive_a_round_trip_in_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let tensors = vec![
            NamedTensor {
                name: "z.weight".into(),
                shape: vec![2, 3],
                data: vec![1.0, -2.5, 3.25, 0.0, f32::MIN_POSITIVE, 7.0],
            },
            NamedTensor {
                name: "a.bias".into(),
                shape: vec![2],
                data: vec![0.5, -0.5],
            },
        ];
        let metadata = HashMap::from([("areal.version".to_owned(), "7".to_owned())]);
        write_safetensors(&path, &tensors, &metadata).unwrap();
        let (back, meta) = read_safetensors(&path).unwrap();
        let mut sorted = tensors.clone();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let mut back_sorted = back;
        back_sorted.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(back_sorted, sorted);
        assert_eq!(meta["areal.version"], "7");
        assert_eq!(meta["format"], "pt");
    }

    #[test]
    fn a_file_that_is_not_safetensors_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, b"not a tensor file").unwrap();
        let e = read_safetensors(&path).unwrap_err().to_string();
        assert!(
            e.contains("model.safetensors") && e.contains("not a safetensors"),
            "{e}"
        );
        let missing = read_safetensors(&dir.path().join("none"))
            .unwrap_err()
            .to_string();
        assert!(missing.starts_with("cannot read"), "{missing}");
    }

    #[test]
    fn half_precision_widens_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert_eq!(f32::from_bits(u32::from(0x3f80u16) << 16), 1.0, "bf16 1.0");
    }
}
