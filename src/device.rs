//! Where a model runs: the CPU reference or a GPU. Every model family picks
//! its backend through [`DeviceChoice::build`], so the rules (a software
//! GPU or none at all falls back to the CPU with a notice unless the user
//! asked for a GPU; an explicit request that cannot be met is an error) are
//! written once.

use crate::error::Result;
use crate::gpu::{Gpu, GpuOptions};
use std::sync::Arc;

/// The device a tool asked for.
#[derive(Clone, Debug)]
pub enum DeviceChoice {
    Cpu,
    Gpu(GpuOptions),
}

/// An opened device.
pub enum Device {
    Cpu,
    Gpu(Arc<Gpu>),
}

impl DeviceChoice {
    /// True when the user named a backend or an adapter: a GPU that cannot
    /// serve the request is then an error rather than a fallback to the CPU.
    pub fn is_explicit_gpu(&self) -> bool {
        matches!(self, DeviceChoice::Gpu(o) if o.is_explicit())
    }

    /// Opens the device. Without `--gpu`, `--backend` or `--adapter`, a
    /// machine without a hardware GPU falls back to the CPU with a one-line
    /// notice (a software rasteriser such as lavapipe is slower than the CPU
    /// path); an explicit request that cannot be met is an error.
    pub fn open(&self) -> Result<Device> {
        match self {
            DeviceChoice::Cpu => Ok(Device::Cpu),
            DeviceChoice::Gpu(opts) => match Gpu::new(opts) {
                Ok(gpu) if !opts.is_explicit() && gpu.is_software() => {
                    crate::util::log::notice(&format!(
                        "only a software GPU ({}) found; running on the CPU (--gpu uses it anyway)",
                        gpu.info.name
                    ));
                    Ok(Device::Cpu)
                }
                Ok(gpu) => {
                    crate::util::log::notice(&gpu.describe());
                    Ok(Device::Gpu(Arc::new(gpu)))
                }
                Err(e) if !opts.is_explicit() => {
                    crate::util::log::notice(&format!("{e}; running on the CPU"));
                    Ok(Device::Cpu)
                }
                Err(e) => Err(e),
            },
        }
    }

    /// Builds a model on the chosen device: `gpu` with the opened adapter,
    /// else `cpu`. A GPU picked by default that cannot run the model (its
    /// limits, memory, a kernel its driver rejects) falls back to the CPU
    /// with a notice; one the user asked for is an error. Returns the model
    /// and whether it runs on the GPU.
    pub fn build<T>(
        &self,
        cpu: impl FnOnce() -> Result<T>,
        gpu: impl FnOnce(Arc<Gpu>) -> Result<T>,
    ) -> Result<(T, bool)> {
        match self.open()? {
            Device::Cpu => Ok((cpu()?, false)),
            Device::Gpu(g) => match gpu(g) {
                Ok(m) => Ok((m, true)),
                Err(e) if !self.is_explicit_gpu() => {
                    crate::util::log::notice(&format!("{e}; running on the CPU"));
                    Ok((cpu()?, false))
                }
                Err(e) => Err(e),
            },
        }
    }
}
