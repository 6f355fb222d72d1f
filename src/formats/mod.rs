//! Checkpoint file formats. Every weight container implements
//! [`TensorSource`], so a model loads its tensors by name without caring
//! whether they come from a GGUF file, a safetensors file or an HF directory.
//!
//! - [`gguf`]: memory-mapped GGUF v2/v3 reader and an atomic writer;
//! - [`gguf_stream`]: a GGUF writer that takes one tensor at a time;
//! - [`safetensors`]: a `.safetensors` file or a sharded HF checkpoint;
//! - [`hf`]: an HF model directory (`config.json` + safetensors weights);
//! - [`ct2`]: CTranslate2 `model.bin` (Whisper);
//! - [`npy`]: NumPy `.npy` arrays (small constant tables);
//! - [`onnx`]: the ONNX protobuf subset inference needs (graphs and weights).
//!
//! Every reader checks each count, length, dimension and offset against the
//! file before using it, and reports a bad file as one line naming the file.

pub mod ct2;
pub mod gguf;
pub mod gguf_stream;
pub mod hf;
pub mod npy;
pub mod onnx;
pub mod safetensors;

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::io::Read;
use std::path::Path;

/// Named tensors from a checkpoint.
pub trait TensorSource: Send + Sync {
    /// The tensor called `name`; an [`Error::Format`] naming the file and the
    /// tensor when there is none, [`Error::Unsupported`] when its element type
    /// is one lfm does not read.
    fn tensor(&self, name: &str) -> Result<Tensor>;
    fn has(&self, name: &str) -> bool;
    /// Every tensor name, in file order.
    fn names(&self) -> Vec<String>;
    /// The file or directory the tensors come from.
    fn path(&self) -> &Path;
}

/// The error for a tensor a checkpoint does not have.
pub(crate) fn missing_tensor(path: &Path, name: &str) -> Error {
    Error::format(path, format!("tensor '{name}' not found"))
}

/// Opens any checkpoint: a GGUF file, a `.safetensors` file, a sharded
/// `model.safetensors.index.json`, or an HF model directory.
pub fn open(path: &Path) -> Result<Box<dyn TensorSource>> {
    if path.is_dir() {
        return hf::open_checkpoint(path);
    }
    let mut magic = [0u8; 4];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut magic))
        .map_err(|e| Error::io(path, e))?;
    if n == 4 && &magic == gguf::MAGIC {
        Ok(Box::new(gguf::GgufFile::open(path)?))
    } else {
        Ok(Box::new(safetensors::Safetensors::open(path)?))
    }
}
