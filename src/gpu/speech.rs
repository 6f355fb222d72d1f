//! Kernels for speech models (VITS / HiFi-GAN): 1-D convolution and
//! transposed convolution over `[channels, time]` activations, with the leaky
//! ReLU that precedes every convolution in the generator fused into the input
//! read, and the residual add and final tanh fused into the output write.
//! The flow's WaveNet gate (tanh * sigmoid with a conditioning offset).
//! The prior's pieces: layer norm across channels, the duration predictor's
//! depthwise convolution and spline, relative-position attention, length
//! regulation with the prior's noise, the text encoder's embedding lookup.
//! A sentence's frame count is computed on the device ([`durations`]), so
//! the kernels that run over frames take their length as [`Steps`]: fixed
//! when recorded, or read from the device's count, with the workgroup counts
//! written there too (indirect dispatches). A count may hold several
//! sentences (a batch): their activations lie one after another in the same
//! buffers, a sentence's at its index times a fixed stride, and the kernels
//! over frames run each sentence as a slice of workgroups along z, sized for
//! the longest, each slice reading its own length (what lies past it is
//! never read or written), so every sentence gets the bits it gets alone.
//! CPU twins: `cpu::conv1d`, `cpu::conv_transpose1d`, `cpu::leaky_relu`,
//! `cpu::wavenet_gate`, and those of `cpu::speech`.

use super::context::Bound;
use super::kernels::{Binding, Kernel, Variant};
use super::ops::Dispatch;
use super::Gpu;
use crate::cpu::{self, Conv1dShape, ConvTranspose1dShape};
use crate::error::{Error, Result};
use crate::kernel;
use std::cell::RefCell;

/// The most workgroups a dispatch may have along one dimension (WebGPU's
/// `maxComputeWorkgroupsPerDimension`, what every adapter offers).
pub const MAX_GROUPS: usize = 65535;

/// Workgroup counts for `n` items at `per_group` a workgroup: up to
/// [`MAX_GROUPS`] along x, then more rows of that many (the kernels that
/// take it index `wid.y * 65535 + wid.x`, without `num_workgroups`, which
/// D3D12 leaves at 0 in indirect dispatches).
pub fn groups_wide(n: usize, per_group: usize) -> [u32; 3] {
    let groups = n.div_ceil(per_group).max(1);
    [
        groups.min(MAX_GROUPS) as u32,
        groups.div_ceil(MAX_GROUPS) as u32,
        1,
    ]
}

/// How a dispatch over a sentence's frames is sized: `frames * mul + add`
/// items at `per` a workgroup, in `rows` rows (a convolution's blocks of 8
/// output channels), or, with `rows` 0, spread as [`groups_wide`] does; `z`
/// slices of them (the sentences of a batch it runs).
/// [`durations`] writes the counts on the device; [`Geometry::groups`] is
/// its twin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub mul: u32,
    pub add: i32,
    pub per: u32,
    pub rows: u32,
    pub z: u32,
}

impl Geometry {
    /// The workgroup counts at `frames` frames, as [`durations`] writes them.
    pub fn groups(&self, frames: usize) -> [u32; 3] {
        let most = i32::MAX as i64;
        let n = if self.mul != 0 && frames as i64 > most / self.mul as i64 {
            most
        } else {
            (frames as i64 * self.mul as i64 + self.add as i64).max(0)
        } as u64;
        let groups = n.div_ceil(self.per as u64);
        let max = MAX_GROUPS as u64;
        let z = self.z as u64;
        let dims = if self.rows > 0 {
            [groups, self.rows as u64, z]
        } else {
            [groups.min(max), groups.div_ceil(max), z]
        };
        dims.map(|d| d.min(max) as u32)
    }

    fn words(&self) -> [u32; 8] {
        [
            self.mul,
            self.add as u32,
            self.per,
            self.rows,
            self.z,
            0,
            0,
            0,
        ]
    }
}

/// How many distinct [`Geometry`]s one sentence's dispatches may have.
pub const MAX_GEOMETRIES: usize = 64;

/// The frame counts of a batch of sentences on the device: `lens` =
/// [frames, total] a sentence (see [`durations`]), with the indirect
/// workgroup counts of the dispatches that run over the frames and the
/// table of their geometries. `cap` is how many frames the buffers behind it
/// are made for, for each of its `batch` sentences.
pub struct FrameCount {
    pub lens: wgpu::Buffer,
    /// The workgroup counts, three u32s a geometry ([`FrameCount::slot`]).
    pub args: wgpu::Buffer,
    table: wgpu::Buffer,
    geometries: RefCell<Vec<Geometry>>,
    /// Frames the host already knows, a sentence (the counts are then
    /// written from here).
    known: Option<Vec<usize>>,
    pub cap: usize,
    pub batch: usize,
}

impl FrameCount {
    /// A count [`durations`] will write, for buffers of at most `cap` frames.
    pub fn new(gpu: &Gpu, cap: usize) -> Result<FrameCount> {
        Self::make(gpu, cap, 1, None)
    }

    /// The counts of `batch` sentences, each given buffers of `cap` frames,
    /// that [`durations`] will write, one dispatch a sentence.
    pub fn batch(gpu: &Gpu, cap: usize, batch: usize) -> Result<FrameCount> {
        Self::make(gpu, cap, batch, None)
    }

    /// The counts of sentences the host knows (each of `frames` in 1 ..=
    /// `cap`): written now, the workgroup counts by [`FrameCount::finish`],
    /// so the same kernels run as after [`durations`] (per-stage runs, tests).
    pub fn known(gpu: &Gpu, frames: &[usize], cap: usize) -> Result<FrameCount> {
        assert!(
            !frames.is_empty() && frames.iter().all(|f| (1..=cap).contains(f)),
            "FrameCount::known: {frames:?} frames, cap {cap}"
        );
        let count = Self::make(gpu, cap, frames.len(), Some(frames.to_vec()))?;
        let lens: Vec<u32> = frames.iter().flat_map(|&f| [f as u32; 2]).collect();
        gpu.queue
            .write_buffer(&count.lens, 0, bytemuck::cast_slice(&lens));
        Ok(count)
    }

    fn make(gpu: &Gpu, cap: usize, batch: usize, known: Option<Vec<usize>>) -> Result<FrameCount> {
        if cap == 0 || cap > u32::MAX as usize / 2 || batch == 0 || batch > MAX_GROUPS {
            return Err(Error::gpu(format!(
                "a frame count for {batch} sentences of {cap} frames"
            )));
        }
        let args = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("frames.args"),
            size: (MAX_GEOMETRIES * 12) as u64,
            usage: wgpu::BufferUsages::INDIRECT
                | wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(FrameCount {
            lens: gpu.scratch("frames.lens", (8 * batch) as u64)?,
            table: gpu.scratch("frames.geometry", (MAX_GEOMETRIES * 32) as u64)?,
            args,
            geometries: RefCell::new(Vec::new()),
            known,
            cap,
            batch,
        })
    }

    /// `frames * mul + add` steps, of every sentence of the batch.
    pub fn steps(&self, mul: u32, add: i32) -> Steps<'_> {
        Steps {
            count: Some(self),
            mul,
            add,
            first: 0,
            sentences: self.batch as u32,
        }
    }

    /// The offset in [`FrameCount::args`] of the workgroup counts of a
    /// dispatch sized by `g` (the dispatch wrappers call it).
    pub fn slot(&self, g: Geometry) -> Result<u64> {
        let mut list = self.geometries.borrow_mut();
        let i = match list.iter().position(|&h| h == g) {
            Some(i) => i,
            None if list.len() < MAX_GEOMETRIES => {
                list.push(g);
                list.len() - 1
            }
            None => {
                return Err(Error::gpu(format!(
                    "more than {MAX_GEOMETRIES} dispatch geometries over a sentence's frames"
                )))
            }
        };
        Ok(i as u64 * 12)
    }

    /// Writes the geometries (and, for a [`FrameCount::known`] count, the
    /// workgroup counts) for the next submission: call it after recording
    /// every dispatch over these frames, before submitting them.
    pub fn finish(&self, gpu: &Gpu) {
        let list = self.geometries.borrow();
        // Unused entries size nothing: 0 items.
        let mut words = vec![[0u32, 0, 1, 1, 1, 0, 0, 0]; MAX_GEOMETRIES];
        for (w, g) in words.iter_mut().zip(list.iter()) {
            *w = g.words();
        }
        gpu.queue
            .write_buffer(&self.table, 0, bytemuck::cast_slice(&words));
        if let Some(frames) = &self.known {
            // Sized for the longest sentence, as `durations` sizes them.
            let most = frames.iter().copied().max().unwrap_or(0);
            let args: Vec<[u32; 3]> = list.iter().map(|g| g.groups(most)).collect();
            if !args.is_empty() {
                gpu.queue
                    .write_buffer(&self.args, 0, bytemuck::cast_slice(&args));
            }
        }
    }
}

/// How many time steps a dispatch covers: fixed when it is recorded, or
/// `frames * mul + add` with `frames` a [`FrameCount`] on the device, which
/// the kernel reads from the count's `lens` and whose dispatch is sized
/// there (indirect); for the count's sentences `first .. first +
/// sentences`, each at its index times [`Steps::stride`] in the buffers.
#[derive(Clone, Copy)]
pub struct Steps<'a> {
    count: Option<&'a FrameCount>,
    mul: u32,
    add: i32,
    first: u32,
    sentences: u32,
}

impl<'a> Steps<'a> {
    pub fn fixed(t: usize) -> Steps<'static> {
        Steps {
            count: None,
            mul: 0,
            add: t as i32,
            first: 0,
            sentences: 1,
        }
    }

    /// These steps for sentence `s` of the batch alone.
    pub fn sentence(self, s: usize) -> Steps<'a> {
        assert!(
            s < self.batch(),
            "Steps::sentence: sentence {s} of {}",
            self.batch()
        );
        Steps {
            first: s as u32,
            sentences: 1,
            ..self
        }
    }

    /// How many sentences the buffers over these steps hold.
    pub fn batch(&self) -> usize {
        self.count.map_or(1, |c| c.batch)
    }

    /// Where each sentence's `c` channels of these steps start in a buffer,
    /// in elements apart (the steps at the count's cap).
    pub fn stride(&self, c: usize) -> usize {
        c * self.max()
    }

    /// Bytes of a buffer of `c` channels over these steps, for every
    /// sentence of the batch.
    pub fn bytes(&self, c: usize) -> u64 {
        (self.stride(c) * self.batch() * 4) as u64
    }

    /// The steps at `frames` frames.
    pub fn at(&self, frames: usize) -> usize {
        (frames as i64 * self.mul as i64 + self.add as i64).max(0) as usize
    }

    /// The most steps there may be: at the count's cap.
    pub fn max(&self) -> usize {
        self.at(self.count.map_or(0, |c| c.cap))
    }

    /// After a convolution of shape `s` (stride 1).
    pub fn conv(self, s: &Conv1dShape) -> Steps<'a> {
        let grow = (s.pad_left + s.pad_right) as i64 - (s.dilation * (s.kernel - 1)) as i64;
        Steps {
            add: (self.add as i64 + grow) as i32,
            ..self
        }
    }

    /// After a transposed convolution of shape `s`: (t - 1) stride + kernel - 2 pad.
    pub fn conv_transpose(self, s: &ConvTranspose1dShape) -> Steps<'a> {
        let st = s.stride as i64;
        Steps {
            mul: self.mul * s.stride as u32,
            add: ((self.add as i64 - 1) * st + s.kernel as i64 - 2 * s.pad as i64) as i32,
            ..self
        }
    }

    /// The kernel's `lens` binding: the count's, or (fixed) any buffer the
    /// dispatch reads, multiplied by 0.
    fn lens<'b>(&self, any: &'b wgpu::Buffer) -> &'b wgpu::Buffer
    where
        'a: 'b,
    {
        self.count.map_or(any, |c| &c.lens)
    }

    /// A dispatch of `bound` over these steps, `c` items a step: `rows`
    /// rows of ceil(steps / per) workgroups, or (rows 0) the steps' c items
    /// spread as [`groups_wide`] does.
    fn dispatch(
        &self,
        name: &str,
        bound: Bound,
        c: usize,
        per: usize,
        rows: u32,
    ) -> Result<Dispatch> {
        let g = Geometry {
            mul: self.mul * c as u32,
            add: self.add * c as i32,
            per: per as u32,
            rows,
            z: self.sentences,
        };
        // The largest the counts get (at the cap): within one dispatch.
        let n = g.mul as u64 * self.count.map_or(0, |c| c.cap) as u64 + g.add.max(0) as u64;
        let groups = n.div_ceil(per as u64);
        if (rows > 0 && groups > MAX_GROUPS as u64) || groups > (MAX_GROUPS * MAX_GROUPS) as u64 {
            return Err(Error::gpu(format!(
                "{name}: {} steps exceed one dispatch; synthesise shorter sentences",
                self.max()
            )));
        }
        let frames = self.count.map_or(0, |c| c.cap);
        match self.count {
            None => Ok(Dispatch {
                bound,
                groups: if rows > 0 {
                    [groups.max(1) as u32, rows, 1]
                } else {
                    groups_wide(n as usize, per)
                },
            }),
            Some(count) => {
                let at = count.slot(g)?;
                Ok(Dispatch {
                    bound: bound.indirect(&count.args, at),
                    groups: g.groups(frames),
                })
            }
        }
    }
}

/// Time steps per workgroup and output channels per invocation (the
/// shaders' WG and their two vec4 accumulators).
const WG: usize = 64;
const OB: usize = 8;

/// Output channels rounded up to whole 8-channel blocks.
fn c_out_pad(c_out: usize) -> usize {
    c_out.div_ceil(OB) * OB
}

/// `Conv1d` weights [c_out, c_in, k] in the kernel's layout
/// [c_in, k, c_out_pad] (c_out_pad = c_out rounded up to 8, zero filled), so
/// the 8 channels an invocation computes are two adjacent vec4 loads.
pub fn pack_conv1d_weights(w: &[f32], s: &Conv1dShape) -> Vec<f32> {
    assert_eq!(s.groups, 1, "gpu conv1d: groups must be 1");
    assert_eq!(
        w.len(),
        s.c_out * s.c_in * s.kernel,
        "pack_conv1d_weights: shape"
    );
    let cp = c_out_pad(s.c_out);
    let mut out = vec![0.0; s.c_in * s.kernel * cp];
    for o in 0..s.c_out {
        for i in 0..s.c_in {
            for k in 0..s.kernel {
                out[(i * s.kernel + k) * cp + o] = w[(o * s.c_in + i) * s.kernel + k];
            }
        }
    }
    out
}

/// `ConvTranspose1d` weights [c_in, c_out, k] in the kernel's layout
/// [c_in, k, c_out_pad].
pub fn pack_conv_transpose1d_weights(w: &[f32], s: &ConvTranspose1dShape) -> Vec<f32> {
    assert_eq!(
        w.len(),
        s.c_in * s.c_out * s.kernel,
        "pack_conv_transpose1d_weights: shape"
    );
    let cp = c_out_pad(s.c_out);
    let mut out = vec![0.0; s.c_in * s.kernel * cp];
    for i in 0..s.c_in {
        for o in 0..s.c_out {
            for k in 0..s.kernel {
                out[(i * s.kernel + k) * cp + o] = w[(i * s.c_out + o) * s.kernel + k];
            }
        }
    }
    out
}

/// Leaky ReLU (and a scale) applied to a kernel's input as it is read:
/// `v = x * scale; if v < 0 { v *= slope }`. `slope = 1` is no activation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InputAct {
    pub scale: f32,
    pub slope: f32,
}

impl InputAct {
    pub const NONE: InputAct = InputAct {
        scale: 1.0,
        slope: 1.0,
    };
    pub fn leaky(slope: f32) -> InputAct {
        InputAct { scale: 1.0, slope }
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Conv1dParams {
    c_in: u32,
    c_out: u32,
    t_mul: u32,
    t_add: i32,
    kernel: u32,
    dilation: u32,
    pad_left: u32,
    pad_right: u32,
    in_scale: f32,
    in_slope: f32,
    flags: u32,
    c_out_pad: u32,
    /// The first sentence (workgroup z = 0) and where each sentence's x and
    /// y (res, sum) start, in elements apart.
    first: u32,
    x_stride: u32,
    y_stride: u32,
    _p0: u32,
}
const _: () = assert!(std::mem::size_of::<Conv1dParams>() == 64);

kernel!(
    CONV1D,
    "conv1d",
    "conv1d.wgsl",
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("b"),
        Binding::read("res"),
        Binding::read("sum"),
        Binding::read("lens"),
        Binding::write("y"),
    ],
    Conv1dParams,
    [&[]]
);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ConvTranspose1dParams {
    c_in: u32,
    c_out: u32,
    t_mul: u32,
    t_add: i32,
    kernel: u32,
    stride: u32,
    pad: u32,
    c_out_pad: u32,
    in_scale: f32,
    in_slope: f32,
    /// Where each sentence's x and y start, in elements apart.
    x_stride: u32,
    y_stride: u32,
    /// The first sentence (workgroup z = 0).
    first: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}
const _: () = assert!(std::mem::size_of::<ConvTranspose1dParams>() == 64);

kernel!(
    CONV_TRANSPOSE1D,
    "conv_transpose1d",
    "conv_transpose1d.wgsl",
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("b"),
        Binding::read("lens"),
        Binding::write("y"),
    ],
    ConvTranspose1dParams,
    [&[]]
);

/// Optional fused pieces of a [`conv1d`] dispatch.
#[derive(Clone, Copy, Default)]
pub struct Conv1dExtras<'a> {
    /// Added to the output (same shape as y).
    pub residual: Option<&'a wgpu::Buffer>,
    /// Added after the residual (a running sum of outputs: the decoder's
    /// residual blocks).
    pub sum: Option<&'a wgpu::Buffer>,
    /// tanh on the output.
    pub tanh: bool,
}

/// y = act_out(conv1d(act_in(x), w) + b + residual + sum); x: [c_in, t_in]
/// -> y: [c_out, t_out]. `w` holds [`pack_conv1d_weights`]; `b` holds
/// c_out values (zeros for no bias).
#[allow(clippy::too_many_arguments)]
pub fn conv1d(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    b: &wgpu::Buffer,
    y: &wgpu::Buffer,
    s: &Conv1dShape,
    t_in: Steps<'_>,
    act: InputAct,
    extras: Conv1dExtras<'_>,
) -> Result<Dispatch> {
    assert_eq!(s.groups, 1, "gpu conv1d: groups must be 1");
    let params = Conv1dParams {
        c_in: s.c_in as u32,
        c_out: s.c_out as u32,
        t_mul: t_in.mul,
        t_add: t_in.add,
        kernel: s.kernel as u32,
        dilation: s.dilation as u32,
        pad_left: s.pad_left as u32,
        pad_right: s.pad_right as u32,
        in_scale: act.scale,
        in_slope: act.slope,
        flags: extras.residual.is_some() as u32
            | (extras.sum.is_some() as u32) << 1
            | (extras.tanh as u32) << 2,
        c_out_pad: c_out_pad(s.c_out) as u32,
        first: t_in.first,
        x_stride: t_in.stride(s.c_in) as u32,
        y_stride: t_in.conv(s).stride(s.c_out) as u32,
        _p0: 0,
    };
    // Without a residual or a sum, any buffer fills the binding; the shader
    // never reads it.
    let res = extras.residual.unwrap_or(b);
    let sum = extras.sum.unwrap_or(b);
    let lens = t_in.lens(x);
    let bound = gpu.bind(
        &CONV1D,
        &Variant::default(),
        &[x, w, b, res, sum, lens, y],
        &params,
    )?;
    t_in.conv(s)
        .dispatch("conv1d", bound, 1, WG, s.c_out.div_ceil(OB) as u32)
}

/// y = conv_transpose1d(act_in(x), w) + b; x: [c_in, t_in] -> y: [c_out, t_out];
/// `w` holds [`pack_conv_transpose1d_weights`].
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose1d(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    b: &wgpu::Buffer,
    y: &wgpu::Buffer,
    s: &ConvTranspose1dShape,
    t_in: Steps<'_>,
    act: InputAct,
) -> Result<Dispatch> {
    let params = ConvTranspose1dParams {
        c_in: s.c_in as u32,
        c_out: s.c_out as u32,
        t_mul: t_in.mul,
        t_add: t_in.add,
        kernel: s.kernel as u32,
        stride: s.stride as u32,
        pad: s.pad as u32,
        c_out_pad: c_out_pad(s.c_out) as u32,
        in_scale: act.scale,
        in_slope: act.slope,
        x_stride: t_in.stride(s.c_in) as u32,
        y_stride: t_in.conv_transpose(s).stride(s.c_out) as u32,
        first: t_in.first,
        _p0: 0,
        _p1: 0,
        _p2: 0,
    };
    let lens = t_in.lens(x);
    let bound = gpu.bind(
        &CONV_TRANSPOSE1D,
        &Variant::default(),
        &[x, w, b, lens, y],
        &params,
    )?;
    t_in.conv_transpose(s).dispatch(
        "conv_transpose1d",
        bound,
        1,
        WG,
        s.c_out.div_ceil(OB) as u32,
    )
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct WavenetGateParams {
    h: u32,
    t_mul: u32,
    t_add: i32,
    g_off: u32,
    /// The first sentence (workgroup z = 0), where each sentence's x and y
    /// start, in elements apart.
    first: u32,
    x_stride: u32,
    y_stride: u32,
    _p0: u32,
}
const _: () = assert!(std::mem::size_of::<WavenetGateParams>() == 32);

kernel!(
    WAVENET_GATE,
    "wavenet_gate",
    "wavenet_gate.wgsl",
    [
        Binding::read("x"),
        Binding::read("g"),
        Binding::read("lens"),
        Binding::write("y")
    ],
    WavenetGateParams,
    [&[]]
);

/// WaveNet's gated activation, the twin of [`crate::cpu::wavenet_gate`]:
/// x: [2h, t] -> y: [h, t], with the conditioning offsets `g[g_off..g_off + 2h]`.
pub fn wavenet_gate(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    g: &wgpu::Buffer,
    y: &wgpu::Buffer,
    h: usize,
    t: Steps<'_>,
    g_off: usize,
) -> Result<Dispatch> {
    let params = WavenetGateParams {
        h: h as u32,
        t_mul: t.mul,
        t_add: t.add,
        g_off: g_off as u32,
        first: t.first,
        x_stride: t.stride(2 * h) as u32,
        y_stride: t.stride(h) as u32,
        _p0: 0,
    };
    let lens = t.lens(x);
    let bound = gpu.bind(
        &WAVENET_GATE,
        &Variant::default(),
        &[x, g, lens, y],
        &params,
    )?;
    t.dispatch("wavenet_gate", bound, h, 256, 0)
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct LayerNormChannelsParams {
    c: u32,
    t_mul: u32,
    t_add: i32,
    flags: u32,
    eps: f32,
    /// The first sentence (workgroup z = 0) and where each sentence's x,
    /// res and y start, in elements apart.
    first: u32,
    stride: u32,
    _p0: u32,
}
const _: () = assert!(std::mem::size_of::<LayerNormChannelsParams>() == 32);

kernel!(
    LAYER_NORM_CHANNELS,
    "layer_norm_channels",
    ["erf.wgsl", "layer_norm_channels.wgsl"],
    [
        Binding::read("x"),
        Binding::read("gamma"),
        Binding::read("beta"),
        Binding::read("res"),
        Binding::read("lens"),
        Binding::write("y"),
    ],
    LayerNormChannelsParams,
    [&[]]
);

/// Layer norm across the channels of x: [c, t] at every step, the twin of
/// [`crate::cpu::layer_norm_channels`]: y = act(norm(x) * gamma + beta) +
/// res, act = GELU when `gelu`. With a count's steps, every sentence of
/// the batch (a slice of workgroups along z each, at its index times
/// [`Steps::stride`]).
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_channels(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    gamma: &wgpu::Buffer,
    beta: &wgpu::Buffer,
    res: Option<&wgpu::Buffer>,
    y: &wgpu::Buffer,
    c: usize,
    t: Steps<'_>,
    eps: f32,
    gelu: bool,
) -> Result<Dispatch> {
    let params = LayerNormChannelsParams {
        c: c as u32,
        t_mul: t.mul,
        t_add: t.add,
        flags: gelu as u32 | (res.is_some() as u32) << 1,
        eps,
        first: t.first,
        stride: t.stride(c) as u32,
        _p0: 0,
    };
    // Without a residual, any buffer fills the binding; the shader never reads it.
    let r = res.unwrap_or(x);
    let lens = t.lens(x);
    let bound = gpu.bind(
        &LAYER_NORM_CHANNELS,
        &Variant::default(),
        &[x, gamma, beta, r, lens, y],
        &params,
    )?;
    t.dispatch("layer_norm_channels", bound, 1, 64, 0)
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Conv1dDepthwiseParams {
    c: u32,
    t_mul: u32,
    t_add: i32,
    kernel: u32,
    dilation: u32,
    pad_left: u32,
    pad_right: u32,
    /// The first sentence (workgroup z = 0) and where each sentence's x and
    /// y start, in elements apart.
    first: u32,
    x_stride: u32,
    y_stride: u32,
    _p0: u32,
    _p1: u32,
}
const _: () = assert!(std::mem::size_of::<Conv1dDepthwiseParams>() == 48);

kernel!(
    CONV1D_DEPTHWISE,
    "conv1d_depthwise",
    "conv1d_depthwise.wgsl",
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("b"),
        Binding::read("lens"),
        Binding::write("y"),
    ],
    Conv1dDepthwiseParams,
    [&[]]
);

/// A depthwise convolution (groups = channels, stride 1): x: [c, t_in] ->
/// y: [c, t_out]; `w` is PyTorch's [c, 1, k], `b` c values (zeros for
/// none). With a count's steps, every sentence of the batch.
pub fn conv1d_depthwise(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    b: &wgpu::Buffer,
    y: &wgpu::Buffer,
    s: &Conv1dShape,
    t_in: Steps<'_>,
) -> Result<Dispatch> {
    assert!(
        s.groups == s.c_in && s.c_in == s.c_out,
        "gpu conv1d_depthwise: groups must equal the channels"
    );
    let t_out = t_in.conv(s);
    let params = Conv1dDepthwiseParams {
        c: s.c_in as u32,
        t_mul: t_in.mul,
        t_add: t_in.add,
        kernel: s.kernel as u32,
        dilation: s.dilation as u32,
        pad_left: s.pad_left as u32,
        pad_right: s.pad_right as u32,
        first: t_in.first,
        x_stride: t_in.stride(s.c_in) as u32,
        y_stride: t_out.stride(s.c_out) as u32,
        _p0: 0,
        _p1: 0,
    };
    let lens = t_in.lens(x);
    let bound = gpu.bind(
        &CONV1D_DEPTHWISE,
        &Variant::default(),
        &[x, w, b, lens, y],
        &params,
    )?;
    t_out.dispatch("conv1d_depthwise", bound, s.c_in, 256, 0)
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RelAttentionParams {
    t_mul: u32,
    t_add: i32,
    dk: u32,
    heads: u32,
    window: u32,
    scale: f32,
    /// The first sentence (workgroup z = 0) and where each sentence's qkv,
    /// scores and y start, in elements apart.
    first: u32,
    x_stride: u32,
    scores_stride: u32,
    y_stride: u32,
    _p0: u32,
    _p1: u32,
}
const _: () = assert!(std::mem::size_of::<RelAttentionParams>() == 48);

kernel!(
    REL_ATTENTION,
    "rel_attention",
    "rel_attention.wgsl",
    [
        Binding::read("qkv"),
        Binding::read("rel_k"),
        Binding::read("rel_v"),
        Binding::write("scores"),
        Binding::read("lens"),
        Binding::write("y"),
    ],
    RelAttentionParams,
    [&[]]
);

/// The largest head size [`rel_attention`] takes (its workgroup's query copy).
pub const REL_ATTENTION_MAX_DK: usize = 256;

/// Bytes of the scores scratch [`rel_attention`] needs over `t` (for
/// every sentence of a batch, at the most steps).
pub fn rel_attention_scratch_bytes(heads: usize, t: Steps<'_>) -> u64 {
    (heads * t.max() * t.max() * t.batch() * 4) as u64
}

/// Self-attention with relative-position keys and values over qkv: [3 c,
/// t] (q, k, v channels) -> y: [c, t], the twin of
/// [`crate::cpu::rel_position_attention`] (which takes [t, c] rows);
/// rel_k, rel_v: [2 window + 1, dk]; `scores` holds
/// [`rel_attention_scratch_bytes`]. With a count's steps, every sentence
/// of the batch, each attending only to its own steps.
#[allow(clippy::too_many_arguments)]
pub fn rel_attention(
    gpu: &Gpu,
    qkv: &wgpu::Buffer,
    rel_k: &wgpu::Buffer,
    rel_v: &wgpu::Buffer,
    scores: &wgpu::Buffer,
    y: &wgpu::Buffer,
    heads: usize,
    dk: usize,
    window: usize,
    t: Steps<'_>,
) -> Result<Dispatch> {
    if dk == 0 || dk > REL_ATTENTION_MAX_DK {
        return Err(Error::gpu(format!(
            "rel_attention: head size {dk} is not 1 to {REL_ATTENTION_MAX_DK}"
        )));
    }
    if t.max() == 0 || heads > 65535 {
        return Err(Error::gpu(format!(
            "rel_attention: {} steps x {heads} heads",
            t.max()
        )));
    }
    let c = heads * dk;
    let params = RelAttentionParams {
        t_mul: t.mul,
        t_add: t.add,
        dk: dk as u32,
        heads: heads as u32,
        window: window as u32,
        scale: 1.0 / (dk as f32).sqrt(),
        first: t.first,
        x_stride: t.stride(3 * c) as u32,
        scores_stride: (heads * t.max() * t.max()) as u32,
        y_stride: t.stride(c) as u32,
        _p0: 0,
        _p1: 0,
    };
    let lens = t.lens(qkv);
    let bound = gpu.bind(
        &REL_ATTENTION,
        &Variant::default(),
        &[qkv, rel_k, rel_v, scores, lens, y],
        &params,
    )?;
    // A workgroup a query and head (the steps' count exceeding 65535 is
    // refused there).
    t.dispatch("rel_attention", bound, 1, 1, heads as u32)
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SplineInverseParams {
    t_mul: u32,
    t_add: i32,
    bins: u32,
    norm: f32,
    edge: f32,
    tail: f32,
    min_bin: f32,
    min_deriv: f32,
    /// The first sentence (workgroup z = 0) and where each sentence's x
    /// (and y) and h start, in elements apart.
    first: u32,
    x_stride: u32,
    h_stride: u32,
    _p0: u32,
}
const _: () = assert!(std::mem::size_of::<SplineInverseParams>() == 48);

kernel!(
    SPLINE_INVERSE,
    "spline_inverse",
    "spline_inverse.wgsl",
    [
        Binding::read("x"),
        Binding::read("h"),
        Binding::read("lens"),
        Binding::write("y")
    ],
    SplineInverseParams,
    [&[]]
);

/// The most bins [`spline_inverse`] takes (the shader's knot arrays).
pub const SPLINE_MAX_BINS: usize = 32;

/// The spline's inverse at every step, the twin of
/// [`crate::cpu::spline_inverse_rows`]: x: [t], h: [3 bins - 1, t] -> y:
/// [t]. With a count's steps, every sentence of the batch.
#[allow(clippy::too_many_arguments)]
pub fn spline_inverse(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    h: &wgpu::Buffer,
    y: &wgpu::Buffer,
    bins: usize,
    t: Steps<'_>,
    norm: f32,
) -> Result<Dispatch> {
    if bins == 0 || bins > SPLINE_MAX_BINS {
        return Err(Error::gpu(format!(
            "spline_inverse: {bins} bins is not 1 to {SPLINE_MAX_BINS}"
        )));
    }
    let params = SplineInverseParams {
        t_mul: t.mul,
        t_add: t.add,
        bins: bins as u32,
        norm,
        edge: cpu::spline_edge_derivative(),
        tail: cpu::SPLINE_TAIL_BOUND,
        min_bin: cpu::SPLINE_MIN_BIN,
        min_deriv: cpu::SPLINE_MIN_DERIVATIVE,
        first: t.first,
        x_stride: t.stride(1) as u32,
        h_stride: t.stride(3 * bins - 1) as u32,
        _p0: 0,
    };
    let lens = t.lens(x);
    let bound = gpu.bind(
        &SPLINE_INVERSE,
        &Variant::default(),
        &[x, h, lens, y],
        &params,
    )?;
    t.dispatch("spline_inverse", bound, 1, 64, 0)
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ExpandPriorParams {
    c: u32,
    f_mul: u32,
    f_add: i32,
    t: u32,
    ch0: u32,
    channels: u32,
    noise_scale: f32,
    /// The sentence (workgroup z = 0) and where each sentence's y starts,
    /// in elements apart.
    first: u32,
    y_stride: u32,
    /// Where the sentence's stats start, in elements.
    stats_off: u32,
    _p1: u32,
    _p2: u32,
}
const _: () = assert!(std::mem::size_of::<ExpandPriorParams>() == 48);

kernel!(
    EXPAND_PRIOR,
    "expand_prior",
    "expand_prior.wgsl",
    [
        Binding::read("stats"),
        Binding::read("ends"),
        Binding::read("noise"),
        Binding::read("lens"),
        Binding::write("y"),
    ],
    ExpandPriorParams,
    [&[]]
);

/// Length regulation and the prior's sample for channels `ch0 .. ch0 + c`
/// of the `channels` the prior has, the twin of [`crate::cpu::expand_prior`]
/// on [`crate::cpu::frame_phonemes`]: stats: [2 channels, t] (from the
/// given element on: a batch's buffer), ends: [t] the
/// durations' running sums ([`crate::cpu::frame_ends`]), noise: [channels,
/// frames] (the start of a longer buffer) -> y: [c, frames]. Phonemes that
/// all last 0 frames give the one frame of a zero prior. One sentence: with
/// a batch's count, `frames` is [`Steps::sentence`]'s, and y its place in
/// the batch's buffer.
#[allow(clippy::too_many_arguments)]
pub fn expand_prior(
    gpu: &Gpu,
    (stats, stats_off): (&wgpu::Buffer, usize),
    ends: &wgpu::Buffer,
    noise: &wgpu::Buffer,
    y: &wgpu::Buffer,
    channels: usize,
    ch0: usize,
    c: usize,
    t: usize,
    frames: Steps<'_>,
    noise_scale: f32,
) -> Result<Dispatch> {
    assert!(
        ch0 + c <= channels && t > 0 && frames.sentences == 1,
        "expand_prior: channels, or more than one sentence"
    );
    let params = ExpandPriorParams {
        c: c as u32,
        f_mul: frames.mul,
        f_add: frames.add,
        t: t as u32,
        ch0: ch0 as u32,
        channels: channels as u32,
        noise_scale,
        first: frames.first,
        y_stride: frames.stride(c) as u32,
        stats_off: stats_off as u32,
        _p1: 0,
        _p2: 0,
    };
    let lens = frames.lens(stats);
    let bound = gpu.bind(
        &EXPAND_PRIOR,
        &Variant::default(),
        &[stats, ends, noise, lens, y],
        &params,
    )?;
    frames.dispatch("expand_prior", bound, c, 256, 0)
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct DurationsParams {
    t: u32,
    cap: u32,
    geometries: u32,
    sentence: u32,
    m: f32,
    inv: f32,
    length_scale: f32,
    /// Where the sentence's z starts, in elements.
    z_off: u32,
}
const _: () = assert!(std::mem::size_of::<DurationsParams>() == 32);

kernel!(
    DURATIONS,
    "durations",
    "durations.wgsl",
    [
        Binding::read("z"),
        Binding::read("geometry"),
        Binding::write("ends"),
        Binding::write("lens"),
        Binding::write("args"),
    ],
    DurationsParams,
    [&[]]
);

/// Sentence `sentence`'s frames on the device, the twin of
/// [`crate::cpu::durations`] and [`crate::cpu::frame_ends`] on logw = (z -
/// m) * inv (z from the given element on: a batch's buffer): the running
/// sums of the durations into `ends` ([t] u32), and
/// into `count` its frame count (lens[2 sentence ..] = [frames, total]:
/// frames = max(total, 1), or 0 when the total is past the count's cap, so
/// that nothing over its frames runs) and the workgroup counts of every
/// dispatch recorded over the count, for the most frames of the sentences
/// up to this one ([`Geometry::groups`]; record a batch's sentences in
/// order, and write the geometries with [`FrameCount::finish`] before
/// submitting).
#[allow(clippy::too_many_arguments)]
pub fn durations(
    gpu: &Gpu,
    (z, z_off): (&wgpu::Buffer, usize),
    ends: &wgpu::Buffer,
    count: &FrameCount,
    sentence: usize,
    t: usize,
    m: f32,
    inv: f32,
    length_scale: f32,
) -> Result<Dispatch> {
    if t == 0 || count.known.is_some() || sentence >= count.batch {
        return Err(Error::gpu(format!(
            "durations: no phonemes, a frame count the host wrote, or sentence {sentence} \
             of {}",
            count.batch
        )));
    }
    let params = DurationsParams {
        t: t as u32,
        cap: count.cap as u32,
        geometries: MAX_GEOMETRIES as u32,
        sentence: sentence as u32,
        m,
        inv,
        length_scale,
        z_off: z_off as u32,
    };
    let bound = gpu.bind(
        &DURATIONS,
        &Variant::default(),
        &[z, &count.table, ends, &count.lens, &count.args],
        &params,
    )?;
    Ok(Dispatch {
        bound,
        groups: [1, 1, 1],
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbedChannelsParams {
    hidden: u32,
    t_mul: u32,
    t_add: i32,
    scale: f32,
    /// The first sentence (workgroup z = 0) and where each sentence's ids
    /// and y start, in elements apart.
    first: u32,
    ids_stride: u32,
    y_stride: u32,
    _p0: u32,
}
const _: () = assert!(std::mem::size_of::<EmbedChannelsParams>() == 32);

kernel!(
    EMBED_CHANNELS,
    "embed_channels",
    "embed_channels.wgsl",
    [
        Binding::read("table"),
        Binding::read("ids"),
        Binding::read("lens"),
        Binding::write("y"),
    ],
    EmbedChannelsParams,
    [&[]]
);

/// The text encoder's embedding lookup, the twin of
/// [`crate::cpu::embed_channels`]: table: [vocab, hidden], ids: [t] (each
/// below vocab) -> y: [hidden, t], scaled by `scale`. With a count's
/// steps, every sentence of the batch.
pub fn embed_channels(
    gpu: &Gpu,
    table: &wgpu::Buffer,
    ids: &wgpu::Buffer,
    y: &wgpu::Buffer,
    hidden: usize,
    t: Steps<'_>,
    scale: f32,
) -> Result<Dispatch> {
    let params = EmbedChannelsParams {
        hidden: hidden as u32,
        t_mul: t.mul,
        t_add: t.add,
        scale,
        first: t.first,
        ids_stride: t.stride(1) as u32,
        y_stride: t.stride(hidden) as u32,
        _p0: 0,
    };
    let lens = t.lens(ids);
    let bound = gpu.bind(
        &EMBED_CHANNELS,
        &Variant::default(),
        &[table, ids, lens, y],
        &params,
    )?;
    t.dispatch("embed_channels", bound, hidden, 256, 0)
}

/// The kernels declared in this module.
pub static KERNELS: &[&Kernel] = &[
    &CONV1D,
    &CONV_TRANSPOSE1D,
    &WAVENET_GATE,
    &LAYER_NORM_CHANNELS,
    &CONV1D_DEPTHWISE,
    &REL_ATTENTION,
    &SPLINE_INVERSE,
    &EXPAND_PRIOR,
    &EMBED_CHANNELS,
    &DURATIONS,
];
