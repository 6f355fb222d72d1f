//! Kernels for speech models (VITS / HiFi-GAN): 1-D convolution and
//! transposed convolution over `[channels, time]` activations, with the leaky
//! ReLU that precedes every convolution in the generator fused into the input
//! read, and the residual add and final tanh fused into the output write.
//! The flow's WaveNet gate (tanh * sigmoid with a conditioning offset).
//! CPU twins: `cpu::conv1d`, `cpu::conv_transpose1d`, `cpu::leaky_relu`,
//! `cpu::wavenet_gate`.

use super::context::Bound;
use super::kernels::{Binding, Kernel, Variant};
use super::ops::{groups_1d, Dispatch};
use super::Gpu;
use crate::cpu::{Conv1dShape, ConvTranspose1dShape};
use crate::error::{Error, Result};
use crate::kernel;

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
    t_in: u32,
    t_out: u32,
    kernel: u32,
    dilation: u32,
    pad_left: u32,
    has_res: u32,
    in_scale: f32,
    in_slope: f32,
    out_tanh: u32,
    c_out_pad: u32,
}
const _: () = assert!(std::mem::size_of::<Conv1dParams>() == 48);

kernel!(
    CONV1D,
    "conv1d",
    "conv1d.wgsl",
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("b"),
        Binding::read("res"),
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
    t_in: u32,
    t_out: u32,
    kernel: u32,
    stride: u32,
    pad: u32,
    c_out_pad: u32,
    in_scale: f32,
    in_slope: f32,
    _p1: u32,
    _p2: u32,
}
const _: () = assert!(std::mem::size_of::<ConvTranspose1dParams>() == 48);

kernel!(
    CONV_TRANSPOSE1D,
    "conv_transpose1d",
    "conv_transpose1d.wgsl",
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("b"),
        Binding::write("y"),
    ],
    ConvTranspose1dParams,
    [&[]]
);

fn dims(name: &str, t_out: usize, c_out: usize) -> Result<[u32; 3]> {
    let g = groups_1d(t_out, WG);
    if g[1] != 1 {
        return Err(Error::gpu(format!(
            "{name}: {t_out} time steps exceed one dispatch; synthesise shorter sentences"
        )));
    }
    Ok([g[0], c_out.div_ceil(OB) as u32, 1])
}

/// Optional fused pieces of a [`conv1d`] dispatch.
#[derive(Clone, Copy, Default)]
pub struct Conv1dExtras<'a> {
    /// Added to the output (same shape as y).
    pub residual: Option<&'a wgpu::Buffer>,
    /// tanh on the output.
    pub tanh: bool,
}

/// y = act_out(conv1d(act_in(x), w) + b + residual); x: [c_in, t_in] ->
/// y: [c_out, t_out]. `w` holds [`pack_conv1d_weights`]; `b` holds c_out
/// values (zeros for no bias).
#[allow(clippy::too_many_arguments)]
pub fn conv1d(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    b: &wgpu::Buffer,
    y: &wgpu::Buffer,
    s: &Conv1dShape,
    t_in: usize,
    act: InputAct,
    extras: Conv1dExtras<'_>,
) -> Result<Dispatch> {
    assert_eq!(s.groups, 1, "gpu conv1d: groups must be 1");
    let t_out = s.t_out(t_in);
    let params = Conv1dParams {
        c_in: s.c_in as u32,
        c_out: s.c_out as u32,
        t_in: t_in as u32,
        t_out: t_out as u32,
        kernel: s.kernel as u32,
        dilation: s.dilation as u32,
        pad_left: s.pad_left as u32,
        has_res: extras.residual.is_some() as u32,
        in_scale: act.scale,
        in_slope: act.slope,
        out_tanh: extras.tanh as u32,
        c_out_pad: c_out_pad(s.c_out) as u32,
    };
    // Without a residual, any buffer fills the binding; the shader never reads it.
    let res = extras.residual.unwrap_or(b);
    let bound: Bound = gpu.bind(&CONV1D, &Variant::default(), &[x, w, b, res, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: dims("conv1d", t_out, s.c_out)?,
    })
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
    t_in: usize,
    act: InputAct,
) -> Result<Dispatch> {
    let t_out = s.t_out(t_in);
    let params = ConvTranspose1dParams {
        c_in: s.c_in as u32,
        c_out: s.c_out as u32,
        t_in: t_in as u32,
        t_out: t_out as u32,
        kernel: s.kernel as u32,
        stride: s.stride as u32,
        pad: s.pad as u32,
        c_out_pad: c_out_pad(s.c_out) as u32,
        in_scale: act.scale,
        in_slope: act.slope,
        _p1: 0,
        _p2: 0,
    };
    let bound = gpu.bind(
        &CONV_TRANSPOSE1D,
        &Variant::default(),
        &[x, w, b, y],
        &params,
    )?;
    Ok(Dispatch {
        bound,
        groups: dims("conv_transpose1d", t_out, s.c_out)?,
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct WavenetGateParams {
    h: u32,
    t: u32,
    g_off: u32,
    _p0: u32,
}
const _: () = assert!(std::mem::size_of::<WavenetGateParams>() == 16);

kernel!(
    WAVENET_GATE,
    "wavenet_gate",
    "wavenet_gate.wgsl",
    [Binding::read("x"), Binding::read("g"), Binding::write("y")],
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
    t: usize,
    g_off: usize,
) -> Result<Dispatch> {
    let params = WavenetGateParams {
        h: h as u32,
        t: t as u32,
        g_off: g_off as u32,
        _p0: 0,
    };
    let bound = gpu.bind(&WAVENET_GATE, &Variant::default(), &[x, g, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(h * t, 256),
    })
}

/// The kernels declared in this module.
pub static KERNELS: &[&Kernel] = &[&CONV1D, &CONV_TRANSPOSE1D, &WAVENET_GATE];
