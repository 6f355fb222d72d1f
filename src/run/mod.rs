//! Shared flows that sit between the models and the tools.

pub mod audio;
pub mod chat;
pub mod generate;
pub mod sampling;
pub mod transcribe;
