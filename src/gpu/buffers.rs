//! Creating, filling and reading back storage buffers.

use super::Gpu;
use crate::error::{Error, Result};
use wgpu::util::DeviceExt;

const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl Gpu {
    /// A storage buffer holding `bytes`, padded to a multiple of 4 bytes.
    pub fn upload(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
        self.check_size(label, bytes.len() as u64)?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = if bytes.len().is_multiple_of(4) && !bytes.is_empty() {
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents: bytes,
                    usage: STORAGE,
                })
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4).max(1) * 4, 0);
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents: &padded,
                    usage: STORAGE,
                })
        };
        if let Some(e) = super::wait::block_on(scope.pop()) {
            return Err(Error::gpu(format!(
                "uploading {label} ({} bytes): {e}",
                bytes.len()
            )));
        }
        Ok(buf)
    }

    pub fn upload_f32(&self, label: &str, data: &[f32]) -> Result<wgpu::Buffer> {
        self.upload(label, bytemuck::cast_slice(data))
    }

    pub fn upload_u32(&self, label: &str, data: &[u32]) -> Result<wgpu::Buffer> {
        self.upload(label, bytemuck::cast_slice(data))
    }

    /// An uninitialised storage buffer of `bytes` (rounded up to 4).
    pub fn scratch(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
        self.check_size(label, bytes)?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.div_ceil(4).max(1) * 4,
            usage: STORAGE,
            mapped_at_creation: false,
        });
        if let Some(e) = super::wait::block_on(scope.pop()) {
            return Err(Error::gpu(format!(
                "allocating {label} ({bytes} bytes): {e}"
            )));
        }
        Ok(buf)
    }

    /// A storage buffer of at least `bytes` for partial sums that one
    /// dispatch writes and the next one reads (a split GEMV's): one buffer
    /// shared by every such pair, replaced by a larger one when a pair needs
    /// more (what was bound to the old one keeps it).
    pub fn partials(&self, bytes: u64) -> Result<wgpu::Buffer> {
        let mut held = self.partials.lock().expect("partials poisoned");
        if let Some(buf) = held.as_ref().filter(|b| b.size() >= bytes) {
            return Ok(buf.clone());
        }
        let buf = self.scratch("partial sums", bytes)?;
        *held = Some(buf.clone());
        Ok(buf)
    }

    /// `n` f32s all set to NaN: tests poison outputs so that an element the
    /// kernel forgot to write fails the comparison.
    pub fn poisoned_f32(&self, label: &str, n: usize) -> Result<wgpu::Buffer> {
        self.upload_f32(label, &vec![f32::NAN; n.max(1)])
    }

    fn check_size(&self, label: &str, bytes: u64) -> Result<()> {
        if bytes > self.caps.max_buffer {
            return Err(Error::gpu(format!(
                "{label}: {bytes} bytes exceeds the adapter's {} byte buffer limit",
                self.caps.max_buffer
            )));
        }
        Ok(())
    }

    /// Copies `buf` back to the host.
    pub fn read_bytes(&self, buf: &wgpu::Buffer) -> Result<Vec<u8>> {
        let size = buf.size();
        let staging = self.staging("readback", size);
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, 0, &staging, 0, size);
        self.submit_and_read(enc, &staging, size)
    }

    /// A buffer results are copied into for the host to read (see
    /// [`Gpu::submit_and_read`]); `bytes` is rounded up to 4.
    pub fn staging(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.div_ceil(4).max(1) * 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Submits `enc`, whose last commands copy results into `staging`, and
    /// returns the first `len` bytes of `staging` once the device is done:
    /// one submission and one wait, so a decode step costs one round trip.
    pub fn submit_and_read(
        &self,
        enc: wgpu::CommandEncoder,
        staging: &wgpu::Buffer,
        len: u64,
    ) -> Result<Vec<u8>> {
        let done = self.queue.submit([enc.finish()]);
        self.read_staging(staging, len, done)
    }

    /// The first `len` bytes of `staging` once submission `done`, which
    /// writes it, has finished; later submissions may still be running.
    pub fn read_staging(
        &self,
        staging: &wgpu::Buffer,
        len: u64,
        done: wgpu::SubmissionIndex,
    ) -> Result<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, ..len, move |r| {
            let _ = tx.send(r);
        });
        super::wait::wait_mapped(&self.device, Some(done), rx, "readback")?;
        let bytes = staging
            .get_mapped_range(..len)
            .map_err(|e| Error::gpu(format!("readback: {e}")))?
            .to_vec();
        staging.unmap();
        Ok(bytes)
    }

    pub fn read_f32(&self, buf: &wgpu::Buffer) -> Result<Vec<f32>> {
        Ok(bytemuck::pod_collect_to_vec(&self.read_bytes(buf)?))
    }

    pub fn read_u32(&self, buf: &wgpu::Buffer) -> Result<Vec<u32>> {
        Ok(bytemuck::pod_collect_to_vec(&self.read_bytes(buf)?))
    }
}
