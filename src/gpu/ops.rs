//! Typed dispatch wrappers for the general tensor kernels. Each returns a
//! [`Dispatch`] (kernel bound to its buffers plus workgroup counts) that a
//! caller records alone or into a larger command buffer.

use super::context::Bound;
use super::kernels::{Binding, Kernel, Variant};
use super::Gpu;
use crate::error::Result;
use crate::kernel;

/// A bound kernel and how many workgroups to launch.
pub struct Dispatch {
    pub bound: Bound,
    pub groups: [u32; 3],
}

impl Dispatch {
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.bound.record(pass, self.groups);
    }
}

impl Gpu {
    /// Records `work` in order into one submission and waits for it.
    pub fn run_all(&self, work: &[&Dispatch]) -> Result<()> {
        let v: Vec<_> = work.iter().map(|d| (&d.bound, d.groups)).collect();
        self.run(&v)
    }

    /// Records `work` in order, then a copy of `out`'s first `bytes` to the
    /// host, as one submission; waits and returns those bytes.
    pub fn run_and_read(
        &self,
        work: &[&Dispatch],
        out: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<Vec<u8>> {
        let queued = self.queue_and_copy(work, out, bytes);
        self.read_queued(queued)
    }

    /// Records `work` in order, then a copy of `out`'s first `bytes` into a
    /// new staging buffer, and submits it without waiting: the host may
    /// record more while the device works, and reads the copy with
    /// [`Gpu::read_queued`].
    pub fn queue_and_copy(&self, work: &[&Dispatch], out: &wgpu::Buffer, bytes: u64) -> Queued {
        self.queue_and_copy_all(work, &[(out, bytes)], None)
    }

    /// As [`Gpu::queue_and_copy`], copying the first bytes of several
    /// buffers, one after the other (each rounded up to 4 bytes). With
    /// `stamps` = (timer, marks), timestamp i is written before dispatch
    /// `marks[i]` (`work.len()`: after the last) and resolved for
    /// [`super::profile::PassTimer::read`].
    pub fn queue_and_copy_all(
        &self,
        work: &[&Dispatch],
        outs: &[(&wgpu::Buffer, u64)],
        stamps: Option<(&super::profile::PassTimer, &[usize])>,
    ) -> Queued {
        self.submit_recorded(self.record_and_copy_all(work, outs, stamps))
    }

    /// [`Gpu::queue_and_copy_all`]'s command buffer, recorded (on any
    /// thread) but not submitted: [`Gpu::submit_recorded`] submits it.
    pub fn record_and_copy_all(
        &self,
        work: &[&Dispatch],
        outs: &[(&wgpu::Buffer, u64)],
        stamps: Option<(&super::profile::PassTimer, &[usize])>,
    ) -> Recorded {
        let mut enc = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            let mut next = 0;
            for i in 0..=work.len() {
                if let Some((timer, marks)) = stamps {
                    while marks.get(next) == Some(&i) {
                        timer.mark(&mut pass, next as u32);
                        next += 1;
                    }
                }
                if let Some(d) = work.get(i) {
                    d.record(&mut pass);
                }
            }
        }
        if let Some((timer, marks)) = stamps {
            timer.resolve(&mut enc, marks.len() as u32);
        }
        let sizes: Vec<u64> = outs.iter().map(|(_, b)| b.div_ceil(4).max(1) * 4).collect();
        let bytes = sizes.iter().sum();
        let staging = self.staging("readback", bytes);
        let mut at = 0;
        for ((out, _), size) in outs.iter().zip(sizes) {
            enc.copy_buffer_to_buffer(out, 0, &staging, at, size);
            at += size;
        }
        Recorded {
            commands: enc.finish(),
            staging,
            bytes,
        }
    }

    /// Submits what [`Gpu::record_and_copy_all`] recorded.
    pub fn submit_recorded(&self, r: Recorded) -> Queued {
        let done = self.queue.submit([r.commands]);
        Queued {
            staging: r.staging,
            bytes: r.bytes,
            done,
        }
    }

    /// The bytes a [`Gpu::queue_and_copy`] submission copied, once it is done.
    pub fn read_queued(&self, q: Queued) -> Result<Vec<u8>> {
        self.read_staging(&q.staging, q.bytes, q.done)
    }

    /// The variant to use on this adapter: subgroup reductions when present.
    pub fn reduce_variant(&self) -> Variant {
        if self.caps.subgroups {
            Variant::new(&["SUBGROUPS"])
        } else {
            Variant::default()
        }
    }
}

/// A submission recorded, not yet submitted.
pub struct Recorded {
    commands: wgpu::CommandBuffer,
    staging: wgpu::Buffer,
    bytes: u64,
}

/// A submission in flight whose result the host reads back later.
pub struct Queued {
    staging: wgpu::Buffer,
    bytes: u64,
    done: wgpu::SubmissionIndex,
}

impl Queued {
    /// The submission, for reading what else it resolved (timestamps).
    pub fn submission(&self) -> wgpu::SubmissionIndex {
        self.done.clone()
    }
}

/// Workgroup counts for `n` items at `per_group` items a workgroup, spread
/// over x and y so no dimension exceeds the 65535 limit.
pub fn groups_1d(n: usize, per_group: usize) -> [u32; 3] {
    let groups = n.div_ceil(per_group).max(1);
    if groups <= 65535 {
        [groups as u32, 1, 1]
    } else {
        let y = groups.div_ceil(65535);
        [groups.div_ceil(y) as u32, y as u32, 1]
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AddParams {
    n: u32,
    _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<AddParams>() == 16);

kernel!(
    ADD,
    "add",
    "add.wgsl",
    [Binding::read("a"), Binding::read("b"), Binding::write("y")],
    AddParams,
    [&[]]
);

/// `y = a + b` over `n` elements.
pub fn add(
    gpu: &Gpu,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: usize,
) -> Result<Dispatch> {
    let params = AddParams {
        n: n as u32,
        _pad: [0; 3],
    };
    let bound = gpu.bind(&ADD, &Variant::default(), &[a, b, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(n, 256),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RmsNormParams {
    n: u32,
    rows: u32,
    eps: f32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<RmsNormParams>() == 16);

kernel!(
    RMS_NORM,
    "rms_norm",
    "rms_norm.wgsl",
    [Binding::read("x"), Binding::read("w"), Binding::write("y")],
    RmsNormParams,
    [&[], &["SUBGROUPS"], &["ADD"], &["ADD", "SUBGROUPS"]]
);

/// `y[r] = w * x[r] / rms(x[r])` for `rows` rows of `n` (`y[r] +=` with the
/// ADD variant).
// The arguments are the kernel's bindings and params, as in every dispatch wrapper.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(
    gpu: &Gpu,
    variant: &Variant,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: usize,
    rows: usize,
    eps: f32,
) -> Result<Dispatch> {
    let params = RmsNormParams {
        n: n as u32,
        rows: rows as u32,
        eps,
        _pad: 0,
    };
    let bound = gpu.bind(&RMS_NORM, variant, &[x, w, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: [rows as u32, 1, 1],
    })
}

kernel!(
    COPY,
    "copy",
    "copy.wgsl",
    [Binding::read("x"), Binding::write("y")],
    AddParams,
    [&[]]
);

/// `y = x` over `words` u32s (a multiple of 4), by `groups` workgroups that
/// stride over the buffer.
pub fn copy(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    words: usize,
    groups: usize,
) -> Result<Dispatch> {
    assert!(
        words.is_multiple_of(4),
        "copy: {words} words is not whole vec4s"
    );
    let params = AddParams {
        n: (words / 4) as u32,
        _pad: [0; 3],
    };
    let bound = gpu.bind(&COPY, &Variant::default(), &[x, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(groups, 1),
    })
}

/// The kernels declared in this module.
pub static KERNELS: &[&Kernel] = &[&ADD, &RMS_NORM, &COPY];
