//! Shared flows that sit between the models and the tools.

pub mod bench;
pub mod chat;
pub mod embed;
pub mod generate;
pub mod sampling;
