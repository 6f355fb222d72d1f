//! The wgpu backend: one context per process ([`Gpu`]), the kernel registry
//! ([`kernels`]), and typed wrappers that dispatch those kernels.
//!
//! Every kernel here has a CPU twin in [`crate::cpu`] with the same name and a
//! parity test in `tests/gpu_parity.rs`.

pub mod buffers;
pub mod context;
pub mod dense;
pub mod kernels;
pub mod llm_ops;
pub mod ops;
pub mod preprocess;
pub mod profile;
pub mod speech;
pub mod vision;
pub mod wait;
pub mod whisper;

pub use context::{quiet_headless_probe, Backend, Gpu, GpuOptions, SOFTWARE_LOOP_LIMIT};
pub use kernels::{Access, Kernel, Variant};
