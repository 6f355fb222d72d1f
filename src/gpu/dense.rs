//! Dense layers on the GPU: tiled matrix multiply with a fused epilogue
//! (bias, activation, residual), LayerNorm, GELU, gated activations, and
//! multi-head attention over ragged batches (optionally in a sliding window). Shared by every transformer in `models/`; each kernel
//! has its CPU twin in [`crate::cpu`] (`matmul`, `layer_norm`, `gelu`,
//! `attention`).

use super::kernels::{Binding, Kernel, Variant};
use super::ops::{groups_1d, Dispatch};
use super::{Gpu, SOFTWARE_LOOP_LIMIT};
use crate::cpu::{Activation, AttentionShape, SeqSpan};
use crate::error::{Error, Result};
use crate::kernel;

/// How a weight matrix is stored in its GPU buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// [n, k] f32, row-major.
    F32,
    /// [n, k] f16, two to a u32 (low half first), each row padded to a whole
    /// word; see [`pack_f16`].
    F16,
}

/// Packs a row-major [n, k] f32 matrix as the f16 layout the matmul reads
/// (rounded to nearest): rows of ceil(k / 2) words, low half first.
pub fn pack_f16(w: &[f32], n: usize, k: usize) -> Vec<u32> {
    assert_eq!(w.len(), n * k, "pack_f16: w is not [n, k]");
    let stride = k.div_ceil(2);
    let mut out = vec![0u32; n * stride];
    for (row, words) in w
        .chunks_exact(k.max(1))
        .zip(out.chunks_exact_mut(stride.max(1)))
    {
        for (i, v) in row.iter().enumerate() {
            let bits = half::f16::from_f32(*v).to_bits() as u32;
            words[i / 2] |= bits << (16 * (i % 2));
        }
    }
    out
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MatmulParams {
    m: u32,
    n: u32,
    k: u32,
    has_bias: u32,
    act: u32,
    has_residual: u32,
    w_stride: u32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<MatmulParams>() == 32);

kernel!(
    MATMUL,
    "matmul",
    ["erf.wgsl", "matmul_common.wgsl", "matmul.wgsl"],
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("bias"),
        Binding::read("residual"),
        Binding::write("y"),
    ],
    MatmulParams,
    [&[], &["W_F16"]]
);

kernel!(
    MATMUL_THIN,
    "matmul_thin",
    ["erf.wgsl", "matmul_common.wgsl", "matmul_thin.wgsl"],
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("bias"),
        Binding::read("residual"),
        Binding::write("y"),
    ],
    MatmulParams,
    [&[], &["W_F16"]]
);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MatmulNormParams {
    matmul: MatmulParams,
    eps: f32,
    cache_col: u32,
    n_seqs: u32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<MatmulNormParams>() == 48);

kernel!(
    MATMUL_THIN_NORM,
    "matmul_thin_norm",
    ["erf.wgsl", "matmul_common.wgsl", "matmul_thin.wgsl"],
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("bias"),
        Binding::read("residual"),
        Binding::write("y"),
        Binding::read("ln"),
        Binding::write("cache"),
        Binding::read("seqs"),
    ],
    MatmulNormParams,
    [&["NORM"], &["NORM", "W_F16"]]
);

/// Rows and columns of y one matmul workgroup computes.
const MATMUL_TILE: usize = 64;

/// Most rows [`matmul`] computes as matrix-vector products (`matmul_thin`);
/// more go through the tiles.
pub const MATMUL_THIN_ROWS: usize = 8;

/// Columns of y one `matmul_thin` workgroup computes.
const MATMUL_THIN_COLS: usize = 8;

/// One linear layer: y[m, n] = act(x[m, k] · w[n, k]^T + `bias[n]`) + residual[m, n].
pub struct Linear<'a> {
    pub x: &'a wgpu::Buffer,
    pub w: &'a wgpu::Buffer,
    pub format: WeightFormat,
    /// `[n]`
    pub bias: Option<&'a wgpu::Buffer>,
    /// [m, n], added after the activation.
    pub residual: Option<&'a wgpu::Buffer>,
    pub y: &'a wgpu::Buffer,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub act: Option<Activation>,
}

/// A LayerNorm folded into a [`matmul_thin_norm`]: x is its input.
pub struct FoldedNorm<'a> {
    /// `[2, k]`: gamma, then beta.
    pub gamma_beta: &'a wgpu::Buffer,
    pub eps: f32,
}

/// Where a [`matmul_thin_norm`] also writes its columns from `from_col` on:
/// row `kv_start + kv_len - q_len + (row - q_start)` of `cache` (rows of
/// `n - from_col`) for the span of `seqs` ([`pack_seqs`], `n_seqs` spans)
/// that holds the row; a decoder step's new keys and values.
pub struct CacheWrite<'a> {
    pub cache: &'a wgpu::Buffer,
    pub seqs: &'a wgpu::Buffer,
    pub n_seqs: usize,
    pub from_col: usize,
}

fn matmul_params(l: &Linear) -> Result<MatmulParams> {
    assert!(l.k > 0, "matmul: k is 0");
    let too_big = |v: usize| v > u32::MAX as usize;
    if too_big(l.m * l.k) || too_big(l.m * l.n) || l.m.div_ceil(MATMUL_TILE) > 65535 {
        return Err(Error::gpu(format!(
            "matmul of [{}, {}] x [{}, {}] is too large for one dispatch",
            l.m, l.k, l.n, l.k
        )));
    }
    let w_stride = match l.format {
        WeightFormat::F32 => l.k,
        WeightFormat::F16 => l.k.div_ceil(2),
    };
    Ok(MatmulParams {
        m: l.m as u32,
        n: l.n as u32,
        k: l.k as u32,
        has_bias: l.bias.is_some() as u32,
        act: match l.act {
            None => 0,
            Some(Activation::Gelu) => 1,
            Some(Activation::GeluTanh) => 2,
            Some(Activation::Relu) => 3,
            Some(Activation::Silu) => 4,
        },
        has_residual: l.residual.is_some() as u32,
        w_stride: w_stride as u32,
        _pad: 0,
    })
}

/// The variant of a weight format, with `defines` before it.
fn format_variant(format: WeightFormat, defines: &[&'static str]) -> Variant {
    let mut all = defines.to_vec();
    if format == WeightFormat::F16 {
        all.push("W_F16");
    }
    Variant::new(&all)
}

/// The matmul kernel bound to one [`Linear`] (`matmul_thin` for up to
/// [`MATMUL_THIN_ROWS`] rows). `y` must not alias an input.
pub fn matmul(gpu: &Gpu, l: &Linear) -> Result<Dispatch> {
    let params = matmul_params(l)?;
    let variant = format_variant(l.format, &[]);
    // Unused optional inputs are bound to x: read-only and never read.
    let bias = l.bias.unwrap_or(l.x);
    let residual = l.residual.unwrap_or(l.x);
    let buffers = [l.x, l.w, bias, residual, l.y];
    let thin_groups = l.n.div_ceil(MATMUL_THIN_COLS);
    if l.m <= MATMUL_THIN_ROWS && thin_groups <= 65535 {
        let bound = gpu.bind(&MATMUL_THIN, &variant, &buffers, &params)?;
        return Ok(Dispatch {
            bound,
            groups: [thin_groups as u32, 1, 1],
        });
    }
    let bound = gpu.bind(&MATMUL, &variant, &buffers, &params)?;
    Ok(Dispatch {
        bound,
        groups: [
            l.n.div_ceil(MATMUL_TILE) as u32,
            l.m.div_ceil(MATMUL_TILE) as u32,
            1,
        ],
    })
}

/// `matmul_thin` of a LayerNorm's output: [`matmul`] of
/// `layer_norm(l.x)` (`norm`'s gamma, beta and eps), the norm computed by
/// the product's workgroups, for up to [`MATMUL_THIN_ROWS`] rows; with
/// `cache`, the columns it names are also written there. `y` and the cache
/// must not alias an input.
pub fn matmul_thin_norm(
    gpu: &Gpu,
    l: &Linear,
    norm: &FoldedNorm,
    cache: Option<&CacheWrite>,
) -> Result<Dispatch> {
    let groups = l.n.div_ceil(MATMUL_THIN_COLS);
    if l.m > MATMUL_THIN_ROWS || groups > 65535 {
        return Err(Error::gpu(format!(
            "matmul_thin_norm of [{}, {}] x [{}, {}]: at most {MATMUL_THIN_ROWS} rows and {} columns",
            l.m,
            l.k,
            l.n,
            l.k,
            65535 * MATMUL_THIN_COLS
        )));
    }
    if let Some(c) = cache {
        assert!(c.from_col < l.n, "matmul_thin_norm: cache columns past n");
    }
    let params = MatmulNormParams {
        matmul: matmul_params(l)?,
        eps: norm.eps,
        cache_col: cache.map_or(0, |c| c.from_col as u32),
        n_seqs: cache.map_or(0, |c| c.n_seqs as u32),
        _pad: 0,
    };
    let variant = format_variant(l.format, &["NORM"]);
    // Unused inputs are bound to x (read-only, never read); an unused cache
    // to y (written only when n_seqs > 0).
    let bias = l.bias.unwrap_or(l.x);
    let residual = l.residual.unwrap_or(l.x);
    let (cache_buf, seqs) = cache.map_or((l.y, l.x), |c| (c.cache, c.seqs));
    let buffers = [
        l.x,
        l.w,
        bias,
        residual,
        l.y,
        norm.gamma_beta,
        cache_buf,
        seqs,
    ];
    let bound = gpu.bind(&MATMUL_THIN_NORM, &variant, &buffers, &params)?;
    Ok(Dispatch {
        bound,
        groups: [groups as u32, 1, 1],
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct LayerNormParams {
    n: u32,
    rows: u32,
    eps: f32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<LayerNormParams>() == 16);

kernel!(
    LAYER_NORM,
    "layer_norm",
    "layer_norm.wgsl",
    [
        Binding::read("x"),
        Binding::read("w"),
        Binding::read("b"),
        Binding::write("y"),
    ],
    LayerNormParams,
    [&[], &["SUBGROUPS"]]
);

/// `y[r] = (x[r] - mean) / sqrt(var + eps) * w + b` for `rows` rows of `n`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(
    gpu: &Gpu,
    variant: &Variant,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    b: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: usize,
    rows: usize,
    eps: f32,
) -> Result<Dispatch> {
    let params = LayerNormParams {
        n: n as u32,
        rows: rows as u32,
        eps,
        _pad: 0,
    };
    let bound = gpu.bind(&LAYER_NORM, variant, &[x, w, b, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(rows, 1),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct GeluParams {
    n: u32,
    _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<GeluParams>() == 16);

kernel!(
    GELU,
    "gelu",
    ["erf.wgsl", "gelu.wgsl"],
    [Binding::read("x"), Binding::write("y")],
    GeluParams,
    [&[]]
);

/// `y = gelu(x)` (exact erf form) over `n` elements.
pub fn gelu(gpu: &Gpu, x: &wgpu::Buffer, y: &wgpu::Buffer, n: usize) -> Result<Dispatch> {
    let params = GeluParams {
        n: n as u32,
        _pad: [0; 3],
    };
    let bound = gpu.bind(&GELU, &Variant::default(), &[x, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(n, 256),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SeqPoolParams {
    d: u32,
    n_seqs: u32,
    n_modes: u32,
    _pad: u32,
    modes: [u32; 8],
}
const _: () = assert!(std::mem::size_of::<SeqPoolParams>() == 48);

kernel!(
    SEQ_POOL,
    "seq_pool",
    "seq_pool.wgsl",
    [
        Binding::read("x"),
        Binding::read("seqs"),
        Binding::write("out")
    ],
    SeqPoolParams,
    [&[]]
);

/// How [`seq_pool`] reduces a sequence's rows: cls, last, max, mean,
/// mean / sqrt(len), position-weighted mean (the codes of seq_pool.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    First = 0,
    Last = 1,
    Max = 2,
    Mean = 3,
    MeanSqrtLen = 4,
    WeightedMean = 5,
}

/// Most modes one [`seq_pool`] dispatch computes.
pub const SEQ_POOL_MAX_MODES: usize = 6;

/// out[s, m d .. (m + 1) d] = mode m of sequence s's rows of x ([rows, d]);
/// `seqs_buf` is [`pack_seqs`] of the `n_seqs` sequences.
pub fn seq_pool(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    seqs_buf: &wgpu::Buffer,
    n_seqs: usize,
    d: usize,
    modes: &[PoolMode],
    out: &wgpu::Buffer,
) -> Result<Dispatch> {
    assert!(
        !modes.is_empty() && modes.len() <= SEQ_POOL_MAX_MODES,
        "seq_pool: {} modes",
        modes.len()
    );
    let mut codes = [0u32; 8];
    for (c, m) in codes.iter_mut().zip(modes) {
        *c = *m as u32;
    }
    let params = SeqPoolParams {
        d: d as u32,
        n_seqs: n_seqs as u32,
        n_modes: modes.len() as u32,
        _pad: 0,
        modes: codes,
    };
    let bound = gpu.bind(&SEQ_POOL, &Variant::default(), &[x, seqs_buf, out], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(n_seqs, 1),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AttentionParams {
    rows: u32,
    n_seqs: u32,
    heads: u32,
    kv_heads: u32,
    causal: u32,
    q_stride: u32,
    k_stride: u32,
    v_stride: u32,
    q_col: u32,
    k_col: u32,
    v_col: u32,
    scale: f32,
    window: u32,
    _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<AttentionParams>() == 64);

kernel!(
    ATTENTION,
    "attention",
    "attention.wgsl",
    [
        Binding::read("q"),
        Binding::read("k"),
        Binding::read("v"),
        Binding::read("seqs"),
        Binding::write("out"),
    ],
    AttentionParams,
    [&[]]
);

/// Query rows one attention workgroup handles (one per thread).
const ATTENTION_WG: usize = 64;

/// Largest head size the attention kernel handles (its per-thread arrays).
pub const ATTENTION_MAX_HEAD_DIM: usize = 256;

/// The attention pipeline for one head size (a specialisation constant).
pub fn attention_variant(head_dim: usize) -> Variant {
    Variant::default().with("HEAD_DIM", head_dim as u32)
}

/// The `seqs` buffer of [`attention`]: {q_start, q_len, kv_start, kv_len} per sequence.
pub fn pack_seqs(seqs: &[SeqSpan]) -> Vec<u32> {
    seqs.iter()
        .flat_map(|s| [s.q_start, s.q_len, s.kv_start, s.kv_len].map(|v| v as u32))
        .collect()
}

/// Attention over the ragged batch `seqs` (uploaded as `seqs_buf` =
/// [`pack_seqs`]); out: [rows, heads * head_dim]. Same maths as
/// [`crate::cpu::attention()`].
#[allow(clippy::too_many_arguments)]
pub fn attention(
    gpu: &Gpu,
    q: &wgpu::Buffer,
    k: &wgpu::Buffer,
    v: &wgpu::Buffer,
    seqs_buf: &wgpu::Buffer,
    seqs: &[SeqSpan],
    shape: &AttentionShape,
    out: &wgpu::Buffer,
) -> Result<Dispatch> {
    let rows: usize = seqs.iter().map(|s| s.q_len).sum();
    shape.check(seqs, rows);
    assert!(
        shape.head_dim <= ATTENTION_MAX_HEAD_DIM,
        "attention: head_dim {} over {ATTENTION_MAX_HEAD_DIM}",
        shape.head_dim
    );
    if rows == 0 || shape.heads > 65535 {
        return Err(Error::gpu(format!(
            "attention over {rows} rows and {} heads cannot be dispatched",
            shape.heads
        )));
    }
    // Each invocation walks its keys with two loops over the head per key.
    let mut longest = seqs.iter().map(|s| s.kv_len).max().unwrap_or(0);
    if shape.window > 0 {
        longest = longest.min(shape.window + 1);
    }
    let loops = longest * (2 * shape.head_dim + 6) + 2 * shape.head_dim + 64;
    if gpu.is_software() && loops > SOFTWARE_LOOP_LIMIT {
        return Err(Error::gpu(format!(
            "attention over {longest} keys of head size {} needs ~{loops} loop iterations per \
             invocation, more than the {SOFTWARE_LOOP_LIMIT} a software Vulkan driver \
             ({}) runs before it silently cuts loops short; use the CPU path (--cpu) or a \
             hardware GPU",
            shape.head_dim, gpu.info.name
        )));
    }
    let params = AttentionParams {
        rows: rows as u32,
        n_seqs: seqs.len() as u32,
        heads: shape.heads as u32,
        kv_heads: shape.kv_heads as u32,
        causal: shape.causal as u32,
        q_stride: shape.q_stride as u32,
        k_stride: shape.k_stride as u32,
        v_stride: shape.v_stride as u32,
        q_col: shape.q_col as u32,
        k_col: shape.k_col as u32,
        v_col: shape.v_col as u32,
        scale: shape.scale,
        window: shape.window as u32,
        _pad: [0; 3],
    };
    let variant = attention_variant(shape.head_dim);
    let bound = gpu.bind(&ATTENTION, &variant, &[q, k, v, seqs_buf, out], &params)?;
    let [x, y, _] = groups_1d(rows, ATTENTION_WG);
    Ok(Dispatch {
        bound,
        groups: [x, y, shape.heads as u32],
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct GatedParams {
    f: u32,
    n: u32,
    act: u32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<GatedParams>() == 16);

kernel!(
    GATED,
    "gated",
    ["erf.wgsl", "gated.wgsl"],
    [Binding::read("gu"), Binding::write("y")],
    GatedParams,
    [&[]]
);

/// gu: [n, 2 f] (activated half | linear half) -> y: [n, f] =
/// act(gu[.., ..f]) * gu[.., f..]; the twin of [`crate::cpu::gated_act`].
pub fn gated(
    gpu: &Gpu,
    gu: &wgpu::Buffer,
    y: &wgpu::Buffer,
    f: usize,
    n: usize,
    act: Activation,
) -> Result<Dispatch> {
    let params = GatedParams {
        f: f as u32,
        n: n as u32,
        act: match act {
            Activation::Gelu => 1,
            Activation::GeluTanh => 2,
            Activation::Relu => 3,
            Activation::Silu => 4,
        },
        _pad: 0,
    };
    let bound = gpu.bind(&GATED, &Variant::default(), &[gu, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(f * n, 256),
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct BiasRowsParams {
    cols: u32,
    rows: u32,
    has_bias: u32,
    has_residual: u32,
}
const _: () = assert!(std::mem::size_of::<BiasRowsParams>() == 16);

kernel!(
    BIAS_ROWS,
    "bias_rows",
    "bias_rows.wgsl",
    [
        Binding::read("bias"),
        Binding::read("residual"),
        Binding::write("y")
    ],
    BiasRowsParams,
    [&[]]
);

/// y: [rows, cols] = `bias[cols]` broadcast + residual (each optional; zeros
/// without either): a linear layer's output before a GEMM adds its products.
/// The twin of [`crate::cpu::bias_rows`]. `y` must not alias an input.
pub fn bias_rows(
    gpu: &Gpu,
    bias: Option<&wgpu::Buffer>,
    residual: Option<&wgpu::Buffer>,
    y: &wgpu::Buffer,
    rows: usize,
    cols: usize,
) -> Result<Dispatch> {
    let params = BiasRowsParams {
        cols: cols as u32,
        rows: rows as u32,
        has_bias: bias.is_some() as u32,
        has_residual: residual.is_some() as u32,
    };
    // Unused inputs are bound to another buffer that is only read.
    let spare = bias.or(residual);
    let (b, r) = match spare {
        Some(s) => (bias.unwrap_or(s), residual.unwrap_or(s)),
        None => {
            return Err(Error::gpu(
                "bias_rows without a bias or a residual: clear the buffer instead".to_string(),
            ))
        }
    };
    let bound = gpu.bind(&BIAS_ROWS, &Variant::default(), &[b, r, y], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(rows * cols, 256),
    })
}

/// The kernels declared in this module.
pub static KERNELS: &[&Kernel] = &[
    &MATMUL,
    &MATMUL_THIN,
    &MATMUL_THIN_NORM,
    &LAYER_NORM,
    &GELU,
    &ATTENTION,
    &GATED,
    &BIAS_ROWS,
    &SEQ_POOL,
];
