//! Kernels for convolutional vision models (one image, NCHW): 2-D
//! convolution with a fused activation, global average pooling,
//! per-channel scaling, nearest resize, channel concatenation, transposed
//! convolution and fused elementwise chains. The CPU twins are in
//! [`crate::cpu::conv`], [`crate::cpu::pool`] and [`crate::cpu::elementwise`].

use super::kernels::{Binding, Kernel, Variant};
use super::ops::{groups_1d, Dispatch};
use super::Gpu;
use crate::cpu::{Conv2d, ConvActivation, ConvTranspose2d, Pointwise};
use crate::error::{Error, Result};
use crate::kernel;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ConvParams {
    c_in: u32,
    h_in: u32,
    w_in: u32,
    c_out: u32,
    h_out: u32,
    w_out: u32,
    kh: u32,
    kw: u32,
    stride: [u32; 2],
    pad: [u32; 2],
    dilation: [u32; 2],
    groups: u32,
    act: u32,
    alpha: f32,
    beta: f32,
    _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<ConvParams>() == 80);

kernel!(
    CONV2D,
    "conv2d",
    "conv2d.wgsl",
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("b"),
        Binding::write("y")
    ],
    ConvParams,
    [&[], &["POINTWISE"]]
);

/// The variant to run `g` with: the register-tiled kernel for 1x1
/// convolutions, the direct one for everything else.
pub fn conv2d_variant(g: &Conv2d) -> Variant {
    if g.is_pointwise() {
        Variant::new(&["POINTWISE"])
    } else {
        Variant::default()
    }
}

fn activation_code(act: ConvActivation) -> (u32, f32, f32) {
    match act {
        ConvActivation::None => (0, 0.0, 0.0),
        ConvActivation::Relu => (1, 0.0, 0.0),
        ConvActivation::HardSwish => (2, 0.0, 0.0),
        ConvActivation::HardSigmoid { alpha, beta } => (3, alpha, beta),
        ConvActivation::Sigmoid => (4, 0.0, 0.0),
    }
}

fn to_u32(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::gpu(format!("{what} = {v} does not fit the kernel's u32")))
}

/// `y = act(conv(x, w) + b)` for geometry `g` (see [`crate::cpu::conv2d`]);
/// x: [c_in, h_in, w_in], w: [c_out, c_in / groups, kh, kw], b: `[c_out]`,
/// y: [c_out, h_out, w_out]. `variant` is [`conv2d_variant`] or, for any
/// geometry, the default.
#[allow(clippy::too_many_arguments)]
pub fn conv2d(
    gpu: &Gpu,
    variant: &Variant,
    g: &Conv2d,
    act: ConvActivation,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    b: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<Dispatch> {
    g.check().map_err(Error::gpu)?;
    let pointwise = variant.defines.contains(&"POINTWISE");
    assert!(
        !pointwise || g.is_pointwise(),
        "conv2d POINTWISE variant on {g:?}"
    );
    let (code, alpha, beta) = activation_code(act);
    let out_len = g.c_out * g.h_out() * g.w_out();
    let params = ConvParams {
        c_in: to_u32("c_in", g.c_in)?,
        h_in: to_u32("h_in", g.h_in)?,
        w_in: to_u32("w_in", g.w_in)?,
        c_out: to_u32("c_out", g.c_out)?,
        h_out: to_u32("h_out", g.h_out())?,
        w_out: to_u32("w_out", g.w_out())?,
        kh: to_u32("kh", g.kh)?,
        kw: to_u32("kw", g.kw)?,
        stride: [
            to_u32("stride", g.stride[0])?,
            to_u32("stride", g.stride[1])?,
        ],
        pad: [to_u32("pad", g.pad[0])?, to_u32("pad", g.pad[1])?],
        dilation: [
            to_u32("dilation", g.dilation[0])?,
            to_u32("dilation", g.dilation[1])?,
        ],
        groups: to_u32("groups", g.groups)?,
        act: code,
        alpha,
        beta,
        _pad: [0; 2],
    };
    to_u32("output size", out_len)?;
    to_u32("input size", g.c_in * g.h_in * g.w_in)?;
    let bound = gpu.bind(&CONV2D, variant, &[x, w, b, y], &params)?;
    let groups = if pointwise {
        let n = g.h_in * g.w_in;
        [
            to_u32("groups", n.div_ceil(64))?,
            to_u32("groups", g.c_out.div_ceil(16))?,
            1,
        ]
    } else {
        [
            to_u32("groups", g.w_out().div_ceil(64))?,
            to_u32("h_out", g.h_out())?,
            to_u32("c_out", g.c_out)?,
        ]
    };
    let limit = gpu.device.limits().max_compute_workgroups_per_dimension;
    if groups.iter().any(|&n| n > limit) {
        return Err(Error::gpu(format!(
            "conv2d {g:?}: {groups:?} workgroups exceed the adapter's {limit} per dimension"
        )));
    }
    Ok(Dispatch { bound, groups })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct PoolParams {
    c: u32,
    n: u32,
    _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<PoolParams>() == 16);

kernel!(
    GLOBAL_AVG_POOL,
    "global_avg_pool",
    "global_avg_pool.wgsl",
    [Binding::read("x"), Binding::write("y")],
    PoolParams,
    [&[]]
);

/// x: [c, n] -> y: `[c]`, the mean of each channel.
pub fn global_avg_pool(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    c: usize,
    n: usize,
) -> Result<Dispatch> {
    let params = PoolParams {
        c: to_u32("c", c)?,
        n: to_u32("n", n)?,
        _pad: [0; 2],
    };
    let bound = gpu.bind(&GLOBAL_AVG_POOL, &Variant::default(), &[x, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(c, 1),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ScaleParams {
    n: u32,
    total: u32,
    _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<ScaleParams>() == 16);

kernel!(
    SCALE_CHANNELS,
    "scale_channels",
    "scale_channels.wgsl",
    [Binding::read("x"), Binding::read("s"), Binding::write("y")],
    ScaleParams,
    [&[]]
);

/// x: [c, n], s: `[c]` -> y: [c, n], y = x * s per channel.
pub fn scale_channels(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    s: &wgpu::Buffer,
    y: &wgpu::Buffer,
    c: usize,
    n: usize,
) -> Result<Dispatch> {
    let params = ScaleParams {
        n: to_u32("n", n.max(1))?,
        total: to_u32("c * n", c * n)?,
        _pad: [0; 2],
    };
    let bound = gpu.bind(&SCALE_CHANNELS, &Variant::default(), &[x, s, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(c * n, 256),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ResizeParams {
    c: u32,
    h_in: u32,
    w_in: u32,
    h_out: u32,
    w_out: u32,
    scale_h: f32,
    scale_w: f32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<ResizeParams>() == 32);

kernel!(
    RESIZE_NEAREST,
    "resize_nearest",
    "resize_nearest.wgsl",
    [Binding::read("x"), Binding::write("y")],
    ResizeParams,
    [&[]]
);

/// x: [c, h_in, w_in] -> y: [c, h_out, w_out], nearest neighbour
/// (asymmetric, floor; see [`crate::cpu::resize_nearest`]).
pub fn resize_nearest(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    c: usize,
    [h_in, w_in]: [usize; 2],
    [h_out, w_out]: [usize; 2],
    [scale_h, scale_w]: [f32; 2],
) -> Result<Dispatch> {
    let params = ResizeParams {
        c: to_u32("c", c)?,
        h_in: to_u32("h_in", h_in)?,
        w_in: to_u32("w_in", w_in)?,
        h_out: to_u32("h_out", h_out)?,
        w_out: to_u32("w_out", w_out)?,
        scale_h,
        scale_w,
        _pad: 0,
    };
    let total = c * h_out * w_out;
    to_u32("output size", total)?;
    let bound = gpu.bind(&RESIZE_NEAREST, &Variant::default(), &[x, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(total, 256),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ConcatParams {
    n: u32,
    offset: u32,
    _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<ConcatParams>() == 16);

kernel!(
    CONCAT,
    "concat",
    "concat.wgsl",
    [Binding::read("x"), Binding::write("y")],
    ConcatParams,
    [&[]]
);

/// Copies `n` values of x to y at `offset`: one part of a channel
/// concatenation (see [`crate::cpu::concat`]).
pub fn concat_part(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: usize,
    offset: usize,
) -> Result<Dispatch> {
    let params = ConcatParams {
        n: to_u32("n", n)?,
        offset: to_u32("offset", offset)?,
        _pad: [0; 2],
    };
    let bound = gpu.bind(&CONCAT, &Variant::default(), &[x, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(n, 256),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ConvTransposeParams {
    c_in: u32,
    h_in: u32,
    w_in: u32,
    c_out: u32,
    h_out: u32,
    w_out: u32,
    kh: u32,
    kw: u32,
    stride: [u32; 2],
    pad: [u32; 2],
    groups: u32,
    _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<ConvTransposeParams>() == 64);

kernel!(
    CONV_TRANSPOSE2D,
    "conv_transpose2d",
    "conv_transpose2d.wgsl",
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("b"),
        Binding::write("y")
    ],
    ConvTransposeParams,
    [&[]]
);

/// `y = conv_transpose(x, w) + b` for geometry `g` (see
/// [`crate::cpu::conv_transpose2d`]); x: [c_in, h_in, w_in],
/// w: [c_in, c_out / groups, kh, kw], b: `[c_out]`, y: [c_out, h_out, w_out].
pub fn conv_transpose2d(
    gpu: &Gpu,
    g: &ConvTranspose2d,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    b: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<Dispatch> {
    g.check().map_err(Error::gpu)?;
    let params = ConvTransposeParams {
        c_in: to_u32("c_in", g.c_in)?,
        h_in: to_u32("h_in", g.h_in)?,
        w_in: to_u32("w_in", g.w_in)?,
        c_out: to_u32("c_out", g.c_out)?,
        h_out: to_u32("h_out", g.h_out())?,
        w_out: to_u32("w_out", g.w_out())?,
        kh: to_u32("kh", g.kh)?,
        kw: to_u32("kw", g.kw)?,
        stride: [
            to_u32("stride", g.stride[0])?,
            to_u32("stride", g.stride[1])?,
        ],
        pad: [to_u32("pad", g.pad[0])?, to_u32("pad", g.pad[1])?],
        groups: to_u32("groups", g.groups)?,
        _pad: [0; 3],
    };
    to_u32("output size", g.c_out * g.h_out() * g.w_out())?;
    let bound = gpu.bind(
        &CONV_TRANSPOSE2D,
        &Variant::default(),
        &[x, w, b, y],
        &params,
    )?;
    let groups = [
        to_u32("groups", g.w_out().div_ceil(64))?,
        to_u32("h_out", g.h_out())?,
        to_u32("c_out", g.c_out)?,
    ];
    let limit = gpu.device.limits().max_compute_workgroups_per_dimension;
    if groups.iter().any(|&n| n > limit) {
        return Err(Error::gpu(format!(
            "conv_transpose2d {g:?}: {groups:?} workgroups exceed the adapter's {limit} per dimension"
        )));
    }
    Ok(Dispatch { bound, groups })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct PointwiseParams {
    n: u32,
    plane: u32,
    channels: u32,
    count: u32,
    steps: [[u32; 4]; Pointwise::MAX_STEPS],
}
const _: () = assert!(std::mem::size_of::<PointwiseParams>() == 16 + 16 * Pointwise::MAX_STEPS);

kernel!(
    POINTWISE,
    "pointwise",
    "pointwise.wgsl",
    [Binding::write("x"), Binding::read("affine")],
    PointwiseParams,
    [&[]]
);

fn step_code(s: Pointwise) -> [u32; 4] {
    let (code, a, b) = match s {
        Pointwise::Mul(c) => (0, c, 0.0),
        Pointwise::Add(c) => (1, c, 0.0),
        Pointwise::Sub(c) => (2, c, 0.0),
        Pointwise::Div(c) => (3, c, 0.0),
        Pointwise::Clip { min, max } => (4, min, max),
        Pointwise::Relu => (5, 0.0, 0.0),
        Pointwise::Sigmoid => (6, 0.0, 0.0),
        Pointwise::HardSigmoid { alpha, beta } => (7, alpha, beta),
        Pointwise::HardSwish => (8, 0.0, 0.0),
        Pointwise::ChannelAffine => (9, 0.0, 0.0),
    };
    [code, a.to_bits(), b.to_bits(), 0]
}

/// `steps` applied in place to the `n` values of x ([.., channels, plane];
/// see [`crate::cpu::pointwise_chain`]). `affine` holds a `ChannelAffine`
/// step's scale then shift (`2 * channels` values; any buffer when
/// `channels` is 0).
pub fn pointwise(
    gpu: &Gpu,
    steps: &[Pointwise],
    x: &wgpu::Buffer,
    affine: &wgpu::Buffer,
    n: usize,
    plane: usize,
    channels: usize,
) -> Result<Dispatch> {
    if steps.len() > Pointwise::MAX_STEPS {
        return Err(Error::gpu(format!(
            "pointwise: {} steps, the kernel takes {}",
            steps.len(),
            Pointwise::MAX_STEPS
        )));
    }
    if steps.contains(&Pointwise::ChannelAffine) && channels == 0 {
        return Err(Error::gpu(
            "pointwise: a channel affine step without channels",
        ));
    }
    let mut codes = [[0u32; 4]; Pointwise::MAX_STEPS];
    for (c, &s) in codes.iter_mut().zip(steps) {
        *c = step_code(s);
    }
    let params = PointwiseParams {
        n: to_u32("n", n)?,
        plane: to_u32("plane", plane.max(1))?,
        channels: to_u32("channels", channels.max(1))?,
        count: steps.len() as u32,
        steps: codes,
    };
    let bound = gpu.bind(&POINTWISE, &Variant::default(), &[x, affine], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(n, 256),
    })
}

/// The kernels declared in this module.
pub static KERNELS: &[&Kernel] = &[
    &CONV2D,
    &GLOBAL_AVG_POOL,
    &SCALE_CHANNELS,
    &RESIZE_NEAREST,
    &CONCAT,
    &CONV_TRANSPOSE2D,
    &POINTWISE,
];
