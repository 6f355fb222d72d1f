//! Shared flows that sit between the models and the tools.

pub mod bench;
pub mod chat;
pub mod convert;
pub mod embed;
pub mod generate;
pub mod kld;
pub mod sampling;
