//! Decoder-LLM kernels: products over weights kept in their stored ggml
//! format (GEMV for decode with fused epilogues, a tiled GEMM for prefill),
//! the embedding gather, q/k norm + RoPE + cache write, flash attention,
//! LFM2's short convolution, SwiGLU and argmax. Each kernel has its CPU twin
//! of the same name in [`crate::cpu::llm`]; `tests/parity/llm.rs` checks
//! every variant against it.
//!
//! A weight matrix lives on the GPU as a [`GpuMatrix`]: its blocks made
//! 4-byte aligned by [`pack_blocks`] (same values), split by rows into chunks
//! that each fit one storage binding. A matrix can hold several parts of the
//! same shape (gate and up; LFM2's B, C and x projections), interleaved chunk
//! by chunk so one GEMV workgroup finds all of a row's parts in one buffer.

use super::context::Bound;
use super::kernels::{Binding, Kernel, Variant};
use super::ops::{groups_1d, Dispatch};
use super::Gpu;
use crate::cpu::AttnShape;
use crate::cpu::{FfnAct, RopeStyle};
use crate::error::{Error, Result};
use crate::kernel;
use crate::quant::GgmlType;

/// Weight formats the kernels read in place (others are converted at load).
pub const GPU_FORMATS: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// The preprocessor defines that select weight format `t` in
/// `quant_formats.wgsl`; `None` for a format without a GPU reader.
pub fn format_defines(t: GgmlType) -> Option<&'static [&'static str]> {
    Some(match t {
        GgmlType::F32 => &["W_F32", "W_FLOAT"],
        GgmlType::F16 => &["W_F16", "W_FLOAT"],
        GgmlType::BF16 => &["W_BF16", "W_FLOAT"],
        GgmlType::Q4_0 => &["W_Q4_0"],
        GgmlType::Q4_1 => &["W_Q4_1"],
        GgmlType::Q5_0 => &["W_Q5_0"],
        GgmlType::Q8_0 => &["W_Q8_0"],
        GgmlType::Q4_K => &["W_Q4_K"],
        GgmlType::Q6_K => &["W_Q6_K"],
        _ => return None,
    })
}

/// The weight format a variant of a format kernel was compiled for.
pub fn variant_format(v: &Variant) -> Option<GgmlType> {
    GPU_FORMATS
        .into_iter()
        .find(|&t| format_defines(t).is_some_and(|d| v.defines.contains(&d[0])))
}

/// The variant of a format kernel for weights of `t`, with `extra` defines.
fn format_variant(t: GgmlType, extra: &[&'static str]) -> Result<Variant> {
    let f =
        format_defines(t).ok_or_else(|| Error::gpu(format!("no GPU kernel reads {t} weights")))?;
    let mut d: Vec<&'static str> = f.to_vec();
    d.extend_from_slice(extra);
    Ok(Variant::new(&d))
}

/// Byte offset of the f16 scale in a block of the formats whose block size
/// is 2 mod 4; the kernels read those scales from a tail array instead.
fn split_scale_at(t: GgmlType) -> Option<usize> {
    match t {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => Some(0),
        GgmlType::Q6_K => Some(208),
        _ => None,
    }
}

/// Lays out whole blocks of `t` as the kernels read them, returning the
/// bytes and the word offset of the scale tail (0 when there is none).
/// Formats whose block size is 2 mod 4 have each block's 2-byte scale moved
/// to a tail array (in block order) so every block starts on a word; the
/// other bytes keep their order. Other formats are copied as they are. The
/// result is padded to a whole word.
pub fn pack_blocks(t: GgmlType, bytes: &[u8]) -> (Vec<u8>, u32) {
    let mut out;
    let mut d_off = 0;
    match split_scale_at(t) {
        None => out = bytes.to_vec(),
        Some(at) => {
            let bb = t.block_bytes();
            assert_eq!(bytes.len() % bb, 0, "pack_blocks: partial {t} block");
            out = Vec::with_capacity(bytes.len() + 4);
            for b in bytes.chunks_exact(bb) {
                out.extend_from_slice(&b[..at]);
                out.extend_from_slice(&b[at + 2..]);
            }
            debug_assert_eq!(out.len() % 4, 0);
            d_off = (out.len() / 4) as u32;
            for b in bytes.chunks_exact(bb) {
                out.extend_from_slice(&b[at..at + 2]);
            }
        }
    }
    out.resize(out.len().div_ceil(4).max(1) * 4, 0);
    (out, d_off)
}

/// One buffer of a [`GpuMatrix`]: rows `row0..row0 + rows` of every part.
pub struct MatrixChunk {
    pub buf: wgpu::Buffer,
    pub row0: usize,
    pub rows: usize,
    pub d_off: u32,
}

/// A weight matrix ([parts][rows, k] of `dtype`) on the GPU.
pub struct GpuMatrix {
    pub dtype: GgmlType,
    pub k: usize,
    /// Rows of each part.
    pub rows: usize,
    pub parts: usize,
    pub chunks: Vec<MatrixChunk>,
}

impl GpuMatrix {
    /// Uploads `parts` (each `rows` rows of `k` elements of `dtype`, as
    /// stored), split by rows so that no buffer exceeds `max_bytes`.
    pub fn upload(
        gpu: &Gpu,
        label: &str,
        dtype: GgmlType,
        k: usize,
        rows: usize,
        parts: &[&[u8]],
        max_bytes: u64,
    ) -> Result<GpuMatrix> {
        format_defines(dtype)
            .ok_or_else(|| Error::gpu(format!("{label}: no GPU kernel reads {dtype} weights")))?;
        let rb = dtype.row_bytes(k).ok_or_else(|| {
            Error::gpu(format!("{label}: rows of {k} are not whole {dtype} blocks"))
        })?;
        for p in parts {
            assert_eq!(
                p.len(),
                rows * rb,
                "{label}: part is not [{rows}, {k}] {dtype}"
            );
        }
        let per_row = (parts.len() * rb) as u64;
        // Room for the word of padding pack_blocks may add.
        let chunk_rows = (max_bytes.saturating_sub(4) / per_row).min(rows.max(1) as u64) as usize;
        if chunk_rows == 0 {
            return Err(Error::gpu(format!(
                "{label}: one row ({per_row} bytes) exceeds the adapter's {max_bytes} byte binding limit"
            )));
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let n = chunk_rows.min(rows - row0);
            let mut bytes = Vec::with_capacity(n * parts.len() * rb);
            for p in parts {
                bytes.extend_from_slice(&p[row0 * rb..(row0 + n) * rb]);
            }
            let (packed, d_off) = pack_blocks(dtype, &bytes);
            let buf = gpu.upload(&format!("{label}[{row0}..]"), &packed)?;
            chunks.push(MatrixChunk {
                buf,
                row0,
                rows: n,
                d_off,
            });
            row0 += n;
        }
        Ok(GpuMatrix {
            dtype,
            k,
            rows,
            parts: parts.len(),
            chunks,
        })
    }
}

/// Declares a kernel over every weight format, reading `quant_formats.wgsl`
/// before its own file (or files, a list: libraries first): the portable
/// variants, then each format again walking (`walk`) or with the
/// cooperative-matrix GEMM's COOP, F16 and SUBGROUPS (`coop_xh`,
/// `coop_xh_yh`). `$d` are defines every variant has.
macro_rules! format_kernel {
    ($ident:ident, $name:literal, $file:literal, $($rest:tt)*) => {
        format_kernel!($ident, $name, [$file], $($rest)*);
    };
    ($ident:ident, $name:literal, [$($file:literal),+], [$($b:expr),*], $params:ty, [$($d:literal),*]) => {
        format_kernel!(@sets $ident, $name, [$($file),+], [$($b),*], $params, [$($d),*], [], [[]]);
    };
    // The single-part decode GEMVs: also walking their row quads (WALK).
    ($ident:ident, $name:literal, [$($file:literal),+], [$($b:expr),*], $params:ty, [$($d:literal),*], walk) => {
        format_kernel!(@sets $ident, $name, [$($file),+], [$($b),*], $params, [$($d),*], [],
            [[] ["WALK"]]);
    };
    // The portable variant and the cooperative-matrix ones (tiles; rows
    // read a vec4 at a time: X4; or as f16 pairs: XH).
    ($ident:ident, $name:literal, [$($file:literal),+], [$($b:expr),*], $params:ty, [$($d:literal),*], coop_xh) => {
        format_kernel!(@sets $ident, $name, [$($file),+], [$($b),*], $params, [$($d),*], [],
            [[] ["COOP", "F16", "SUBGROUPS"] ["COOP", "F16", "SUBGROUPS", "WIDE"]
             ["COOP", "F16", "SUBGROUPS", "WIDE", "BIG"] ["COOP", "F16", "SUBGROUPS", "X4"]
             ["COOP", "F16", "SUBGROUPS", "WIDE", "X4"] ["COOP", "F16", "SUBGROUPS", "WIDE", "BIG", "X4"]
             ["COOP", "F16", "SUBGROUPS", "XH"] ["COOP", "F16", "SUBGROUPS", "WIDE", "XH"]
             ["COOP", "F16", "SUBGROUPS", "WIDE", "BIG", "XH"]]);
    };
    // coop_xh, and the gated GEMMs' outputs as f16 pairs (YH) for rows of
    // whole vec4s.
    ($ident:ident, $name:literal, [$($file:literal),+], [$($b:expr),*], $params:ty, [$($d:literal),*], coop_xh_yh) => {
        format_kernel!(@sets $ident, $name, [$($file),+], [$($b),*], $params, [$($d),*], [],
            [[] ["COOP", "F16", "SUBGROUPS"] ["COOP", "F16", "SUBGROUPS", "WIDE"]
             ["COOP", "F16", "SUBGROUPS", "WIDE", "BIG"] ["COOP", "F16", "SUBGROUPS", "X4"]
             ["COOP", "F16", "SUBGROUPS", "WIDE", "X4"] ["COOP", "F16", "SUBGROUPS", "WIDE", "BIG", "X4"]
             ["COOP", "F16", "SUBGROUPS", "XH"] ["COOP", "F16", "SUBGROUPS", "WIDE", "XH"]
             ["COOP", "F16", "SUBGROUPS", "WIDE", "BIG", "XH"]
             ["COOP", "F16", "SUBGROUPS", "X4", "YH"] ["COOP", "F16", "SUBGROUPS", "WIDE", "X4", "YH"]
             ["COOP", "F16", "SUBGROUPS", "WIDE", "BIG", "X4", "YH"]
             ["COOP", "F16", "SUBGROUPS", "XH", "YH"] ["COOP", "F16", "SUBGROUPS", "WIDE", "XH", "YH"]
             ["COOP", "F16", "SUBGROUPS", "WIDE", "BIG", "XH", "YH"]]);
    };
    // Each feature set `$f` adds one variant per format to the list `$acc`.
    (@sets $ident:ident, $name:literal, [$($file:literal),+], [$($b:expr),*], $params:ty, [$($d:literal),*],
     [$($acc:tt)*], [[$($f:literal),*] $($rest:tt)*]) => {
        format_kernel!(@sets $ident, $name, [$($file),+], [$($b),*], $params, [$($d),*], [$($acc)*
            &["W_F32", "W_FLOAT" $(, $f)* $(, $d)*],
            &["W_F16", "W_FLOAT" $(, $f)* $(, $d)*],
            &["W_BF16", "W_FLOAT" $(, $f)* $(, $d)*],
            &["W_Q4_0" $(, $f)* $(, $d)*],
            &["W_Q4_1" $(, $f)* $(, $d)*],
            &["W_Q5_0" $(, $f)* $(, $d)*],
            &["W_Q8_0" $(, $f)* $(, $d)*],
            &["W_Q4_K" $(, $f)* $(, $d)*],
            &["W_Q6_K" $(, $f)* $(, $d)*],
        ], [$($rest)*]);
    };
    (@sets $ident:ident, $name:literal, [$($file:literal),+], [$($b:expr),*], $params:ty, [$($d:literal),*],
     [$($acc:tt)*], []) => {
        kernel!($ident, $name, ["quant_formats.wgsl", $($file),+], [$($b),*], $params, [$($acc)*]);
    };
}

// ---------------------------------------------------------------- gemv

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct GemvParams {
    k: u32,
    rows: u32,
    out_off: u32,
    x_off: u32,
    d_off: u32,
    eps: f32,
    conv_l: u32,
    hidden: u32,
    ring: u32,
    /// COLS: activation columns, and the floats between columns of x and y.
    cols: u32,
    x_stride: u32,
    y_stride: u32,
    /// COLS: 0, or the lane groups of k each workgroup sums (gemv_sum adds
    /// them up).
    split: u32,
    _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<GemvParams>() == 64);

format_kernel!(
    GEMV,
    "gemv",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [Binding::read("w"), Binding::read("x"), Binding::write("y")],
    GemvParams,
    [],
    walk
);
format_kernel!(
    GEMV_ADD,
    "gemv_add",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [Binding::read("w"), Binding::read("x"), Binding::write("y")],
    GemvParams,
    ["ADD"],
    walk
);
format_kernel!(
    GEMV_NORM,
    "gemv_norm",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("y")
    ],
    GemvParams,
    ["NORM"],
    walk
);
format_kernel!(
    GEMV_SWIGLU,
    "gemv_swiglu",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("y")
    ],
    GemvParams,
    ["NORM", "SWIGLU"]
);
format_kernel!(
    GEMV_GEGLU,
    "gemv_geglu",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("y")
    ],
    GemvParams,
    ["NORM", "SWIGLU", "GELU"]
);
format_kernel!(
    GEMV_CONV,
    "gemv_conv",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::read("conv"),
        Binding::write("state"),
        Binding::read("step"),
        Binding::write("y")
    ],
    GemvParams,
    ["NORM", "CONV"]
);

// The same products over several activation columns (batched decode).
format_kernel!(
    GEMV_COLS,
    "gemv_cols",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::write("y"),
        Binding::write("part")
    ],
    GemvParams,
    ["COLS"]
);
format_kernel!(
    GEMV_COLS_ADD,
    "gemv_cols_add",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::write("y"),
        Binding::write("part")
    ],
    GemvParams,
    ["COLS", "ADD"]
);
format_kernel!(
    GEMV_COLS_NORM,
    "gemv_cols_norm",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("y"),
        Binding::write("part")
    ],
    GemvParams,
    ["COLS", "NORM"]
);
format_kernel!(
    GEMV_COLS_SWIGLU,
    "gemv_cols_swiglu",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("y"),
        Binding::write("part")
    ],
    GemvParams,
    ["COLS", "NORM", "SWIGLU"]
);
format_kernel!(
    GEMV_COLS_GEGLU,
    "gemv_cols_geglu",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("y"),
        Binding::write("part")
    ],
    GemvParams,
    ["COLS", "NORM", "SWIGLU", "GELU"]
);
format_kernel!(
    GEMV_COLS_CONV,
    "gemv_cols_conv",
    ["gemv_common.wgsl", "gemv.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::read("conv"),
        Binding::write("state"),
        Binding::read("step"),
        Binding::write("y"),
        Binding::write("part")
    ],
    GemvParams,
    ["COLS", "NORM", "CONV"]
);

// The end of a batched GEMV split over k: the group sums added up and the
// epilogue (gemv_sum.wgsl), one kernel per epilogue, whatever the format.
kernel!(
    GEMV_SUM,
    "gemv_sum",
    ["gemv_common.wgsl", "gemv_sum.wgsl"],
    [Binding::read("part"), Binding::write("y")],
    GemvParams,
    [&[]]
);
kernel!(
    GEMV_SUM_ADD,
    "gemv_sum_add",
    ["gemv_common.wgsl", "gemv_sum.wgsl"],
    [Binding::read("part"), Binding::write("y")],
    GemvParams,
    [&["ADD"]]
);
kernel!(
    GEMV_SUM_NORM,
    "gemv_sum_norm",
    ["gemv_common.wgsl", "gemv_sum.wgsl"],
    [Binding::read("part"), Binding::write("y")],
    GemvParams,
    [&["NORM"]]
);
kernel!(
    GEMV_SUM_SWIGLU,
    "gemv_sum_swiglu",
    ["gemv_common.wgsl", "gemv_sum.wgsl"],
    [Binding::read("part"), Binding::write("y")],
    GemvParams,
    [&["NORM", "SWIGLU"]]
);
kernel!(
    GEMV_SUM_GEGLU,
    "gemv_sum_geglu",
    ["gemv_common.wgsl", "gemv_sum.wgsl"],
    [Binding::read("part"), Binding::write("y")],
    GemvParams,
    [&["GELU", "NORM", "SWIGLU"]]
);
kernel!(
    GEMV_SUM_CONV,
    "gemv_sum_conv",
    ["gemv_common.wgsl", "gemv_sum.wgsl"],
    [
        Binding::read("part"),
        Binding::read("conv"),
        Binding::write("state"),
        Binding::read("step"),
        Binding::write("y")
    ],
    GemvParams,
    [&["CONV", "NORM"]]
);

/// Activation columns and weight rows (of each part) of one batched GEMV
/// workgroup (`BC`, `BR` in gemv.wgsl).
const GEMV_COLS_TILE: (usize, usize) = (32, 64);

/// Lanes of k, lanes a group and most groups a row in gemv_common.wgsl's
/// order of summation (`LANES`, `GROUP`, `GROUPS`).
const GEMV_LANES: usize = 128;
const GEMV_GROUP: usize = 8;
const GEMV_GROUPS: usize = GEMV_LANES / GEMV_GROUP;

/// Output rows of one gemv_sum workgroup.
const GEMV_SUM_ROWS: usize = 64;

/// Lane groups of a row of `k` (gemv_common.wgsl's `group_count`).
fn gemv_groups(k: usize) -> usize {
    k.div_ceil(8).min(GEMV_LANES).div_ceil(GEMV_GROUP)
}

/// Batched GEMVs of fewer tiles than this are split over k, one workgroup
/// a lane group (see [`KSplit`]).
const GEMV_SPLIT_BELOW: usize = 512;
/// Workgroups a tile of a split GEMV has, at most.
const GEMV_SPLIT_WAYS: usize = 8;
/// Largest partial-sum buffer a split may use.
const GEMV_SPLIT_MAX_BYTES: usize = 64 << 20;

/// u32s of one row record of a batched decode step (the `step` binding of
/// the batched kernels): [slot, pos, kv_len, splits, where the sequence's
/// KV block table starts in the same buffer, first conv-state ring row of
/// the slot, 0, 0]. The block tables follow the records (paged_cache.wgsl).
pub const ROW_RECORD: usize = 8;

/// Output rows of one GEMV workgroup (`R` in gemv.wgsl).
const GEMV_ROWS: usize = 4;

/// How the single (one-column) GEMV lays its rows over workgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvLayout {
    /// `Walk(GEMV_WALK_GROUPS)` for single-part matrices of at least
    /// [`GEMV_WALK_FROM`] rows, else [`GemvLayout::Quads`].
    Auto,
    /// One workgroup a quad of rows (each reads x and reduces its norm).
    Quads,
    /// At most this many workgroups, each walking quads (gemv.wgsl's WALK):
    /// x read and its norm reduced once a workgroup. Single-part epilogues
    /// only (Store, Add, Norm).
    Walk(usize),
}

/// Rows from which [`GemvLayout::Auto`] walks (the output head; the
/// 2026-12-07 H100 measurements in BENCHMARKS.md).
pub const GEMV_WALK_FROM: usize = 16384;
/// Workgroups of a walking GEMV, at most.
pub const GEMV_WALK_GROUPS: usize = 2048;

/// What a GEMV does with its dot products (see gemv.wgsl).
pub enum GemvEpilogue<'a> {
    /// y = W x
    Store,
    /// y += W x (the residual add)
    Add,
    /// y = W rms_norm(x, nw)
    Norm { nw: &'a wgpu::Buffer, eps: f32 },
    /// y = act(G n) * (U n), n = rms_norm(x, nw); parts: gate, up.
    Swiglu {
        nw: &'a wgpu::Buffer,
        eps: f32,
        act: FfnAct,
    },
    /// LFM2's short-conv block (parts: B, C, x) up to the output projection.
    Conv {
        nw: &'a wgpu::Buffer,
        eps: f32,
        /// [hidden, taps]
        conv: &'a wgpu::Buffer,
        /// [ring, hidden]: the ring of gated inputs (gemv.wgsl).
        state: &'a wgpu::Buffer,
        /// [token, pos, ...]: the position of the token.
        step: &'a wgpu::Buffer,
        taps: usize,
        /// Rows of `state` (at least `taps`).
        ring: usize,
    },
}

/// y[out_off..] (+)= W x[x_off..], one dispatch per chunk of `w`.
#[allow(clippy::too_many_arguments)]
pub fn gemv(
    gpu: &Gpu,
    w: &GpuMatrix,
    epi: &GemvEpilogue,
    x: &wgpu::Buffer,
    x_off: usize,
    y: &wgpu::Buffer,
    out_off: usize,
) -> Result<Vec<Dispatch>> {
    gemv_layout(gpu, w, epi, x, x_off, y, out_off, GemvLayout::Auto)
}

/// [`gemv`] in a given layout (the same bits in every layout).
#[allow(clippy::too_many_arguments)]
pub fn gemv_layout(
    gpu: &Gpu,
    w: &GpuMatrix,
    epi: &GemvEpilogue,
    x: &wgpu::Buffer,
    x_off: usize,
    y: &wgpu::Buffer,
    out_off: usize,
    layout: GemvLayout,
) -> Result<Vec<Dispatch>> {
    gemv_impl(gpu, w, epi, x, x_off, y, out_off, None, layout)
}

/// Activation columns of a batched GEMV: how many, and the floats between
/// consecutive columns of x and of y.
#[derive(Clone, Copy, Debug)]
pub struct Cols {
    pub n: usize,
    pub x_stride: usize,
    pub y_stride: usize,
    pub split: KSplit,
}

impl Cols {
    /// `n` columns, split over k as the shape asks ([`KSplit::Auto`]).
    pub const fn new(n: usize, x_stride: usize, y_stride: usize) -> Cols {
        Cols {
            n,
            x_stride,
            y_stride,
            split: KSplit::Auto,
        }
    }
}

/// Whether a batched GEMV's k is summed by one workgroup per tile or by one
/// per lane group of k, whose sums a second dispatch adds up in order (the
/// same bits either way: gemv_common.wgsl's one order of summation). A
/// split gives the GPU more workgroups where the tiles are few (a thin
/// matrix at a small batch), at the cost of writing the partial sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KSplit {
    /// Split when the tiles are few and the partial sums fit.
    Auto,
    Whole,
    Groups,
}

/// [`gemv`] over `cols.n` columns: y[j y_stride + out_off..] (+)= W
/// x[x_off + j x_stride..] for each column j, as a tiled product (each
/// weight tile dequantised once for 32 columns); column j comes out
/// bit-equal to [`gemv`] on column j (gemv.wgsl's one order of summation). A conv epilogue's `step` holds one row record
/// ([`ROW_RECORD`]) per column: its position and its state's ring.
#[allow(clippy::too_many_arguments)]
pub fn gemv_cols(
    gpu: &Gpu,
    w: &GpuMatrix,
    epi: &GemvEpilogue,
    x: &wgpu::Buffer,
    x_off: usize,
    y: &wgpu::Buffer,
    out_off: usize,
    cols: Cols,
) -> Result<Vec<Dispatch>> {
    assert!(cols.n > 0, "gemv_cols: no columns");
    gemv_impl(
        gpu,
        w,
        epi,
        x,
        x_off,
        y,
        out_off,
        Some(cols),
        GemvLayout::Quads,
    )
}

#[allow(clippy::too_many_arguments)]
fn gemv_impl(
    gpu: &Gpu,
    w: &GpuMatrix,
    epi: &GemvEpilogue,
    x: &wgpu::Buffer,
    x_off: usize,
    y: &wgpu::Buffer,
    out_off: usize,
    cols: Option<Cols>,
    layout: GemvLayout,
) -> Result<Vec<Dispatch>> {
    type Kernels = (&'static Kernel, &'static Kernel, &'static Kernel);
    let ((single, many, sum), parts, defines): (Kernels, usize, &[&'static str]) = match epi {
        GemvEpilogue::Store => ((&GEMV, &GEMV_COLS, &GEMV_SUM), 1, &[]),
        GemvEpilogue::Add => ((&GEMV_ADD, &GEMV_COLS_ADD, &GEMV_SUM_ADD), 1, &["ADD"]),
        GemvEpilogue::Norm { .. } => ((&GEMV_NORM, &GEMV_COLS_NORM, &GEMV_SUM_NORM), 1, &["NORM"]),
        GemvEpilogue::Swiglu {
            act: FfnAct::Silu, ..
        } => (
            (&GEMV_SWIGLU, &GEMV_COLS_SWIGLU, &GEMV_SUM_SWIGLU),
            2,
            &["NORM", "SWIGLU"],
        ),
        GemvEpilogue::Swiglu {
            act: FfnAct::GeluTanh,
            ..
        } => (
            (&GEMV_GEGLU, &GEMV_COLS_GEGLU, &GEMV_SUM_GEGLU),
            2,
            &["NORM", "SWIGLU", "GELU"],
        ),
        GemvEpilogue::Conv { .. } => (
            (&GEMV_CONV, &GEMV_COLS_CONV, &GEMV_SUM_CONV),
            3,
            &["NORM", "CONV"],
        ),
    };
    let mut extra: Vec<&'static str> = defines.to_vec();
    let kernel = if cols.is_some() {
        extra.push("COLS");
        many
    } else {
        single
    };
    // WALK's most workgroups, when it walks (the batched kernel never does).
    let walk = match layout {
        _ if cols.is_some() => None,
        GemvLayout::Quads => None,
        GemvLayout::Auto => (parts == 1 && w.rows >= GEMV_WALK_FROM).then_some(GEMV_WALK_GROUPS),
        GemvLayout::Walk(groups) => {
            assert_eq!(parts, 1, "{}: WALK takes single-part matrices", kernel.name);
            Some(groups.max(1))
        }
    };
    if walk.is_some() {
        extra.push("WALK");
    }
    assert_eq!(
        w.parts, parts,
        "{}: matrix has {} parts",
        kernel.name, w.parts
    );
    let (eps, taps, ring) = match epi {
        GemvEpilogue::Norm { eps, .. } | GemvEpilogue::Swiglu { eps, .. } => (*eps, 0, 0),
        GemvEpilogue::Conv {
            eps, taps, ring, ..
        } => {
            assert!(
                ring >= taps,
                "gemv_conv: a ring of {ring} rows for {taps} taps"
            );
            (*eps, *taps, *ring)
        }
        _ => (0.0, 0, 0),
    };
    let groups_k = gemv_groups(w.k);
    // A split's lane groups per workgroup: GEMV_SPLIT_WAYS workgroups a tile.
    let group_run = groups_k.div_ceil(GEMV_SPLIT_WAYS);
    let mut out = Vec::with_capacity(w.chunks.len());
    for c in &w.chunks {
        let variant = format_variant(w.dtype, &extra)?;
        let (per_cols, per_rows) = GEMV_COLS_TILE;
        // Whether this chunk's k is split, and the partial sums' floats.
        let split = cols.and_then(|cols| {
            let part_floats = (GEMV_GROUPS * parts * c.rows + GEMV_GROUPS) * cols.n;
            let tiles = cols.n.div_ceil(per_cols) * c.rows.div_ceil(per_rows);
            let wanted = match cols.split {
                KSplit::Whole => false,
                KSplit::Groups => true,
                KSplit::Auto => {
                    groups_k > 1
                        && tiles < GEMV_SPLIT_BELOW
                        && part_floats * 4 <= GEMV_SPLIT_MAX_BYTES
                }
            };
            wanted.then_some(part_floats)
        });
        let params = GemvParams {
            k: w.k as u32,
            rows: c.rows as u32,
            out_off: (out_off + c.row0) as u32,
            x_off: x_off as u32,
            d_off: c.d_off,
            eps,
            conv_l: taps as u32,
            hidden: w.rows as u32,
            ring: ring as u32,
            cols: cols.map_or(1, |c| c.n) as u32,
            x_stride: cols.map_or(0, |c| c.x_stride) as u32,
            y_stride: cols.map_or(0, |c| c.y_stride) as u32,
            split: if split.is_some() { group_run as u32 } else { 0 },
            _pad: [0; 3],
        };
        // The partial sums: one buffer every split GEMV shares, each
        // consumed by the dispatch after the one that writes it.
        let part = if cols.is_some() {
            Some(gpu.partials((split.unwrap_or(1) * 4) as u64)?)
        } else {
            None
        };
        let mut bufs: Vec<&wgpu::Buffer> = match epi {
            GemvEpilogue::Store | GemvEpilogue::Add => vec![&c.buf, x, y],
            GemvEpilogue::Norm { nw, .. } | GemvEpilogue::Swiglu { nw, .. } => {
                vec![&c.buf, x, nw, y]
            }
            GemvEpilogue::Conv {
                nw,
                conv,
                state,
                step,
                ..
            } => vec![&c.buf, x, nw, conv, state, step, y],
        };
        bufs.extend(part.as_ref());
        let groups = match (cols, walk) {
            (None, Some(most)) => groups_1d(c.rows.div_ceil(GEMV_ROWS).min(most), 1),
            (None, None) => groups_1d(c.rows, GEMV_ROWS),
            (Some(cols), _) => {
                // Column tiles fastest: the workgroups of one weight tile
                // run together and share it in cache (gemv.wgsl); then the
                // lane groups of a split.
                let rows = groups_1d(c.rows, per_rows);
                let ks = if split.is_some() {
                    groups_k.div_ceil(group_run)
                } else {
                    1
                };
                [(cols.n.div_ceil(per_cols) * ks) as u32, rows[0], rows[1]]
            }
        };
        out.push(Dispatch {
            bound: gpu.bind(kernel, &variant, &bufs, &params)?,
            groups,
        });
        if let (Some(cols), Some(part), Some(_)) = (cols, &part, split) {
            let sum_bufs: Vec<&wgpu::Buffer> = match epi {
                GemvEpilogue::Conv {
                    conv, state, step, ..
                } => vec![part, conv, state, step, y],
                _ => vec![part, y],
            };
            let sum_variant = Variant::new(sum.variants[0]);
            out.push(Dispatch {
                bound: gpu.bind(sum, &sum_variant, &sum_bufs, &params)?,
                groups: [c.rows.div_ceil(GEMV_SUM_ROWS) as u32, cols.n as u32, 1],
            });
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- gemm

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct GemmParams {
    k: u32,
    rows: u32,
    n: u32,
    x_stride: u32,
    y_stride: u32,
    part_rows: u32,
    part_stride: u32,
    out_off: u32,
    d_off: u32,
    eps: f32,
    /// SPLIT: k per workgroup in z.
    k_span: u32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<GemmParams>() == 48);

impl GemmParams {
    /// The params of chunk `c` of `w` over `n` tokens (`out_off`: y's column
    /// of the chunk's first row; `k_span`: SPLIT's k per workgroup, else 0).
    #[allow(clippy::too_many_arguments)]
    fn chunk(
        w: &GpuMatrix,
        c: &MatrixChunk,
        n: usize,
        x_stride: usize,
        y_stride: usize,
        out_off: usize,
        eps: f32,
        k_span: usize,
    ) -> GemmParams {
        GemmParams {
            k: w.k as u32,
            rows: (c.rows * w.parts) as u32,
            n: n as u32,
            x_stride: x_stride as u32,
            y_stride: y_stride as u32,
            part_rows: c.rows as u32,
            part_stride: w.rows as u32,
            out_off: out_off as u32,
            d_off: c.d_off,
            eps,
            k_span: k_span as u32,
            _pad: 0,
        }
    }
}

format_kernel!(
    GEMM_ADD,
    "gemm_add",
    ["gate_act.wgsl", "gemm.wgsl"],
    [Binding::read("w"), Binding::read("x"), Binding::write("y")],
    GemmParams,
    ["ADD"],
    coop_xh
);

format_kernel!(
    GEMM_ADD_SPLIT,
    "gemm_add_split",
    ["gate_act.wgsl", "gemm.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::write("part")
    ],
    GemmParams,
    ["ADD", "SPLIT"],
    coop_xh
);

format_kernel!(
    GEMM_NORM_SPLIT,
    "gemm_norm_split",
    ["gate_act.wgsl", "gemm.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("part")
    ],
    GemmParams,
    ["NORM", "SPLIT"],
    coop_xh
);

// Split, the gated epilogues differ only in the sum (gemm_split_sum).
format_kernel!(
    GEMM_NORM_SWIGLU_SPLIT,
    "gemm_norm_swiglu_split",
    ["gate_act.wgsl", "gemm.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("part")
    ],
    GemmParams,
    ["NORM", "SWIGLU", "SPLIT"],
    coop_xh
);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SplitSumParams {
    cols: u32,
    n: u32,
    splits: u32,
    y_stride: u32,
    out_off: u32,
    part_rows: u32,
    k: u32,
    eps: f32,
    _pad: [u32; 4],
}
const _: () = assert!(std::mem::size_of::<SplitSumParams>() == 48);

kernel!(
    GEMM_SPLIT_SUM,
    "gemm_split_sum",
    ["gate_act.wgsl", "gemm_split_sum.wgsl"],
    [Binding::read("part"), Binding::write("y")],
    SplitSumParams,
    [
        &[],
        &["NORM"],
        &["NORM", "SWIGLU"],
        &["NORM", "SWIGLU", "GELU"],
        &["V4"],
        &["NORM", "V4"]
    ]
);

format_kernel!(
    GEMM_NORM,
    "gemm_norm",
    ["gate_act.wgsl", "gemm.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("y")
    ],
    GemmParams,
    ["NORM"],
    coop_xh
);

format_kernel!(
    GEMM_NORM_SWIGLU,
    "gemm_norm_swiglu",
    ["gate_act.wgsl", "gemm.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("y")
    ],
    GemmParams,
    ["NORM", "SWIGLU"],
    coop_xh_yh
);

format_kernel!(
    GEMM_NORM_GEGLU,
    "gemm_norm_geglu",
    ["gate_act.wgsl", "gemm.wgsl"],
    [
        Binding::read("w"),
        Binding::read("x"),
        Binding::read("nw"),
        Binding::write("y")
    ],
    GemmParams,
    ["NORM", "SWIGLU", "GELU"],
    coop_xh_yh
);

/// The GEMM kernels with the defines that pick each one's epilogue.
static GEMM_EPILOGUES: [(&Kernel, &[&str]); 4] = [
    (&GEMM_ADD, &["ADD"]),
    (&GEMM_NORM, &["NORM"]),
    (&GEMM_NORM_SWIGLU, &["NORM", "SWIGLU"]),
    (&GEMM_NORM_GEGLU, &["NORM", "SWIGLU", "GELU"]),
];

kernel!(
    GEMM_SPLIT_SUM_SHADOW,
    "gemm_split_sum_shadow",
    ["gate_act.wgsl", "gemm_split_sum.wgsl"],
    [
        Binding::read("part"),
        Binding::write("y"),
        Binding::write("yh")
    ],
    SplitSumParams,
    [&["SHADOW", "V4"]]
);

/// Whether gemm_split_sum finishes `cols` columns at `out_off` of rows
/// `y_stride` apart four at a time (its V4; the ADD and NORM epilogues).
pub fn split_sum_in_vec4s(cols: usize, out_off: usize, y_stride: usize) -> bool {
    [cols, out_off, y_stride]
        .iter()
        .all(|v| v.is_multiple_of(4))
}

/// The defines of `gemm_split_sum` that finish each mode's epilogue (in
/// [`GemmMode::epilogue`]'s order).
static GEMM_SPLIT_SUM_DEFINES: [&[&str]; 4] = [
    &[],
    &["NORM"],
    &["NORM", "SWIGLU"],
    &["NORM", "SWIGLU", "GELU"],
];

/// The defines of a cooperative-matrix variant (the `coop` set of
/// `format_kernel!`), for adapters with `caps.coop_matrix`.
const COOP: [&str; 3] = ["COOP", "F16", "SUBGROUPS"];

/// The tiles of the cooperative-matrix GEMM (gemm.wgsl's COOP variants).
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum CoopTile {
    /// 64 weight rows x 32 tokens
    Narrow,
    /// 128 x 64 (WIDE)
    Wide,
    /// 128 x 128 (WIDE and BIG)
    Big,
}

impl CoopTile {
    /// Weight rows and tokens of one tile (`BN`, `BM` in gemm.wgsl).
    fn size(self) -> (usize, usize) {
        match self {
            CoopTile::Narrow => GEMM_TILE,
            CoopTile::Wide => (128, 64),
            CoopTile::Big => (128, 128),
        }
    }

    /// The defines that pick the tile.
    fn defines(self) -> &'static [&'static str] {
        match self {
            CoopTile::Narrow => &[],
            CoopTile::Wide => &["WIDE"],
            CoopTile::Big => &["WIDE", "BIG"],
        }
    }
}

/// Whether a cooperative-matrix GEMM over rows of `k` values `x_stride`
/// apart reads them a vec4 at a time (gemm.wgsl's X4).
pub fn gemm_reads_x4(x_stride: usize, k: usize) -> bool {
    x_stride.is_multiple_of(4) && k.is_multiple_of(4)
}

/// Whether BIG tiles would compute more padding tokens than WIDE ones for
/// `n` tokens (at 64, a batched decode step's head: half of each BIG tile
/// idle; the step measured 4-6% slower so on the H100).
fn pads_more_tokens(tile: CoopTile, n: usize) -> bool {
    let padded = |t: CoopTile| n.div_ceil(t.size().1) * t.size().1;
    tile == CoopTile::Big && padded(CoopTile::Big) > padded(CoopTile::Wide)
}

/// Weight rows and tokens of one tile of the portable GEMM, and of the
/// narrow COOP one.
const GEMM_TILE: (usize, usize) = (64, 32);

/// The fewest WIDE (or BIG) tiles a GEMM must have to use them (where they
/// fit, `Capabilities::coop_wide`): on the H200 (132 multiprocessors) WIDE
/// tiles made GEMMs of 128 tiles and more 8-25% faster, and one of 64 tiles
/// 50% slower (a GPU half idle).
const GEMM_WIDE_MIN_TILES: usize = 128;

/// Which GEMM kernel runs.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum GemmKernel {
    /// The portable kernel (f32 products)
    Portable,
    /// On cooperative matrices (f16 products; adapters with
    /// `caps.coop_matrix`), in BIG or else WIDE tiles where they fit and a
    /// GEMM has at least `GEMM_WIDE_MIN_TILES` of them (BIG: where they pad
    /// no more tokens than WIDE)
    Coop,
    /// On cooperative matrices in the tiles given (parity tests)
    CoopTiles(CoopTile),
}

impl GemmKernel {
    /// k a step of the kernel sums (`BK` in gemm.wgsl): a split's span is
    /// a whole number of them.
    fn k_step(self) -> usize {
        match self {
            GemmKernel::Portable => 32,
            GemmKernel::Coop | GemmKernel::CoopTiles { .. } => 64,
        }
    }

    /// The kernel for an adapter with or without cooperative matrices.
    pub fn for_adapter(coop: bool) -> GemmKernel {
        if coop {
            GemmKernel::Coop
        } else {
            GemmKernel::Portable
        }
    }
}

/// What a GEMM does with its sums, and to its activations first.
#[derive(Clone, Copy)]
pub enum GemmMode<'a> {
    /// y += W x (the residual add)
    Add,
    /// y = W (rms_norm(x) * nw): the prenorm fused into the product
    Norm { nw: &'a wgpu::Buffer, eps: f32 },
    /// As `Norm` for a [gate; up] matrix (two parts), then
    /// y[t, r] = act(gate[t, r]) * up[t, r]: a gated MLP up to its down
    /// projection
    NormSwiglu {
        nw: &'a wgpu::Buffer,
        eps: f32,
        act: FfnAct,
        /// y as f16 pairs ([`GemmInput::F16`] for the down projection;
        /// unsplit, on cooperative matrices, where [`gemm_writes_f16`])
        f16_out: bool,
    },
    /// As `Add`, keeping an f16 copy of y's new values in `yh` (f16 pairs,
    /// [`GemmInput::F16`]): split GEMMs only ([`gemm_split`])
    AddShadow { yh: &'a wgpu::Buffer },
}

impl GemmMode<'_> {
    /// The index of the mode's epilogue in [`GEMM_EPILOGUES`] and in
    /// [`GEMM_SPLIT_SUM_DEFINES`].
    fn epilogue(&self) -> usize {
        match self {
            GemmMode::Add | GemmMode::AddShadow { .. } => 0,
            GemmMode::Norm { .. } => 1,
            GemmMode::NormSwiglu {
                act: FfnAct::Silu, ..
            } => 2,
            GemmMode::NormSwiglu {
                act: FfnAct::GeluTanh,
                ..
            } => 3,
        }
    }

    /// The kernel, and the defines that pick its epilogue.
    fn kernel(&self) -> (&'static Kernel, &'static [&'static str]) {
        GEMM_EPILOGUES[self.epilogue()]
    }

    /// The GEMM kernel of the mode split over k, and its defines.
    fn split_kernel(&self) -> (&'static Kernel, &'static [&'static str]) {
        match self {
            GemmMode::Add | GemmMode::AddShadow { .. } => (&GEMM_ADD_SPLIT, &["ADD", "SPLIT"]),
            GemmMode::Norm { .. } => (&GEMM_NORM_SPLIT, &["NORM", "SPLIT"]),
            GemmMode::NormSwiglu { .. } => (&GEMM_NORM_SWIGLU_SPLIT, &["NORM", "SWIGLU", "SPLIT"]),
        }
    }

    /// The norm weights and epsilon, for the modes that normalise.
    fn norm(&self) -> Option<(&wgpu::Buffer, f32)> {
        match *self {
            GemmMode::Norm { nw, eps } | GemmMode::NormSwiglu { nw, eps, .. } => Some((nw, eps)),
            GemmMode::Add | GemmMode::AddShadow { .. } => None,
        }
    }
}

/// A GEMM's activations: f32 rows, or rows of f16 pairs (`pack2x16float`,
/// as gemm_split_sum's SHADOW writes them; cooperative matrices only, rows
/// of whole vec4s: gemm.wgsl's XH).
#[derive(Clone, Copy)]
pub enum GemmInput<'a> {
    F32(&'a wgpu::Buffer),
    F16(&'a wgpu::Buffer),
}

impl<'a> From<&'a wgpu::Buffer> for GemmInput<'a> {
    fn from(b: &'a wgpu::Buffer) -> GemmInput<'a> {
        GemmInput::F32(b)
    }
}

impl GemmInput<'_> {
    fn buffer(&self) -> &wgpu::Buffer {
        match *self {
            GemmInput::F32(b) | GemmInput::F16(b) => b,
        }
    }
}

/// Whether a gated GEMM (`NormSwiglu`) of `w` can write its outputs at
/// `out_off` of rows `y_stride` apart as f16 pairs (gemm.wgsl's YH): every
/// chunk's rows in whole pairs.
pub fn gemm_writes_f16(w: &GpuMatrix, out_off: usize, y_stride: usize) -> bool {
    let even = |v: usize| v.is_multiple_of(2);
    even(y_stride)
        && w.chunks
            .iter()
            .all(|c| even(c.rows) && even(out_off + c.row0))
}

/// How a cooperative-matrix GEMM reads its activations.
#[derive(Clone, Copy, PartialEq)]
enum XRead {
    /// One f32 at a time
    F32,
    /// A vec4 of f32 at a time (gemm.wgsl's X4)
    X4,
    /// Four f16s at a time (XH)
    F16,
}

/// The GEMM variant for weights of `t` with the epilogue `defines`: with
/// a `coop` tile, a cooperative-matrix one, reading the activations as
/// `read` says.
fn gemm_variant(
    t: GgmlType,
    defines: &[&'static str],
    coop: Option<CoopTile>,
    read: XRead,
    f16_out: bool,
) -> Result<Variant> {
    let mut extra = defines.to_vec();
    if let Some(tile) = coop {
        extra.extend(COOP);
        extra.extend(tile.defines());
        match read {
            XRead::F32 => {}
            XRead::X4 => extra.push("X4"),
            XRead::F16 => extra.push("XH"),
        }
        if f16_out {
            extra.push("YH");
        }
    }
    format_variant(t, &extra)
}

/// y[t, out_off + part * w.rows + r] (+)= `W_part[r]` . `x[t]` for `n` tokens
/// (`mode` says which, and whether x[t] is RMS-normalised first);
/// x: [n, x_stride], y: [n, y_stride]. One dispatch per chunk of `w`.
#[allow(clippy::too_many_arguments)]
pub fn gemm<'a>(
    gpu: &Gpu,
    kernel: GemmKernel,
    w: &GpuMatrix,
    mode: GemmMode,
    x: impl Into<GemmInput<'a>>,
    x_stride: usize,
    y: &wgpu::Buffer,
    y_stride: usize,
    out_off: usize,
    n: usize,
) -> Result<Vec<Dispatch>> {
    let (shader, defines) = mode.kernel();
    if matches!(mode, GemmMode::AddShadow { .. }) {
        return Err(Error::gpu("gemm: only a split GEMM keeps an f16 copy"));
    }
    gemm_chunks(
        gpu,
        kernel,
        w,
        mode,
        (shader, defines),
        x.into(),
        x_stride,
        y,
        y_stride,
        out_off,
        n,
        None,
    )
}

/// A GEMM split over k: the k each workgroup in z sums, the ways, and (on
/// cooperative matrices) the tile.
#[derive(Clone, Copy)]
struct KSpan {
    span: usize,
    ways: usize,
    tile: CoopTile,
}

/// One dispatch per chunk of `w` of the GEMM `shader` with its `defines`
/// (the mode's epilogue), into `out` ([n, out_stride], `w`'s first row at
/// column `out_off`); with `split` the workgroups in z take a span of k
/// each.
#[allow(clippy::too_many_arguments)]
fn gemm_chunks(
    gpu: &Gpu,
    kernel: GemmKernel,
    w: &GpuMatrix,
    mode: GemmMode,
    (shader, defines): (&'static Kernel, &'static [&'static str]),
    x: GemmInput,
    x_stride: usize,
    out: &wgpu::Buffer,
    out_stride: usize,
    out_off: usize,
    n: usize,
    split: Option<KSpan>,
) -> Result<Vec<Dispatch>> {
    let swiglu = matches!(mode, GemmMode::NormSwiglu { .. });
    if swiglu && w.parts != 2 {
        return Err(Error::gpu(format!(
            "{} needs a [gate; up] matrix, got {} parts",
            shader.name, w.parts
        )));
    }
    let eps = mode.norm().map_or(0.0, |(_, eps)| eps);
    let (k_span, ways) = split.map_or((0, 1), |s| (s.span, s.ways));
    let mut ds = Vec::with_capacity(w.chunks.len());
    for c in &w.chunks {
        let rows = c.rows * w.parts;
        let params =
            GemmParams::chunk(w, c, n, x_stride, out_stride, out_off + c.row0, eps, k_span);
        // SWIGLU tiles hold half their rows from each part.
        let tiles = |(tile_rows, tile_tokens): (usize, usize)| {
            let across = if swiglu {
                c.rows.div_ceil(tile_rows / 2)
            } else {
                rows.div_ceil(tile_rows)
            };
            [across, n.div_ceil(tile_tokens)]
        };
        let coop = match (kernel, split) {
            (GemmKernel::Portable, _) => None,
            (_, Some(s)) => Some(s.tile),
            (GemmKernel::Coop, None) => Some(coop_tile(
                gpu,
                |t| {
                    let [across, down] = tiles(t.size());
                    across * down
                },
                n,
            )),
            (GemmKernel::CoopTiles(tile), None) => Some(tile),
        };
        let read = match (x, coop.is_some() && gemm_reads_x4(x_stride, w.k)) {
            (GemmInput::F32(_), false) => XRead::F32,
            (GemmInput::F32(_), true) => XRead::X4,
            (GemmInput::F16(_), true) => XRead::F16,
            (GemmInput::F16(_), false) => {
                return Err(Error::gpu(format!(
                    "{}: f16 activations need cooperative matrices and rows of whole vec4s",
                    shader.name
                )))
            }
        };
        let f16_out = matches!(mode, GemmMode::NormSwiglu { f16_out: true, .. });
        if f16_out
            && (coop.is_none() || split.is_some() || !gemm_writes_f16(w, out_off, out_stride))
        {
            return Err(Error::gpu(format!(
                "{}: f16 outputs need an unsplit GEMM on cooperative matrices and rows in pairs",
                shader.name
            )));
        }
        let variant = gemm_variant(w.dtype, defines, coop, read, f16_out)?;
        let xb = x.buffer();
        let bound = match mode.norm() {
            Some((nw, _)) => gpu.bind(shader, &variant, &[&c.buf, xb, nw, out], &params)?,
            None => gpu.bind(shader, &variant, &[&c.buf, xb, out], &params)?,
        };
        let [across, down] = tiles(coop.map_or(GEMM_TILE, CoopTile::size));
        ds.push(Dispatch {
            bound,
            groups: [across as u32, down as u32, ways as u32],
        });
    }
    Ok(ds)
}

/// The tile of an unsplit GEMM on cooperative matrices that has `tiles(t)`
/// tiles of each size for `n` tokens: BIG, else WIDE, where they fit
/// (`Capabilities::coop_wide`) and make at least [`GEMM_WIDE_MIN_TILES`]
/// (BIG: padding no more tokens than WIDE); else the narrow one.
fn coop_tile(gpu: &Gpu, tiles: impl Fn(CoopTile) -> usize, n: usize) -> CoopTile {
    [CoopTile::Big, CoopTile::Wide]
        .into_iter()
        .find(|t| {
            gpu.caps.coop_wide() && tiles(*t) >= GEMM_WIDE_MIN_TILES && !pads_more_tokens(*t, n)
        })
        .unwrap_or(CoopTile::Narrow)
}

/// How a GEMM runs: its tile on cooperative matrices (None: the portable
/// kernel) and the ways it splits over k (1: not split).
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct GemmPlan {
    pub tile: Option<CoopTile>,
    pub ways: usize,
}

/// When a GEMM splits over k: into up to [`GEMM_MOST_SPLITS`] ways while
/// its tiles (of `tile`'s size on cooperative matrices) times the ways stay
/// within `workgroups`, each split at least one k-step.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct SplitRule {
    pub tile: CoopTile,
    pub workgroups: usize,
}

/// A batched decode step's GEMMs (WIDE tiles and 128 workgroups measured
/// slower: BENCHMARKS.md, thirty-sixth session).
pub const DECODE_SPLIT: SplitRule = SplitRule {
    tile: CoopTile::Narrow,
    workgroups: GEMM_SPLIT_WORKGROUPS,
};

/// The prefill's GEMMs, planned for [`PREFILL_PLAN_TOKENS`] whatever the
/// chunk: a row's sums then do not depend on the rows beside it. BIG tiles
/// against WIDE and narrow ones, 96 to 512 workgroups: BENCHMARKS.md,
/// thirty-sixth session.
pub const PREFILL_SPLIT: SplitRule = SplitRule {
    tile: CoopTile::Big,
    workgroups: 128,
};

/// The tokens a prefill's GEMMs are planned for (a prompt chunk's).
pub const PREFILL_PLAN_TOKENS: usize = 512;

/// Tiles of `tile`'s size over `cols` output columns and `n` tokens.
fn tile_count(tile: (usize, usize), cols: usize, n: usize) -> usize {
    cols.div_ceil(tile.0) * n.div_ceil(tile.1)
}

/// The tile `rule` splits in on cooperative matrices for `n` tokens: its
/// own where the adapter has it (BIG: where it pads no more tokens than
/// WIDE), else the next smaller.
fn split_tile(gpu: &Gpu, rule: SplitRule, n: usize) -> CoopTile {
    let wide = gpu.caps.coop_wide();
    match rule.tile {
        CoopTile::Big if wide && !pads_more_tokens(CoopTile::Big, n) => CoopTile::Big,
        CoopTile::Big | CoopTile::Wide if wide => CoopTile::Wide,
        _ => CoopTile::Narrow,
    }
}

/// The plan of a product of `cols` output columns (a matrix's rows, every
/// part) over `k` for `n` tokens on `kernel`, split as `rule` says (the
/// portable kernel in its one tile; [`GemmKernel::CoopTiles`] in its own).
pub fn gemm_plan(
    gpu: &Gpu,
    kernel: GemmKernel,
    rule: SplitRule,
    cols: usize,
    k: usize,
    n: usize,
) -> GemmPlan {
    let ways = |tile: (usize, usize)| {
        let steps = k.div_ceil(kernel.k_step());
        (rule.workgroups / tile_count(tile, cols, n).max(1))
            .clamp(1, GEMM_MOST_SPLITS.min(steps.max(1)))
    };
    match kernel {
        GemmKernel::Portable => GemmPlan {
            tile: None,
            ways: ways(GEMM_TILE),
        },
        GemmKernel::CoopTiles(tile) => GemmPlan {
            tile: Some(tile),
            ways: ways(tile.size()),
        },
        GemmKernel::Coop => {
            let split_tile = split_tile(gpu, rule, n);
            match ways(split_tile.size()) {
                1 => GemmPlan {
                    tile: Some(coop_tile(gpu, |t| tile_count(t.size(), cols, n), n)),
                    ways: 1,
                },
                w => GemmPlan {
                    tile: Some(split_tile),
                    ways: w,
                },
            }
        }
    }
}

/// Workgroups a GEMM of few tiles is split into over k ([`gemm_split`]):
/// about two per multiprocessor of a large GPU (132 on the H100 and H200;
/// 256 against 64, 128 and 512 in BENCHMARKS.md).
const GEMM_SPLIT_WORKGROUPS: usize = 256;
/// The most ways it splits.
pub const GEMM_MOST_SPLITS: usize = 16;

/// The f32s of the `part` buffer [`gemm_split`] needs for `plan` of a
/// product of `cols` output columns over `k` for `n` tokens on `kernel`
/// (0 where it does not split).
pub fn gemm_split_len(
    kernel: GemmKernel,
    plan: GemmPlan,
    cols: usize,
    k: usize,
    n: usize,
) -> usize {
    match plan.ways {
        1 => 0,
        ways => gemm_split_span(kernel, k, ways).1 * n * (cols + 1),
    }
}

/// The k each workgroup of a GEMM over `k` split about `splits` ways on
/// `kernel` sums (whole steps of it), and the ways that makes (the last
/// span may be short).
pub fn gemm_split_span(kernel: GemmKernel, k: usize, splits: usize) -> (usize, usize) {
    let step = kernel.k_step();
    let span = k.div_ceil(splits).div_ceil(step) * step;
    (span, k.div_ceil(span))
}

/// [`gemm`], or [`gemm_split`] where `plan` splits it (into `part`, of
/// [`gemm_split_len`] f32s at least).
#[allow(clippy::too_many_arguments)]
pub fn gemm_planned<'a>(
    gpu: &Gpu,
    kernel: GemmKernel,
    w: &GpuMatrix,
    mode: GemmMode,
    x: impl Into<GemmInput<'a>>,
    x_stride: usize,
    y: &wgpu::Buffer,
    y_stride: usize,
    out_off: usize,
    n: usize,
    part: &wgpu::Buffer,
    plan: GemmPlan,
) -> Result<Vec<Dispatch>> {
    if plan.ways < 2 {
        return gemm(gpu, kernel, w, mode, x, x_stride, y, y_stride, out_off, n);
    }
    gemm_split(
        gpu, kernel, w, mode, x, x_stride, y, y_stride, out_off, n, part, plan,
    )
}

/// [`gemm`] split over k `plan.ways` ways (at least 2) in `plan.tile`'s
/// tiles on cooperative matrices: each split's sums go to
/// `part` ([splits, n, parts x rows], with a norm then each split's sums of
/// squares, [splits, n]: [`gemm_split_len`] f32s), then one pass adds
/// them, in order, and finishes the mode's epilogue into y. For GEMMs of
/// few tiles, whose workgroups would otherwise leave most of a large GPU
/// idle.
#[allow(clippy::too_many_arguments)]
pub fn gemm_split<'a>(
    gpu: &Gpu,
    kernel: GemmKernel,
    w: &GpuMatrix,
    mode: GemmMode,
    x: impl Into<GemmInput<'a>>,
    x_stride: usize,
    y: &wgpu::Buffer,
    y_stride: usize,
    out_off: usize,
    n: usize,
    part: &wgpu::Buffer,
    plan: GemmPlan,
) -> Result<Vec<Dispatch>> {
    assert!(plan.ways >= 2, "gemm_split: {} ways", plan.ways);
    let (span, splits) = gemm_split_span(kernel, w.k, plan.ways);
    // The output's columns: every part side by side, as `part` holds them.
    let cols = w.rows * w.parts;
    let mut out = gemm_chunks(
        gpu,
        kernel,
        w,
        mode,
        mode.split_kernel(),
        x.into(),
        x_stride,
        part,
        cols,
        0,
        n,
        Some(KSpan {
            span,
            ways: splits,
            tile: plan.tile.unwrap_or(CoopTile::Narrow),
        }),
    )?;
    let params = SplitSumParams {
        cols: cols as u32,
        n: n as u32,
        splits: splits as u32,
        y_stride: y_stride as u32,
        out_off: out_off as u32,
        part_rows: w.rows as u32,
        k: w.k as u32,
        eps: mode.norm().map_or(0.0, |(_, eps)| eps),
        _pad: [0; 4],
    };
    let v4 = split_sum_in_vec4s(cols, out_off, y_stride);
    let (bound, outputs) = match mode {
        GemmMode::AddShadow { yh } if v4 => {
            let variant = Variant::new(&["SHADOW", "V4"]);
            let bound = gpu.bind(&GEMM_SPLIT_SUM_SHADOW, &variant, &[part, y, yh], &params)?;
            (bound, cols / 4)
        }
        GemmMode::AddShadow { .. } => {
            return Err(Error::gpu(format!(
            "gemm_split: an f16 copy needs columns in fours, got {cols} at {out_off} of {y_stride}"
        )))
        }
        GemmMode::Add | GemmMode::Norm { .. } if v4 => {
            let variant = Variant::new(match mode.norm() {
                Some(_) => &["NORM", "V4"],
                None => &["V4"],
            });
            let bound = gpu.bind(&GEMM_SPLIT_SUM, &variant, &[part, y], &params)?;
            (bound, cols / 4)
        }
        _ => {
            let variant = Variant::new(GEMM_SPLIT_SUM_DEFINES[mode.epilogue()]);
            let bound = gpu.bind(&GEMM_SPLIT_SUM, &variant, &[part, y], &params)?;
            let outputs = match mode {
                GemmMode::NormSwiglu { .. } => w.rows,
                _ => cols,
            };
            (bound, outputs)
        }
    };
    out.push(Dispatch {
        bound,
        groups: [outputs.div_ceil(64) as u32, n as u32, 1],
    });
    Ok(out)
}

/// Compiles the prefill GEMMs for weights of `t` ahead of their first use
/// (of the gated epilogues, the one of `act`; on cooperative matrices when
/// `coop`; there, split over k too).
pub fn warm_gemm(gpu: &Gpu, t: GgmlType, act: FfnAct, coop: bool) -> Result<()> {
    let skip = match act {
        FfnAct::Silu => GEMM_NORM_GEGLU.name,
        FfnAct::GeluTanh => GEMM_NORM_SWIGLU.name,
    };
    if coop {
        // The real models' narrow GEMMs split over k: in the prefill's
        // tile, over rows of vec4s or f16 pairs, and the sums that end them
        // (four outputs a thread; the gated one's scalar).
        let tile = split_tile(gpu, PREFILL_SPLIT, PREFILL_PLAN_TOKENS);
        let splits = [
            (&GEMM_ADD_SPLIT, &["ADD", "SPLIT"][..]),
            (&GEMM_NORM_SPLIT, &["NORM", "SPLIT"]),
            (&GEMM_NORM_SWIGLU_SPLIT, &["NORM", "SWIGLU", "SPLIT"]),
        ];
        for (kernel, defines) in splits {
            for read in [XRead::X4, XRead::F16] {
                gpu.pipeline(kernel, &gemm_variant(t, defines, Some(tile), read, false)?)?;
            }
        }
        let gated: &[&str] = match act {
            FfnAct::Silu => &["NORM", "SWIGLU"],
            FfnAct::GeluTanh => &["NORM", "SWIGLU", "GELU"],
        };
        for defines in [&["V4"][..], &["NORM", "V4"], gated] {
            gpu.pipeline(&GEMM_SPLIT_SUM, &Variant::new(defines))?;
        }
        gpu.pipeline(&GEMM_SPLIT_SUM_SHADOW, &Variant::new(&["SHADOW", "V4"]))?;
    }
    for (kernel, defines) in GEMM_EPILOGUES.iter().filter(|(k, _)| k.name != skip) {
        if !coop {
            gpu.pipeline(kernel, &gemm_variant(t, defines, None, XRead::F32, false)?)?;
            continue;
        }
        // The models' activation rows are whole vec4s: X4, or f16 pairs
        // (XH); the gated GEMMs' outputs f32 or f16 pairs (YH).
        let outs: &[bool] = match defines.contains(&"SWIGLU") {
            true => &[false, true],
            false => &[false],
        };
        let tiles: &[CoopTile] = match gpu.caps.coop_wide() {
            true => &[CoopTile::Narrow, CoopTile::Wide, CoopTile::Big],
            false => &[CoopTile::Narrow],
        };
        for read in [XRead::X4, XRead::F16] {
            for &f16_out in outs {
                for &tile in tiles {
                    let v = gemm_variant(t, defines, Some(tile), read, f16_out)?;
                    gpu.pipeline(kernel, &v)?;
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- embedding

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbeddingParams {
    k: u32,
    n: u32,
    row0: u32,
    rows: u32,
    d_off: u32,
    tok_off: u32,
    scale: f32,
    tok_stride: u32,
}
const _: () = assert!(std::mem::size_of::<EmbeddingParams>() == 32);

format_kernel!(
    EMBEDDING,
    "embedding",
    "embedding.wgsl",
    [
        Binding::read("w"),
        Binding::read("tokens"),
        Binding::write("y")
    ],
    EmbeddingParams,
    []
);

/// `y[t]` = scale * table[tokens[tok_off + t tok_stride]] for `n` tokens
/// (checked against the vocabulary by the caller); one dispatch per chunk of
/// the table.
#[allow(clippy::too_many_arguments)]
pub fn embedding(
    gpu: &Gpu,
    table: &GpuMatrix,
    tokens: &wgpu::Buffer,
    tok_off: usize,
    tok_stride: usize,
    scale: f32,
    y: &wgpu::Buffer,
    n: usize,
) -> Result<Vec<Dispatch>> {
    let variant = format_variant(table.dtype, &[])?;
    let mut out = Vec::with_capacity(table.chunks.len());
    for c in &table.chunks {
        let params = EmbeddingParams {
            k: table.k as u32,
            n: n as u32,
            row0: c.row0 as u32,
            rows: c.rows as u32,
            d_off: c.d_off,
            tok_off: tok_off as u32,
            scale,
            tok_stride: tok_stride as u32,
        };
        out.push(Dispatch {
            bound: gpu.bind(&EMBEDDING, &variant, &[&c.buf, tokens, y], &params)?,
            groups: groups_1d(n, 1),
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------- qk_rope

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct QkRopeParams {
    heads: u32,
    kv_heads: u32,
    hd: u32,
    half: u32,
    interleaved: u32,
    n: u32,
    eps: f32,
    qkv_stride: u32,
}
const _: () = assert!(std::mem::size_of::<QkRopeParams>() == 32);

kernel!(
    QK_ROPE,
    "qk_rope",
    "qk_rope.wgsl",
    [
        Binding::read("qkv"),
        Binding::read("prep"),
        Binding::read("cs"),
        Binding::read("step"),
        Binding::write("q_out"),
        Binding::write("kc"),
        Binding::write("vc")
    ],
    QkRopeParams,
    [&[], &["QK_NORM"], &["BIAS"], &["BIAS", "QK_NORM"]]
);
kernel!(
    QK_ROPE_ROWS,
    "qk_rope_rows",
    ["paged_cache.wgsl", "qk_rope.wgsl"],
    [
        Binding::read("qkv"),
        Binding::read("prep"),
        Binding::read("cs"),
        Binding::read("step"),
        Binding::write("q_out"),
        Binding::write("kc"),
        Binding::write("vc")
    ],
    QkRopeParams,
    [
        &["ROWS"],
        &["QK_NORM", "ROWS"],
        &["BIAS", "ROWS"],
        &["BIAS", "QK_NORM", "ROWS"]
    ]
);

/// What [`qk_rope`] adds to and multiplies the new queries and keys by, in
/// one buffer: [q norm weights | k norm weights | q, k and v biases as one
/// qkv row], the parts there are.
pub struct HeadConsts {
    pub buffer: wgpu::Buffer,
    pub norms: bool,
    pub bias: bool,
}

impl HeadConsts {
    /// None when there is neither a norm nor a bias.
    pub fn upload(
        gpu: &Gpu,
        norms: Option<(&[f32], &[f32])>,
        bias: Option<&[f32]>,
    ) -> Result<Option<HeadConsts>> {
        if norms.is_none() && bias.is_none() {
            return Ok(None);
        }
        let mut v = Vec::new();
        if let Some((q, k)) = norms {
            if q.len() != k.len() {
                return Err(Error::invalid(format!(
                    "q norm of {} weights, k norm of {}",
                    q.len(),
                    k.len()
                )));
            }
            v.extend_from_slice(q);
            v.extend_from_slice(k);
        }
        v.extend_from_slice(bias.unwrap_or_default());
        Ok(Some(HeadConsts {
            buffer: gpu.upload_f32("head consts", &v)?,
            norms: norms.is_some(),
            bias: bias.is_some(),
        }))
    }

    /// The defines of qk_rope.wgsl and flash_attention.wgsl's PREP for the
    /// parts there are.
    fn defines(&self) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.bias {
            d.push("BIAS");
        }
        if self.norms {
            d.push("QK_NORM");
        }
        d
    }
}

/// Largest head the attention kernels hold in workgroup memory.
pub const MAX_HEAD_DIM: usize = 256;

/// The GPU buffers of one attention layer's sequence state and the per-call
/// inputs every attention kernel reads.
pub struct AttnBuffers<'a> {
    /// [token, pos0, kv_len, splits] as u32
    pub step: &'a wgpu::Buffer,
    /// [positions, kv_heads * head_dim]
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
}

/// The biases and q/k norms in `consts` (where there are any), RoPE by the
/// angles in `cs` ([n, rope_dim / 2, 2], cpu::rope_table), q -> q_out, k
/// and v into the caches at rows pos0 + t.
#[allow(clippy::too_many_arguments)]
pub fn qk_rope(
    gpu: &Gpu,
    s: &AttnShape,
    qkv: &wgpu::Buffer,
    consts: Option<&HeadConsts>,
    cs: &wgpu::Buffer,
    kv: &AttnBuffers,
    q_out: &wgpu::Buffer,
    n: usize,
) -> Result<Dispatch> {
    qk_rope_impl(gpu, s, qkv, consts, cs, kv, q_out, n, false)
}

/// [`qk_rope`] for `n` decode rows of a batch, each of its own sequence:
/// `kv.step` holds a row record per row ([`ROW_RECORD`]), which says where
/// in the (shared, per-slot) caches the row's key and value go; `cs` holds
/// each row's angles.
#[allow(clippy::too_many_arguments)]
pub fn qk_rope_rows(
    gpu: &Gpu,
    s: &AttnShape,
    qkv: &wgpu::Buffer,
    consts: Option<&HeadConsts>,
    cs: &wgpu::Buffer,
    kv: &AttnBuffers,
    q_out: &wgpu::Buffer,
    n: usize,
) -> Result<Dispatch> {
    qk_rope_impl(gpu, s, qkv, consts, cs, kv, q_out, n, true)
}

#[allow(clippy::too_many_arguments)]
fn qk_rope_impl(
    gpu: &Gpu,
    s: &AttnShape,
    qkv: &wgpu::Buffer,
    consts: Option<&HeadConsts>,
    cs: &wgpu::Buffer,
    kv: &AttnBuffers,
    q_out: &wgpu::Buffer,
    n: usize,
    rows: bool,
) -> Result<Dispatch> {
    assert!(s.head_dim <= 512, "qk_rope: head_dim {} > 512", s.head_dim);
    let params = QkRopeParams {
        heads: s.heads as u32,
        kv_heads: s.kv_heads as u32,
        hd: s.head_dim as u32,
        half: (s.rope_dim / 2) as u32,
        interleaved: (s.rope_style == RopeStyle::Interleaved) as u32,
        n: n as u32,
        eps: s.eps,
        qkv_stride: ((s.heads + 2 * s.kv_heads) * s.head_dim) as u32,
    };
    let mut defines = consts.map_or_else(Vec::new, HeadConsts::defines);
    if rows {
        defines.push("ROWS");
    }
    let bound = gpu.bind(
        if rows { &QK_ROPE_ROWS } else { &QK_ROPE },
        &Variant::new(&defines),
        &[
            qkv,
            consts.map_or(qkv, |c| &c.buffer),
            cs,
            kv.step,
            q_out,
            kv.k_cache,
            kv.v_cache,
        ],
        &params,
    )?;
    Ok(Dispatch {
        bound,
        groups: [(s.heads + s.kv_heads) as u32, n as u32, 1],
    })
}

// ---------------------------------------------------------------- attention

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AttentionParams {
    heads: u32,
    kv_heads: u32,
    hd: u32,
    n_q: u32,
    scale: f32,
    kv_stride: u32,
    window: u32,
    /// ROWS: splits per head the partial-result buffer holds.
    part_splits: u32,
    /// flash_attention_prep: qk_rope's rotated pairs a head, pair layout
    /// and norm epsilon.
    half: u32,
    interleaved: u32,
    eps: f32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<AttentionParams>() == 48);

impl AttentionParams {
    /// `n_q` queries of shape `s` against caches of kv_heads * head_dim a row.
    fn new(s: &AttnShape, n_q: usize) -> AttentionParams {
        AttentionParams {
            heads: s.heads as u32,
            kv_heads: s.kv_heads as u32,
            hd: s.head_dim as u32,
            n_q: n_q as u32,
            scale: s.scale,
            kv_stride: (s.kv_heads * s.head_dim) as u32,
            window: s.window as u32,
            part_splits: 0,
            half: (s.rope_dim / 2) as u32,
            interleaved: (s.rope_style == RopeStyle::Interleaved) as u32,
            eps: s.eps,
            _pad: 0,
        }
    }
}

kernel!(
    FLASH_ATTENTION,
    "flash_attention",
    ["attention_params.wgsl", "flash_attention.wgsl"],
    [
        Binding::read("q"),
        Binding::read("kc"),
        Binding::read("vc"),
        Binding::read("step"),
        Binding::write("out"),
        Binding::write("part")
    ],
    AttentionParams,
    [&[], &["SUBGROUPS"], &["K4"], &["K4", "SUBGROUPS"]]
);

kernel!(
    FLASH_ATTENTION_PREP,
    "flash_attention_prep",
    ["attention_params.wgsl", "flash_attention.wgsl"],
    [
        Binding::read("qkv"),
        Binding::write("kc"),
        Binding::write("vc"),
        Binding::read("step"),
        Binding::write("out"),
        Binding::write("part"),
        Binding::read("prep"),
        Binding::read("cs")
    ],
    AttentionParams,
    [
        &["PREP"],
        &["PREP", "QK_NORM"],
        &["PREP", "BIAS"],
        &["PREP", "BIAS", "QK_NORM"],
        &["PREP", "K4"],
        &["PREP", "K4", "QK_NORM"],
        &["PREP", "BIAS", "K4"],
        &["PREP", "BIAS", "K4", "QK_NORM"],
        &["PREP", "SUBGROUPS"],
        &["PREP", "QK_NORM", "SUBGROUPS"],
        &["PREP", "BIAS", "SUBGROUPS"],
        &["PREP", "BIAS", "QK_NORM", "SUBGROUPS"],
        &["PREP", "K4", "SUBGROUPS"],
        &["PREP", "K4", "QK_NORM", "SUBGROUPS"],
        &["PREP", "BIAS", "K4", "SUBGROUPS"],
        &["PREP", "BIAS", "K4", "QK_NORM", "SUBGROUPS"]
    ]
);

kernel!(
    FLASH_ATTENTION_ROWS,
    "flash_attention_rows",
    [
        "attention_params.wgsl",
        "paged_cache.wgsl",
        "flash_attention.wgsl"
    ],
    [
        Binding::read("q"),
        Binding::read("kc"),
        Binding::read("vc"),
        Binding::read("step"),
        Binding::write("out"),
        Binding::write("part")
    ],
    AttentionParams,
    [
        &["ROWS"],
        &["ROWS", "SUBGROUPS"],
        &["ROWS", "K4"],
        &["ROWS", "K4", "SUBGROUPS"]
    ]
);

kernel!(
    FLASH_ATTENTION_MERGE_ROWS,
    "flash_attention_merge_rows",
    ["attention_params.wgsl", "flash_attention_merge.wgsl"],
    [
        Binding::read("part"),
        Binding::read("step"),
        Binding::write("out")
    ],
    AttentionParams,
    [&["ROWS"]]
);

kernel!(
    FLASH_ATTENTION_MERGE,
    "flash_attention_merge",
    ["attention_params.wgsl", "flash_attention_merge.wgsl"],
    [
        Binding::read("part"),
        Binding::read("step"),
        Binding::write("out")
    ],
    AttentionParams,
    [&[]]
);

/// Most splits of the key/value positions per head in decode.
pub const MAX_SPLITS: usize = 128;
/// Positions per split before decode attention splits further: one
/// 64-key block per workgroup, so even short contexts spread over the GPU.
const SPLIT_LEN: usize = 64;

/// How many workgroups per head decode attention spreads `kv_len` positions
/// over (flash-decode): long contexts use more of the GPU.
pub fn attention_splits(kv_len: usize) -> usize {
    kv_len.div_ceil(SPLIT_LEN).clamp(1, MAX_SPLITS)
}

/// Floats of [`flash_attention_rows`]' partial-result buffer for `n` rows
/// of at most `max_splits` splits.
pub fn attention_rows_part_len(
    heads: usize,
    head_dim: usize,
    n: usize,
    max_splits: usize,
) -> usize {
    n * heads * max_splits * (head_dim + 2)
}

/// Floats of the partial-result buffer for `n_q` queries of `heads` heads.
pub fn attention_part_len(heads: usize, head_dim: usize, n_q: usize) -> usize {
    n_q * heads * MAX_SPLITS * (head_dim + 2)
}

/// Causal attention of `n_q` queries (q: [n_q, heads * head_dim]) against
/// the caches; kv_len and splits come from the step buffer. Record with
/// `[splits, heads, n_q]` workgroups, then, when splits > 1, the merge.
pub struct Attention {
    pub main: Bound,
    pub merge: Bound,
    pub heads: u32,
    /// Workgroups a split of a query takes: one per [`query_heads_together`]
    /// heads.
    pub head_groups: u32,
    pub n_q: u32,
}

/// flash_attention's variant: `base`, with subgroup reductions where the
/// adapter has them, the keys read a vec4 at a time where every key row
/// and head starts at a multiple of 4 (K4), and [`query_heads_together`]
/// heads a workgroup (GQ; both: BENCHMARKS.md, thirty-seventh session).
/// Also the workgroups that makes for a split of a query.
fn attention_variant(base: &[&'static str], subgroups: bool, s: &AttnShape) -> (Variant, u32) {
    let mut defines = base.to_vec();
    if subgroups {
        defines.push("SUBGROUPS");
    }
    if s.head_dim.is_multiple_of(4) {
        defines.push("K4");
    }
    let together = query_heads_together(s);
    let variant = Variant::new(&defines).with("GQ", together as u32);
    (variant, (s.heads / together) as u32)
}

/// Most query heads one decode attention workgroup computes together.
const MOST_HEADS_TOGETHER: usize = 8;

/// How many query heads of one key head a decode attention workgroup
/// computes together, reading each key and value once for all of them: the
/// largest divisor of the heads a key head serves up to
/// [`MOST_HEADS_TOGETHER`].
pub fn query_heads_together(s: &AttnShape) -> usize {
    let group = s.heads / s.kv_heads.max(1);
    (1..=group.min(MOST_HEADS_TOGETHER))
        .rev()
        .find(|g| group.is_multiple_of(*g))
        .unwrap_or(1)
}

impl Attention {
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, splits: usize) {
        self.record_with(pass, splits, &mut |_, _| {});
    }

    /// As [`Attention::record`], calling `after` after each dispatch with its
    /// kernel name (the profiler writes timestamps there).
    pub fn record_with(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        splits: usize,
        after: &mut dyn FnMut(&mut wgpu::ComputePass<'_>, &'static str),
    ) {
        self.main
            .record(pass, [splits as u32, self.head_groups, self.n_q]);
        after(pass, self.main.name);
        if splits > 1 {
            self.merge.record(pass, [self.heads, self.n_q, 1]);
            after(pass, self.merge.name);
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn flash_attention(
    gpu: &Gpu,
    subgroups: bool,
    s: &AttnShape,
    q: &wgpu::Buffer,
    kv: &AttnBuffers,
    out: &wgpu::Buffer,
    part: &wgpu::Buffer,
    n_q: usize,
) -> Result<Attention> {
    head_dim_fits(s)?;
    let params = AttentionParams::new(s, n_q);
    let (variant, head_groups) = attention_variant(&[], subgroups, s);
    let main = gpu.bind(
        &FLASH_ATTENTION,
        &variant,
        &[q, kv.k_cache, kv.v_cache, kv.step, out, part],
        &params,
    )?;
    with_merge(gpu, main, head_groups, s, &params, kv, out, part)
}

/// Whether the attention kernels hold heads of this size.
fn head_dim_fits(s: &AttnShape) -> Result<()> {
    if s.head_dim > MAX_HEAD_DIM {
        return Err(Error::gpu(format!(
            "attention heads of {} dimensions (the GPU kernels hold at most {MAX_HEAD_DIM})",
            s.head_dim
        )));
    }
    Ok(())
}

/// A single sequence's attention: `main`, then (when split) the merge of
/// its partial results from `part` into `out`.
#[allow(clippy::too_many_arguments)]
fn with_merge(
    gpu: &Gpu,
    main: Bound,
    head_groups: u32,
    s: &AttnShape,
    params: &AttentionParams,
    kv: &AttnBuffers,
    out: &wgpu::Buffer,
    part: &wgpu::Buffer,
) -> Result<Attention> {
    let merge = gpu.bind(
        &FLASH_ATTENTION_MERGE,
        &Variant::default(),
        &[part, kv.step, out],
        params,
    )?;
    Ok(Attention {
        main,
        merge,
        heads: s.heads as u32,
        head_groups,
        n_q: params.n_q,
    })
}

/// Decode attention of one new token with [`qk_rope`]'s work done in the
/// same dispatch: its query heads made from the projections' row `qkv`, its
/// key and value written to the caches at position kv_len - 1 (`cs`: that
/// position's angles), then [`flash_attention`] of it (`out`, or `part` and
/// the merge). One dependent dispatch a layer fewer. None where a key head
/// serves more query heads than one workgroup computes together: then
/// [`qk_rope`] and [`flash_attention`] do the work.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_prep(
    gpu: &Gpu,
    subgroups: bool,
    s: &AttnShape,
    qkv: &wgpu::Buffer,
    consts: Option<&HeadConsts>,
    cs: &wgpu::Buffer,
    kv: &AttnBuffers,
    out: &wgpu::Buffer,
    part: &wgpu::Buffer,
) -> Result<Option<Attention>> {
    head_dim_fits(s)?;
    if query_heads_together(s) * s.kv_heads != s.heads {
        return Ok(None);
    }
    let mut base = consts.map_or_else(Vec::new, HeadConsts::defines);
    base.push("PREP");
    let params = AttentionParams::new(s, 1);
    let (variant, head_groups) = attention_variant(&base, subgroups, s);
    let main = gpu.bind(
        &FLASH_ATTENTION_PREP,
        &variant,
        &[
            qkv,
            kv.k_cache,
            kv.v_cache,
            kv.step,
            out,
            part,
            consts.map_or(qkv, |c| &c.buffer),
            cs,
        ],
        &params,
    )?;
    with_merge(gpu, main, head_groups, s, &params, kv, out, part).map(Some)
}

/// [`flash_attention`] for `n` decode rows of a batch, each of its own
/// sequence: `kv.step` holds a row record per row ([`ROW_RECORD`]: its
/// kv_len, splits and slot), `part` [`attention_rows_part_len`] of n and
/// `max_splits` (the most any row may have). Record with the most splits of
/// any row; each row comes out as [`flash_attention`] computes it alone.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_rows(
    gpu: &Gpu,
    subgroups: bool,
    s: &AttnShape,
    q: &wgpu::Buffer,
    kv: &AttnBuffers,
    out: &wgpu::Buffer,
    part: &wgpu::Buffer,
    n: usize,
    max_splits: usize,
) -> Result<Attention> {
    head_dim_fits(s)?;
    assert!(
        (1..=MAX_SPLITS).contains(&max_splits),
        "flash_attention_rows: {max_splits} splits"
    );
    let params = AttentionParams {
        part_splits: max_splits as u32,
        ..AttentionParams::new(s, n)
    };
    let (variant, head_groups) = attention_variant(&["ROWS"], subgroups, s);
    let main = gpu.bind(
        &FLASH_ATTENTION_ROWS,
        &variant,
        &[q, kv.k_cache, kv.v_cache, kv.step, out, part],
        &params,
    )?;
    let merge = gpu.bind(
        &FLASH_ATTENTION_MERGE_ROWS,
        &Variant::new(&["ROWS"]),
        &[part, kv.step, out],
        &params,
    )?;
    Ok(Attention {
        main,
        merge,
        heads: s.heads as u32,
        head_groups,
        n_q: n as u32,
    })
}

kernel!(
    PREFILL_ATTENTION,
    "prefill_attention",
    ["attention_params.wgsl", "prefill_attention.wgsl"],
    [
        Binding::read("q"),
        Binding::read("kc"),
        Binding::read("vc"),
        Binding::read("step"),
        Binding::write("out")
    ],
    AttentionParams,
    [&COOP]
);

kernel!(
    PREFILL_ATTENTION_ROWS,
    "prefill_attention_rows",
    [
        "attention_params.wgsl",
        "paged_cache.wgsl",
        "prefill_attention.wgsl"
    ],
    [
        Binding::read("q"),
        Binding::read("kc"),
        Binding::read("vc"),
        Binding::read("step"),
        Binding::write("out")
    ],
    AttentionParams,
    [&["COOP", "F16", "SUBGROUPS", "ROWS"]]
);

/// Head size and queries per workgroup of prefill_attention.wgsl.
const PREFILL_ATTENTION_HEAD_DIM: usize = 64;
pub const PREFILL_ATTENTION_QUERIES: usize = 64;

/// Causal attention of `n_q` prefill queries on cooperative matrices
/// (kv_len from the step buffer), or None where that kernel does not apply
/// (no cooperative matrices, or heads other than 64 wide): then
/// [`flash_attention`] does the work.
pub fn prefill_attention(
    gpu: &Gpu,
    s: &AttnShape,
    q: &wgpu::Buffer,
    kv: &AttnBuffers,
    out: &wgpu::Buffer,
    n_q: usize,
) -> Result<Option<Dispatch>> {
    prefill_attention_impl(gpu, s, q, kv, out, n_q, None)
}

/// [`prefill_attention`] over the prompt chunks of several sequences, `n_q`
/// queries in all, each sequence over its own slot of the caches: `kv.step`
/// holds a [`PrefillRows`] table. Recorded with `tiles` workgroups a head
/// (at least the table's blocks); each query comes out as the single kernel
/// computes it for its sequence's chunk alone. None where the single kernel
/// would not run.
pub fn prefill_attention_rows(
    gpu: &Gpu,
    s: &AttnShape,
    q: &wgpu::Buffer,
    kv: &AttnBuffers,
    out: &wgpu::Buffer,
    n_q: usize,
    tiles: usize,
) -> Result<Option<Dispatch>> {
    prefill_attention_impl(gpu, s, q, kv, out, n_q, Some(tiles))
}

fn prefill_attention_impl(
    gpu: &Gpu,
    s: &AttnShape,
    q: &wgpu::Buffer,
    kv: &AttnBuffers,
    out: &wgpu::Buffer,
    n_q: usize,
    tiles: Option<usize>,
) -> Result<Option<Dispatch>> {
    if !gpu.caps.coop_matrix || s.head_dim != PREFILL_ATTENTION_HEAD_DIM {
        return Ok(None);
    }
    let params = AttentionParams::new(s, n_q);
    let mut defines = COOP.to_vec();
    let kernel = match tiles {
        Some(_) => {
            defines.push("ROWS");
            &PREFILL_ATTENTION_ROWS
        }
        None => &PREFILL_ATTENTION,
    };
    let bound = gpu.bind(
        kernel,
        &Variant::new(&defines),
        &[q, kv.k_cache, kv.v_cache, kv.step, out],
        &params,
    )?;
    let across = tiles.unwrap_or(n_q.div_ceil(PREFILL_ATTENTION_QUERIES));
    Ok(Some(Dispatch {
        bound,
        groups: [across as u32, s.heads as u32, 1],
    }))
}

// ---------------------------------------------------------------- short_conv

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ShortConvParams {
    hidden: u32,
    n: u32,
    taps: u32,
    ring: u32,
}
const _: () = assert!(std::mem::size_of::<ShortConvParams>() == 16);

kernel!(
    SHORT_CONV,
    "short_conv",
    "short_conv.wgsl",
    [
        Binding::read("bcx"),
        Binding::read("conv"),
        Binding::write("state"),
        Binding::read("step"),
        Binding::write("y")
    ],
    ShortConvParams,
    [&[]]
);

kernel!(
    SHORT_CONV_ROWS,
    "short_conv_rows",
    ["paged_cache.wgsl", "short_conv.wgsl"],
    [
        Binding::read("bcx"),
        Binding::read("conv"),
        Binding::write("state"),
        Binding::read("step"),
        Binding::write("y"),
        Binding::write("hist")
    ],
    ShortConvParams,
    [&["ROWS"]]
);

/// Tokens per short_conv workgroup (`TOK` in short_conv.wgsl).
pub const SHORT_CONV_TOKENS: usize = 16;

/// LFM2's gated short convolution over `n` tokens at positions `step[1]`..:
/// bcx [n, 3 hidden] -> y [n, hidden], continuing from and updating the ring
/// `state` [ring, hidden], ring >= taps (short_conv.wgsl).
#[allow(clippy::too_many_arguments)]
pub fn short_conv(
    gpu: &Gpu,
    bcx: &wgpu::Buffer,
    conv: &wgpu::Buffer,
    state: &wgpu::Buffer,
    step: &wgpu::Buffer,
    y: &wgpu::Buffer,
    hidden: usize,
    taps: usize,
    ring: usize,
    n: usize,
) -> Result<Dispatch> {
    let bound = short_conv_bind(
        gpu,
        &[bcx, conv, state, step, y],
        hidden,
        taps,
        ring,
        n,
        false,
    )?;
    Ok(Dispatch {
        bound,
        groups: [
            hidden.div_ceil(64) as u32,
            n.div_ceil(SHORT_CONV_TOKENS) as u32,
            1,
        ],
    })
}

/// [`short_conv`] over the prompt chunks of several sequences, `n` rows in
/// all, each sequence at its own positions with its own ring in `state`
/// ([slots * ring, hidden]): `step` holds a [`PrefillRows`] table. Recorded
/// with `tiles` token blocks (at least the table's); each sequence's rows
/// and ring come out as [`short_conv`] computes them for it alone. The last
/// `taps - 1` gated inputs of every KV cache block the rows fill go to
/// `hist` ([blocks, taps - 1, hidden], by the block's id).
#[allow(clippy::too_many_arguments)]
pub fn short_conv_rows(
    gpu: &Gpu,
    bcx: &wgpu::Buffer,
    conv: &wgpu::Buffer,
    state: &wgpu::Buffer,
    step: &wgpu::Buffer,
    y: &wgpu::Buffer,
    hist: &wgpu::Buffer,
    hidden: usize,
    taps: usize,
    ring: usize,
    n: usize,
    tiles: usize,
) -> Result<Dispatch> {
    let bufs = [bcx, conv, state, step, y, hist];
    let bound = short_conv_bind(gpu, &bufs, hidden, taps, ring, n, true)?;
    Ok(Dispatch {
        bound,
        groups: [hidden.div_ceil(64) as u32, tiles as u32, 1],
    })
}

/// Binds `bufs` (bcx, conv, state, step, y and for `rows` hist).
fn short_conv_bind(
    gpu: &Gpu,
    bufs: &[&wgpu::Buffer],
    hidden: usize,
    taps: usize,
    ring: usize,
    n: usize,
    rows: bool,
) -> Result<Bound> {
    assert!(
        ring >= taps,
        "short_conv: a ring of {ring} rows for {taps} taps"
    );
    if taps > SHORT_CONV_TOKENS + 1 {
        return Err(Error::gpu(format!(
            "short_conv: {taps} taps; the GPU kernel takes at most {}",
            SHORT_CONV_TOKENS + 1
        )));
    }
    let params = ShortConvParams {
        hidden: hidden as u32,
        n: n as u32,
        taps: taps as u32,
        ring: ring as u32,
    };
    let (kernel, variant) = if rows {
        (&SHORT_CONV_ROWS, Variant::new(&["ROWS"]))
    } else {
        (&SHORT_CONV, Variant::default())
    };
    gpu.bind(kernel, &variant, bufs, &params)
}

/// The row table of a batched prefill (the `step` binding of
/// [`short_conv_rows`] and [`prefill_attention_rows`], the row records of
/// [`qk_rope_rows`] and [`flash_attention_rows`]): the prompt chunks of
/// several sequences, one after another, `n` rows in all. u32s: a
/// [`ROW_RECORD`] per row ([slot, pos, kv_len = pos + 1, splits = 1, where
/// the sequence's KV block table starts, first ring row of the slot, the
/// sequence's first row, its past-last row]), then the first rows of the
/// attention blocks ([`PREFILL_ATTENTION_QUERIES`] rows, or fewer at a
/// sequence's end) and then of the conv blocks ([`SHORT_CONV_TOKENS`]), n
/// words each, u32::MAX past the last block; then the block tables.
pub struct PrefillRows {
    pub words: Vec<u32>,
}

/// One sequence's chunk in a [`PrefillRows`] table.
#[derive(Clone, Copy, Debug)]
pub struct RowsSegment<'a> {
    pub slot: usize,
    /// Position of its first row.
    pub pos: usize,
    pub len: usize,
    /// Its KV block table (covering pos + len positions) and the first ring
    /// row of its slot.
    pub blocks: &'a [u32],
    pub ring_row: usize,
}

impl PrefillRows {
    /// The table of `segs`, one after another.
    pub fn new(segs: &[RowsSegment]) -> PrefillRows {
        let n: usize = segs.iter().map(|s| s.len).sum();
        let mut words = vec![0u32; n * ROW_RECORD];
        let mut attn = Vec::new();
        let mut conv = Vec::new();
        let mut first = 0;
        // The tables go after the records and the two block lists.
        let mut tables = Vec::new();
        let mut table = (ROW_RECORD + 2) * n;
        for s in segs {
            let end = first + s.len;
            for i in 0..s.len {
                let r = &mut words[(first + i) * ROW_RECORD..(first + i + 1) * ROW_RECORD];
                r.copy_from_slice(&[
                    s.slot as u32,
                    (s.pos + i) as u32,
                    (s.pos + i + 1) as u32,
                    1,
                    table as u32,
                    s.ring_row as u32,
                    first as u32,
                    end as u32,
                ]);
            }
            attn.extend(
                (first..end)
                    .step_by(PREFILL_ATTENTION_QUERIES)
                    .map(|t| t as u32),
            );
            conv.extend((first..end).step_by(SHORT_CONV_TOKENS).map(|t| t as u32));
            tables.extend_from_slice(s.blocks);
            table += s.blocks.len();
            first = end;
        }
        for mut blocks in [attn, conv] {
            blocks.resize(n, u32::MAX);
            words.extend(blocks);
        }
        words.extend(tables);
        PrefillRows { words }
    }

    /// Most attention and conv blocks `n` rows of `segs` sequences make.
    pub fn most_blocks(n: usize, segs: usize) -> (usize, usize) {
        let most = |per: usize| (n / per + segs).min(n);
        (most(PREFILL_ATTENTION_QUERIES), most(SHORT_CONV_TOKENS))
    }
}

// ---------------------------------------------------------------- swiglu

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SwigluParams {
    f: u32,
    n: u32,
    _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<SwigluParams>() == 16);

kernel!(
    SWIGLU,
    "swiglu",
    "swiglu.wgsl",
    [Binding::read("gu"), Binding::write("y")],
    SwigluParams,
    [&[], &["GELU"]]
);

/// gu: [n, 2 f] (gate | up) -> y: [n, f] = act(gate) * up.
pub fn swiglu(
    gpu: &Gpu,
    gu: &wgpu::Buffer,
    y: &wgpu::Buffer,
    f: usize,
    n: usize,
    act: FfnAct,
) -> Result<Dispatch> {
    let params = SwigluParams {
        f: f as u32,
        n: n as u32,
        _pad: [0; 2],
    };
    Ok(Dispatch {
        bound: gpu.bind(&SWIGLU, &act_variant(act), &[gu, y], &params)?,
        groups: groups_1d(f * n, 256),
    })
}

/// The variant of the gated kernels for `act`.
fn act_variant(act: FfnAct) -> Variant {
    match act {
        FfnAct::Silu => Variant::default(),
        FfnAct::GeluTanh => Variant::new(&["GELU"]),
    }
}

// ---------------------------------------------------------------- argmax

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ArgmaxParams {
    n: u32,
    groups: u32,
    _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<ArgmaxParams>() == 16);

kernel!(
    ARGMAX_PART,
    "argmax_part",
    ["best.wgsl", "argmax.wgsl"],
    [Binding::read("x"), Binding::write("part")],
    ArgmaxParams,
    [&["PARTIAL"]]
);
kernel!(
    ARGMAX_PART_MASKED,
    "argmax_part_masked",
    ["best.wgsl", "argmax.wgsl"],
    [
        Binding::read("x"),
        Binding::write("part"),
        Binding::read("mask")
    ],
    ArgmaxParams,
    [&["PARTIAL", "MASKED"]]
);
kernel!(
    ARGMAX,
    "argmax",
    ["best.wgsl", "argmax.wgsl"],
    [Binding::read("part"), Binding::write("out")],
    ArgmaxParams,
    [&[]]
);

kernel!(
    ARGMAX_PART_ROWS,
    "argmax_part_rows",
    ["best.wgsl", "argmax.wgsl"],
    [Binding::read("x"), Binding::write("part")],
    ArgmaxParams,
    [&["PARTIAL", "ROWS"]]
);
kernel!(
    ARGMAX_ROWS,
    "argmax_rows",
    ["best.wgsl", "argmax.wgsl"],
    [Binding::read("part"), Binding::write("out")],
    ArgmaxParams,
    [&["ROWS"]]
);

/// [`argmax`] of each of `rows` rows of x ([rows, n]): `out` [rows, 2] u32,
/// row r's (index, non-finite flag) at 2 r.
pub fn argmax_rows(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: usize,
    rows: usize,
) -> Result<Vec<Dispatch>> {
    let params = argmax_params(n);
    let part = gpu.scratch(
        "argmax triples",
        12 * (params.groups as usize * rows) as u64,
    )?;
    Ok(vec![
        Dispatch {
            bound: gpu.bind(
                &ARGMAX_PART_ROWS,
                &Variant::new(&["PARTIAL", "ROWS"]),
                &[x, &part],
                &params,
            )?,
            groups: [params.groups, rows as u32, 1],
        },
        Dispatch {
            bound: gpu.bind(
                &ARGMAX_ROWS,
                &Variant::new(&["ROWS"]),
                &[&part, out],
                &params,
            )?,
            groups: [rows as u32, 1, 1],
        },
    ])
}

/// Elements of x one `argmax_part` workgroup reduces (CHUNK in argmax.wgsl).
pub const ARGMAX_CHUNK: usize = 1024;

/// `out[0]` = the index of the largest of x[0..n] (the first on ties),
/// `out[1]` = 1 when x holds a NaN or an infinity, else 0 (`out`: 2 u32):
/// many workgroups find the best of their slice, one more picks among those.
/// With a `mask` (u32 words, bit i % 32 of word i / 32 for x[i]), the
/// largest of the x[i] whose bit is set ([`crate::cpu::masked_argmax`]; 0 when
/// none is).
pub fn argmax(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    mask: Option<&wgpu::Buffer>,
    out: &wgpu::Buffer,
    n: usize,
) -> Result<Vec<Dispatch>> {
    let params = argmax_params(n);
    let part = gpu.scratch("argmax triples", 12 * params.groups as u64)?;
    Ok(vec![
        argmax_part(gpu, x, mask, &part, n)?,
        Dispatch {
            bound: gpu.bind(&ARGMAX, &Variant::default(), &[&part, out], &params)?,
            groups: [1, 1, 1],
        },
    ])
}

/// The first kernel of [`argmax`] alone: (value bits, index, non-finite
/// flag) of the best of each ARGMAX_CHUNK slice of x (its allowed
/// elements, with a `mask`) into `part` (for its parity test).
pub fn argmax_part(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    mask: Option<&wgpu::Buffer>,
    part: &wgpu::Buffer,
    n: usize,
) -> Result<Dispatch> {
    let params = argmax_params(n);
    let bound = match mask {
        None => gpu.bind(
            &ARGMAX_PART,
            &Variant::new(&["PARTIAL"]),
            &[x, part],
            &params,
        )?,
        Some(mask) => gpu.bind(
            &ARGMAX_PART_MASKED,
            &Variant::new(&["PARTIAL", "MASKED"]),
            &[x, part, mask],
            &params,
        )?,
    };
    Ok(Dispatch {
        bound,
        groups: [params.groups, 1, 1],
    })
}

/// Both argmax kernels' params: n and the number of slices.
fn argmax_params(n: usize) -> ArgmaxParams {
    ArgmaxParams {
        n: n as u32,
        groups: n.div_ceil(ARGMAX_CHUNK).max(1) as u32,
        _pad: [0; 2],
    }
}

// ---------------------------------------------------------------- sample

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SampleParams {
    n: u32,
    _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<SampleParams>() == 16);

kernel!(
    SAMPLE_ROWS,
    "sample_rows",
    ["best.wgsl", "sample.wgsl"],
    [
        Binding::read("x"),
        Binding::read("draws"),
        Binding::write("out")
    ],
    SampleParams,
    [&[]]
);

/// A token drawn from each of `rows` rows of x ([rows, n]) where the logits
/// are, as [`crate::sampling::draw_unsorted`] draws it on the CPU: `draws`
/// [rows] x 4 f32 ([`crate::sampling::Draw::to_gpu`]), `out` [rows, 2] u32,
/// row r's (token, non-finite flag) at 2 r, as [`argmax_rows`] writes them.
pub fn sample_rows(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    draws: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: usize,
    rows: usize,
) -> Result<Dispatch> {
    let params = SampleParams {
        n: n as u32,
        _pad: [0; 3],
    };
    Ok(Dispatch {
        bound: gpu.bind(&SAMPLE_ROWS, &Variant::default(), &[x, draws, out], &params)?,
        groups: [rows as u32, 1, 1],
    })
}

// ---------------------------------------------------------------- top_k

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct TopKParams {
    n: u32,
    k: u32,
    _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<TopKParams>() == 16);

kernel!(
    TOP_K,
    "top_k",
    "top_k.wgsl",
    [Binding::read("x"), Binding::write("out")],
    TopKParams,
    [&[], &["MERGE"]]
);
kernel!(
    TOP_K_PART,
    "top_k_part",
    "top_k.wgsl",
    [Binding::read("x"), Binding::write("out")],
    TopKParams,
    [&["PARTIAL"]]
);
kernel!(
    TOP_K_MASKED,
    "top_k_masked",
    "top_k.wgsl",
    [
        Binding::read("x"),
        Binding::write("out"),
        Binding::read("allowed")
    ],
    TopKParams,
    [&["MASKED"]]
);
kernel!(
    TOP_K_PART_MASKED,
    "top_k_part_masked",
    "top_k.wgsl",
    [
        Binding::read("x"),
        Binding::write("out"),
        Binding::read("allowed")
    ],
    TopKParams,
    [&["PARTIAL", "MASKED"]]
);

kernel!(
    TOP_K_ROWS,
    "top_k_rows",
    "top_k.wgsl",
    [Binding::read("x"), Binding::write("out")],
    TopKParams,
    [&["ROWS"], &["MERGE", "ROWS"]]
);
kernel!(
    TOP_K_PART_ROWS,
    "top_k_part_rows",
    "top_k.wgsl",
    [Binding::read("x"), Binding::write("out")],
    TopKParams,
    [&["PARTIAL", "ROWS"]]
);

/// [`top_k`] of each of `rows` rows of x ([rows, n]): `out` [rows, k, 2]
/// u32, row r's k pairs (unordered) at 2 k r.
pub fn top_k_rows(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: usize,
    k: usize,
    rows: usize,
) -> Result<Vec<Dispatch>> {
    assert!(
        k <= MAX_TOP_K && k <= n && k > 0,
        "top_k_rows: k = {k} of {n}"
    );
    let params = |n: usize| TopKParams {
        n: n as u32,
        k: k as u32,
        _pad: [0; 2],
    };
    let rows = rows as u32;
    if n < 2 * TOP_K_SLICE {
        return Ok(vec![Dispatch {
            bound: gpu.bind(&TOP_K_ROWS, &Variant::new(&["ROWS"]), &[x, out], &params(n))?,
            groups: [1, rows, 1],
        }]);
    }
    let groups = n / TOP_K_SLICE;
    let cand = gpu.scratch(
        "top-k row candidates",
        (8 * k * groups * rows as usize) as u64,
    )?;
    Ok(vec![
        Dispatch {
            bound: gpu.bind(
                &TOP_K_PART_ROWS,
                &Variant::new(&["PARTIAL", "ROWS"]),
                &[x, &cand],
                &params(n),
            )?,
            groups: [groups as u32, rows, 1],
        },
        Dispatch {
            bound: gpu.bind(
                &TOP_K_ROWS,
                &Variant::new(&["MERGE", "ROWS"]),
                &[&cand, out],
                &params(k * groups),
            )?,
            groups: [1, rows, 1],
        },
    ])
}

/// Most candidates [`top_k`] selects.
pub const MAX_TOP_K: usize = 256;
/// Values one `top_k_part` workgroup selects from (SLICE in top_k.wgsl;
/// the last slice also takes the remainder).
pub const TOP_K_SLICE: usize = 4096;

/// out: the `k` (<= [`MAX_TOP_K`], <= n) largest of x[0..n] as (index,
/// value bits) u32 pairs, unordered; which ones matches `cpu::top_k`. Past
/// two slices, each slice's k best are selected in parallel first and one
/// workgroup picks among those. With a `mask` (as [`argmax`]'s), x[i]
/// whose bit is clear count as -inf, unless not finite.
pub fn top_k(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    mask: Option<&wgpu::Buffer>,
    out: &wgpu::Buffer,
    n: usize,
    k: usize,
) -> Result<Vec<Dispatch>> {
    assert!(k <= MAX_TOP_K && k <= n && k > 0, "top_k: k = {k} of {n}");
    let params = |n: usize| TopKParams {
        n: n as u32,
        k: k as u32,
        _pad: [0; 2],
    };
    if n < 2 * TOP_K_SLICE {
        let bound = match mask {
            None => gpu.bind(&TOP_K, &Variant::default(), &[x, out], &params(n))?,
            Some(mask) => gpu.bind(
                &TOP_K_MASKED,
                &Variant::new(&["MASKED"]),
                &[x, out, mask],
                &params(n),
            )?,
        };
        return Ok(vec![Dispatch {
            bound,
            groups: [1, 1, 1],
        }]);
    }
    let groups = n / TOP_K_SLICE;
    let cand = gpu.scratch("top-k candidates", (8 * k * groups) as u64)?;
    Ok(vec![
        top_k_part(gpu, x, mask, &cand, n, k)?,
        Dispatch {
            bound: gpu.bind(
                &TOP_K,
                &Variant::new(&["MERGE"]),
                &[&cand, out],
                &params(k * groups),
            )?,
            groups: [1, 1, 1],
        },
    ])
}

/// The first kernel of [`top_k`]'s two: the k best of each slice of x (n
/// >= TOP_K_SLICE) into `cand`, k pairs per slice (for its parity test).
pub fn top_k_part(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    mask: Option<&wgpu::Buffer>,
    cand: &wgpu::Buffer,
    n: usize,
    k: usize,
) -> Result<Dispatch> {
    assert!(
        k <= MAX_TOP_K && n >= TOP_K_SLICE && k > 0,
        "top_k_part: k = {k} of {n}"
    );
    let params = TopKParams {
        n: n as u32,
        k: k as u32,
        _pad: [0; 2],
    };
    let bound = match mask {
        None => gpu.bind(
            &TOP_K_PART,
            &Variant::new(&["PARTIAL"]),
            &[x, cand],
            &params,
        )?,
        Some(mask) => gpu.bind(
            &TOP_K_PART_MASKED,
            &Variant::new(&["PARTIAL", "MASKED"]),
            &[x, cand, mask],
            &params,
        )?,
    };
    Ok(Dispatch {
        bound,
        groups: [(n / TOP_K_SLICE) as u32, 1, 1],
    })
}

/// Sorts [`top_k`]'s output as `cpu::top_k` orders candidates.
pub fn sort_candidates(raw: &[u32]) -> Vec<(u32, f32)> {
    best_candidates(raw, raw.len() / 2)
}

/// The first `k` of [`sort_candidates`]'s order, without sorting the rest
/// (a sampler's top-k of the 256 a row brings back).
pub fn best_candidates(raw: &[u32], k: usize) -> Vec<(u32, f32)> {
    let mut c: Vec<(u32, f32)> = raw
        .chunks_exact(2)
        .map(|p| (p[0], f32::from_bits(p[1])))
        .collect();
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k == 0 {
        c.clear();
    } else if k < c.len() {
        c.select_nth_unstable_by(k - 1, order);
        c.truncate(k);
    }
    c.sort_by(order);
    c
}

/// Compiles the prefill-only kernels without weights (short_conv, swiglu)
/// ahead of their first use.
pub fn warm_prefill_kernels(gpu: &Gpu, act: FfnAct) -> Result<()> {
    if gpu.caps.coop_matrix {
        gpu.pipeline(&PREFILL_ATTENTION, &Variant::new(&COOP))?;
    }
    gpu.pipeline(&SHORT_CONV, &Variant::default())?;
    gpu.pipeline(&SWIGLU, &act_variant(act))?;
    Ok(())
}

/// The same for the kernels only a batched prefill runs.
pub fn warm_prefill_rows_kernels(gpu: &Gpu) -> Result<()> {
    if gpu.caps.coop_matrix {
        let rows = [&COOP[..], &["ROWS"]].concat();
        gpu.pipeline(&PREFILL_ATTENTION_ROWS, &Variant::new(&rows))?;
    }
    gpu.pipeline(&SHORT_CONV_ROWS, &Variant::new(&["ROWS"]))?;
    Ok(())
}

/// The kernels declared in this module.
pub static KERNELS: &[&Kernel] = &[
    &GEMV,
    &GEMV_ADD,
    &GEMV_NORM,
    &GEMV_SWIGLU,
    &GEMV_GEGLU,
    &GEMV_CONV,
    &GEMV_COLS,
    &GEMV_COLS_ADD,
    &GEMV_COLS_NORM,
    &GEMV_COLS_SWIGLU,
    &GEMV_COLS_GEGLU,
    &GEMV_COLS_CONV,
    &GEMV_SUM,
    &GEMV_SUM_ADD,
    &GEMV_SUM_NORM,
    &GEMV_SUM_SWIGLU,
    &GEMV_SUM_GEGLU,
    &GEMV_SUM_CONV,
    &GEMM_ADD,
    &GEMM_ADD_SPLIT,
    &GEMM_NORM_SPLIT,
    &GEMM_NORM_SWIGLU_SPLIT,
    &GEMM_SPLIT_SUM,
    &GEMM_SPLIT_SUM_SHADOW,
    &GEMM_NORM,
    &GEMM_NORM_SWIGLU,
    &GEMM_NORM_GEGLU,
    &EMBEDDING,
    &QK_ROPE,
    &QK_ROPE_ROWS,
    &FLASH_ATTENTION,
    &FLASH_ATTENTION_PREP,
    &FLASH_ATTENTION_MERGE,
    &FLASH_ATTENTION_ROWS,
    &FLASH_ATTENTION_MERGE_ROWS,
    &PREFILL_ATTENTION,
    &PREFILL_ATTENTION_ROWS,
    &SHORT_CONV,
    &SHORT_CONV_ROWS,
    &SWIGLU,
    &ARGMAX_PART,
    &ARGMAX_PART_MASKED,
    &ARGMAX,
    &ARGMAX_PART_ROWS,
    &ARGMAX_ROWS,
    &SAMPLE_ROWS,
    &TOP_K,
    &TOP_K_PART,
    &TOP_K_MASKED,
    &TOP_K_PART_MASKED,
    &TOP_K_ROWS,
    &TOP_K_PART_ROWS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_moves_unaligned_scales_to_a_tail() {
        // Two Q4_0 blocks: d = [1, 2] and [3, 4], qs = 16 bytes each.
        let mut bytes = Vec::new();
        for b in 0..2u8 {
            bytes.extend_from_slice(&[2 * b + 1, 2 * b + 2]);
            bytes.extend((0..16).map(|i| 16 * b + i));
        }
        let (packed, d_off) = pack_blocks(GgmlType::Q4_0, &bytes);
        assert_eq!(d_off, 8);
        assert_eq!(&packed[..16], &bytes[2..18]);
        assert_eq!(&packed[16..32], &bytes[20..36]);
        assert_eq!(&packed[32..36], &[1, 2, 3, 4]);
        assert_eq!(packed.len(), 36);
        // Aligned formats are copied (and padded to a word).
        let (f16, d_off) = pack_blocks(GgmlType::F16, &[1, 2, 3, 4, 5, 6]);
        assert_eq!((f16, d_off), (vec![1, 2, 3, 4, 5, 6, 0, 0], 0));
    }

    #[test]
    fn best_candidates_are_the_first_of_the_full_order() {
        // Ties (ids 5 and 9 at 1.0, several at -2.0), an infinity, ids
        // out of order, as top_k leaves them.
        let values = [
            (9u32, 1.0f32),
            (3, -2.0),
            (5, 1.0),
            (7, f32::INFINITY),
            (1, -2.0),
            (0, 0.5),
        ];
        let mut raw = Vec::new();
        for (id, v) in values {
            raw.extend([id, v.to_bits()]);
        }
        let all = sort_candidates(&raw);
        assert_eq!(
            all.iter().map(|c| c.0).collect::<Vec<_>>(),
            [7, 5, 9, 0, 1, 3]
        );
        for k in 0..=values.len() + 1 {
            assert_eq!(best_candidates(&raw, k), all[..k.min(all.len())], "k = {k}");
        }
    }

    #[test]
    fn every_gpu_format_has_defines_and_is_found_from_its_variant() {
        for t in GPU_FORMATS {
            let v = format_variant(t, &["ADD"]).unwrap();
            assert_eq!(variant_format(&v), Some(t));
        }
        assert!(format_defines(GgmlType::Q5_K).is_none());
    }
}
