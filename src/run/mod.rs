//! Shared flows that sit between the models and the tools.

pub mod audio;
pub mod bench;
pub mod chat;
pub mod convert;
pub mod embed;
pub mod generate;
/// The grammar engine lives below sampling, which masks with it; this keeps
/// its old path.
pub use crate::grammar;
pub mod image;
pub mod kld;
#[cfg(feature = "native")]
pub mod pdf;
#[cfg(feature = "native")]
pub mod phonemes;
pub mod prompt_cache;
/// Sampling lives below the models that use it; this keeps its old path.
pub use crate::sampling;
#[cfg(feature = "native")]
pub mod serve;
pub mod speculative;
pub mod transcribe;
pub mod wav;
