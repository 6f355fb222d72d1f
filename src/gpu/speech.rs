//! Kernels for speech models (VITS / HiFi-GAN): 1-D convolution and
//! transposed convolution over `[channels, time]` activations, with the leaky
//! ReLU that precedes every convolution in the generator fused into the input
//! read, and the residual add and final tanh fused into the output write.
//! The flow's WaveNet gate (tanh * sigmoid with a conditioning offset).
//! The prior's pieces: layer norm across channels, the duration predictor's
//! depthwise convolution and spline, relative-position attention, length
//! regulation with the prior's noise, the text encoder's embedding lookup.
//! CPU twins: `cpu::conv1d`, `cpu::conv_transpose1d`, `cpu::leaky_relu`,
//! `cpu::wavenet_gate`, and those of `cpu::speech`.

use super::context::Bound;
use super::kernels::{Binding, Kernel, Variant};
use super::ops::{groups_1d, Dispatch};
use super::Gpu;
use crate::cpu::{self, Conv1dShape, ConvTranspose1dShape};
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

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct LayerNormChannelsParams {
    c: u32,
    t: u32,
    eps: f32,
    flags: u32,
}
const _: () = assert!(std::mem::size_of::<LayerNormChannelsParams>() == 16);

kernel!(
    LAYER_NORM_CHANNELS,
    "layer_norm_channels",
    ["erf.wgsl", "layer_norm_channels.wgsl"],
    [
        Binding::read("x"),
        Binding::read("gamma"),
        Binding::read("beta"),
        Binding::read("res"),
        Binding::write("y"),
    ],
    LayerNormChannelsParams,
    [&[]]
);

/// Layer norm across the channels of x: [c, t] at every step, the twin of
/// [`crate::cpu::layer_norm_channels`]: y = act(norm(x) * gamma + beta) +
/// res, act = GELU when `gelu`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_channels(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    gamma: &wgpu::Buffer,
    beta: &wgpu::Buffer,
    res: Option<&wgpu::Buffer>,
    y: &wgpu::Buffer,
    c: usize,
    t: usize,
    eps: f32,
    gelu: bool,
) -> Result<Dispatch> {
    let params = LayerNormChannelsParams {
        c: c as u32,
        t: t as u32,
        eps,
        flags: gelu as u32 | (res.is_some() as u32) << 1,
    };
    // Without a residual, any buffer fills the binding; the shader never reads it.
    let r = res.unwrap_or(x);
    let bound = gpu.bind(
        &LAYER_NORM_CHANNELS,
        &Variant::default(),
        &[x, gamma, beta, r, y],
        &params,
    )?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(t, 64),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Conv1dDepthwiseParams {
    c: u32,
    t_in: u32,
    t_out: u32,
    kernel: u32,
    dilation: u32,
    pad_left: u32,
    _p0: u32,
    _p1: u32,
}
const _: () = assert!(std::mem::size_of::<Conv1dDepthwiseParams>() == 32);

kernel!(
    CONV1D_DEPTHWISE,
    "conv1d_depthwise",
    "conv1d_depthwise.wgsl",
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("b"),
        Binding::write("y"),
    ],
    Conv1dDepthwiseParams,
    [&[]]
);

/// A depthwise convolution (groups = channels, stride 1): x: [c, t_in] ->
/// y: [c, t_out]; `w` is PyTorch's [c, 1, k], `b` c values (zeros for none).
pub fn conv1d_depthwise(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    b: &wgpu::Buffer,
    y: &wgpu::Buffer,
    s: &Conv1dShape,
    t_in: usize,
) -> Result<Dispatch> {
    assert!(
        s.groups == s.c_in && s.c_in == s.c_out,
        "gpu conv1d_depthwise: groups must equal the channels"
    );
    let t_out = s.t_out(t_in);
    let params = Conv1dDepthwiseParams {
        c: s.c_in as u32,
        t_in: t_in as u32,
        t_out: t_out as u32,
        kernel: s.kernel as u32,
        dilation: s.dilation as u32,
        pad_left: s.pad_left as u32,
        _p0: 0,
        _p1: 0,
    };
    let bound = gpu.bind(
        &CONV1D_DEPTHWISE,
        &Variant::default(),
        &[x, w, b, y],
        &params,
    )?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(s.c_in * t_out, 256),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RelAttentionParams {
    t: u32,
    dk: u32,
    heads: u32,
    window: u32,
    scale: f32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}
const _: () = assert!(std::mem::size_of::<RelAttentionParams>() == 32);

kernel!(
    REL_ATTENTION,
    "rel_attention",
    "rel_attention.wgsl",
    [
        Binding::read("qkv"),
        Binding::read("rel_k"),
        Binding::read("rel_v"),
        Binding::write("scores"),
        Binding::write("y"),
    ],
    RelAttentionParams,
    [&[]]
);

/// The largest head size [`rel_attention`] takes (its workgroup's query copy).
pub const REL_ATTENTION_MAX_DK: usize = 256;

/// Bytes of the scores scratch [`rel_attention`] needs.
pub fn rel_attention_scratch_bytes(heads: usize, t: usize) -> u64 {
    (heads * t * t * 4) as u64
}

/// Self-attention with relative-position keys and values over qkv: [3 c,
/// t] (q, k, v channels) -> y: [c, t], the twin of
/// [`crate::cpu::rel_position_attention`] (which takes [t, c] rows);
/// rel_k, rel_v: [2 window + 1, dk]; `scores` holds
/// [`rel_attention_scratch_bytes`].
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
    t: usize,
) -> Result<Dispatch> {
    if dk == 0 || dk > REL_ATTENTION_MAX_DK {
        return Err(Error::gpu(format!(
            "rel_attention: head size {dk} is not 1 to {REL_ATTENTION_MAX_DK}"
        )));
    }
    if t == 0 || t > 65535 || heads > 65535 {
        return Err(Error::gpu(format!(
            "rel_attention: {t} steps x {heads} heads exceed one dispatch"
        )));
    }
    let params = RelAttentionParams {
        t: t as u32,
        dk: dk as u32,
        heads: heads as u32,
        window: window as u32,
        scale: 1.0 / (dk as f32).sqrt(),
        _p0: 0,
        _p1: 0,
        _p2: 0,
    };
    let bound = gpu.bind(
        &REL_ATTENTION,
        &Variant::default(),
        &[qkv, rel_k, rel_v, scores, y],
        &params,
    )?;
    Ok(Dispatch {
        bound,
        groups: [t as u32, heads as u32, 1],
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SplineInverseParams {
    t: u32,
    bins: u32,
    norm: f32,
    edge: f32,
    tail: f32,
    min_bin: f32,
    min_deriv: f32,
    _p0: u32,
}
const _: () = assert!(std::mem::size_of::<SplineInverseParams>() == 32);

kernel!(
    SPLINE_INVERSE,
    "spline_inverse",
    "spline_inverse.wgsl",
    [Binding::read("x"), Binding::read("h"), Binding::write("y")],
    SplineInverseParams,
    [&[]]
);

/// The most bins [`spline_inverse`] takes (the shader's knot arrays).
pub const SPLINE_MAX_BINS: usize = 32;

/// The spline's inverse at every step, the twin of
/// [`crate::cpu::spline_inverse_rows`]: x: [t], h: [3 bins - 1, t] -> y: [t].
#[allow(clippy::too_many_arguments)]
pub fn spline_inverse(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    h: &wgpu::Buffer,
    y: &wgpu::Buffer,
    bins: usize,
    t: usize,
    norm: f32,
) -> Result<Dispatch> {
    if bins == 0 || bins > SPLINE_MAX_BINS {
        return Err(Error::gpu(format!(
            "spline_inverse: {bins} bins is not 1 to {SPLINE_MAX_BINS}"
        )));
    }
    let params = SplineInverseParams {
        t: t as u32,
        bins: bins as u32,
        norm,
        edge: cpu::spline_edge_derivative(),
        tail: cpu::SPLINE_TAIL_BOUND,
        min_bin: cpu::SPLINE_MIN_BIN,
        min_deriv: cpu::SPLINE_MIN_DERIVATIVE,
        _p0: 0,
    };
    let bound = gpu.bind(&SPLINE_INVERSE, &Variant::default(), &[x, h, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(t, 64),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ExpandPriorParams {
    c: u32,
    frames: u32,
    t: u32,
    ch0: u32,
    channels: u32,
    noise_scale: f32,
    _p0: u32,
    _p1: u32,
}
const _: () = assert!(std::mem::size_of::<ExpandPriorParams>() == 32);

kernel!(
    EXPAND_PRIOR,
    "expand_prior",
    "expand_prior.wgsl",
    [
        Binding::read("stats"),
        Binding::read("idx"),
        Binding::read("noise"),
        Binding::write("y"),
    ],
    ExpandPriorParams,
    [&[]]
);

/// Length regulation and the prior's sample for channels `ch0 .. ch0 + c`
/// of the `channels` the prior has, the twin of [`crate::cpu::expand_prior`]:
/// stats: [2 channels, t], idx: [frames], noise: [channels, frames] -> y:
/// [c, frames].
#[allow(clippy::too_many_arguments)]
pub fn expand_prior(
    gpu: &Gpu,
    stats: &wgpu::Buffer,
    idx: &wgpu::Buffer,
    noise: &wgpu::Buffer,
    y: &wgpu::Buffer,
    channels: usize,
    ch0: usize,
    c: usize,
    t: usize,
    frames: usize,
    noise_scale: f32,
) -> Result<Dispatch> {
    assert!(ch0 + c <= channels, "expand_prior: channels");
    let params = ExpandPriorParams {
        c: c as u32,
        frames: frames as u32,
        t: t as u32,
        ch0: ch0 as u32,
        channels: channels as u32,
        noise_scale,
        _p0: 0,
        _p1: 0,
    };
    let bound = gpu.bind(
        &EXPAND_PRIOR,
        &Variant::default(),
        &[stats, idx, noise, y],
        &params,
    )?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(c * frames, 256),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbedChannelsParams {
    hidden: u32,
    t: u32,
    scale: f32,
    _p0: u32,
}
const _: () = assert!(std::mem::size_of::<EmbedChannelsParams>() == 16);

kernel!(
    EMBED_CHANNELS,
    "embed_channels",
    "embed_channels.wgsl",
    [
        Binding::read("table"),
        Binding::read("ids"),
        Binding::write("y"),
    ],
    EmbedChannelsParams,
    [&[]]
);

/// The text encoder's embedding lookup, the twin of
/// [`crate::cpu::embed_channels`]: table: [vocab, hidden], ids: [t] (each
/// below vocab) -> y: [hidden, t], scaled by `scale`.
pub fn embed_channels(
    gpu: &Gpu,
    table: &wgpu::Buffer,
    ids: &wgpu::Buffer,
    y: &wgpu::Buffer,
    hidden: usize,
    t: usize,
    scale: f32,
) -> Result<Dispatch> {
    let params = EmbedChannelsParams {
        hidden: hidden as u32,
        t: t as u32,
        scale,
        _p0: 0,
    };
    let bound = gpu.bind(
        &EMBED_CHANNELS,
        &Variant::default(),
        &[table, ids, y],
        &params,
    )?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(hidden * t, 256),
    })
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
];
