//! Shared flows that sit between the models and the tools.

pub mod embed;
