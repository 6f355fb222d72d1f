//! Shared flows that sit between the models and the tools.

pub mod audio;
pub mod bench;
pub mod chat;
pub mod convert;
pub mod embed;
pub mod generate;
pub mod grammar;
pub mod image;
pub mod kld;
pub mod phonemes;
pub mod sampling;
pub mod transcribe;
pub mod wav;
