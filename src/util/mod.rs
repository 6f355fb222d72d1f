//! Small helpers shared by every part of the engine.

pub mod alloc;
pub mod atomic_write;
pub mod date;
pub mod fs;
pub mod log;
pub mod par;
pub mod progress;
pub mod rng;
