//! `lfm`: run neural networks on any GPU.
//!
//! One engine with two backends that compute the same thing:
//! - [`cpu`]: the plain f32 reference, the no-GPU fallback and the oracle
//!   every GPU kernel is tested against;
//! - [`gpu`]: wgpu compute with hand-written WGSL kernels from `shaders/`,
//!   declared once in the kernel registry.
//!
//! Binaries in `src/bin` are thin shims over [`cli`], one module per tool.
//! The floors, top to bottom: `cli` -> `run` (shared flows) -> `models` ->
//! `gpu`, `cpu`, [`device`], [`sampling`] (with [`grammar`]) -> `formats`,
//! `quant`, `tensor`, `util`.

#[cfg(feature = "native")]
pub mod cli;
pub mod cpu;
pub mod device;
pub mod error;
pub mod formats;
pub mod gpu;
pub mod grammar;
pub mod models;
pub mod quant;
pub mod run;
pub mod sampling;
pub mod tensor;
pub mod tokenizer;
pub mod util;

pub use error::{Error, Result};
