//! Kernels of Whisper beyond the shared dense ones: the 1-D im2col of its
//! conv stem, the tiled attention of its long sequences (the encoder's, and
//! the decoder's cross-attention to them), and the choice of the next token
//! under Whisper's rules, best first or drawn at a temperature, and the
//! greedy step that feeds a pick back without the host. CPU twins:
//! `models::whisper::model::im2col_1d`, `cpu::attention`,
//! `cpu::whisper::{whisper_select, whisper_sample, whisper_next}`.

use super::kernels::{Binding, Kernel, Variant};
use super::ops::{groups_1d, Dispatch};
use super::Gpu;
use crate::cpu::{self, AttentionShape};
use crate::error::Result;
use crate::kernel;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Im2colParams {
    t_in: u32,
    channels: u32,
    t_stride: u32,
    c_stride: u32,
    kernel: u32,
    stride: u32,
    pad: u32,
    t_out: u32,
}
const _: () = assert!(std::mem::size_of::<Im2colParams>() == 32);

kernel!(
    IM2COL_1D,
    "im2col_1d",
    "im2col.wgsl",
    [Binding::read("x"), Binding::write("cols")],
    Im2colParams,
    [&[]]
);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AttentionTiledParams {
    heads: u32,
    q_stride: u32,
    k_stride: u32,
    v_stride: u32,
    q_col: u32,
    k_col: u32,
    v_col: u32,
    scale: f32,
    splits: u32,
    _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<AttentionTiledParams>() == 48);

kernel!(
    ATTENTION_TILED,
    "attention_tiled",
    "attention_tiled.wgsl",
    [
        Binding::read("q"),
        Binding::read("k"),
        Binding::read("v"),
        Binding::read("seqs"),
        Binding::write("out"),
    ],
    AttentionTiledParams,
    [&[], &["SPLIT"]]
);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MergeParams {
    rows: u32,
    heads: u32,
    splits: u32,
    head_dim: u32,
}
const _: () = assert!(std::mem::size_of::<MergeParams>() == 16);

kernel!(
    ATTENTION_TILED_MERGE,
    "attention_tiled_merge",
    "attention_tiled_merge.wgsl",
    [Binding::read("part"), Binding::write("out")],
    MergeParams,
    [&[]]
);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SelectParams {
    vocab: u32,
    timestamp_begin: u32,
    k: u32,
    timestamps: u32,
    words: u32,
    neg_inf_bits: u32,
    text_chunks: u32,
    chunks: u32,
    temperature: f32,
    _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<SelectParams>() == 48);

kernel!(
    WHISPER_SELECT_PART,
    "whisper_select_part",
    ["whisper_select_common.wgsl", "whisper_select_part.wgsl"],
    [
        Binding::read("logits"),
        Binding::read("rules"),
        Binding::read("masks"),
        Binding::write("part"),
    ],
    SelectParams,
    [&[]]
);

kernel!(
    WHISPER_SELECT,
    "whisper_select",
    ["whisper_select_common.wgsl", "whisper_select.wgsl"],
    [
        Binding::read("logits"),
        Binding::read("rules"),
        Binding::read("masks"),
        Binding::read("part"),
        Binding::write("out"),
    ],
    SelectParams,
    [&[]]
);

kernel!(
    WHISPER_SAMPLE,
    "whisper_sample",
    ["whisper_select_common.wgsl", "whisper_sample.wgsl"],
    [
        Binding::read("logits"),
        Binding::read("rules"),
        Binding::read("masks"),
        Binding::read("part"),
        Binding::read("picks"),
        Binding::read("draws"),
        Binding::write("out"),
    ],
    SelectParams,
    [&[]]
);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct NextParams {
    d: u32,
    vocab: u32,
    timestamp_begin: u32,
    eot: u32,
    timestamps: u32,
    _pad: u32,
    words: u32,
    rows: u32,
}
const _: () = assert!(std::mem::size_of::<NextParams>() == 32);

kernel!(
    WHISPER_NEXT,
    "whisper_next",
    "whisper_next.wgsl",
    [
        Binding::read("picks"),
        Binding::read("table"),
        Binding::write("states"),
        Binding::write("rules"),
        Binding::write("emb"),
    ],
    NextParams,
    [&[]]
);

/// Tokens of one chunk of `whisper_select_part` (`CHUNK` in
/// `shaders/whisper_select_common.wgsl`).
const SELECT_CHUNK: usize = 512;

/// `whisper_select_part`'s chunks of a vocabulary: text chunks (below
/// `timestamp_begin`), and all of them.
fn select_chunks(vocab: usize, timestamp_begin: u32) -> (usize, usize) {
    let tb = (timestamp_begin as usize).min(vocab);
    let text = tb.div_ceil(SELECT_CHUNK);
    (text, text + (vocab - tb).div_ceil(SELECT_CHUNK))
}

/// u32 words of `whisper_select_part`'s scratch for `rows` rows of `vocab`
/// and up to `k` picks, wherever the timestamps begin (the `part` buffer
/// [`whisper_select`] and [`whisper_sample`] take).
pub fn select_part_words(vocab: usize, rows: usize, k: usize) -> usize {
    rows * (vocab.div_ceil(SELECT_CHUNK) + 1) * (4 + 2 * k)
}

fn select_params(rules: &cpu::whisper::SelectRules, k: usize, temperature: f32) -> SelectParams {
    let (text_chunks, chunks) = select_chunks(rules.vocab, rules.timestamp_begin);
    SelectParams {
        vocab: rules.vocab as u32,
        timestamp_begin: rules.timestamp_begin,
        k: k as u32,
        timestamps: rules.timestamps as u32,
        words: cpu::whisper::mask_words(rules.vocab) as u32,
        neg_inf_bits: f32::NEG_INFINITY.to_bits(),
        text_chunks: text_chunks as u32,
        chunks: chunks as u32,
        temperature,
        _pad: [0; 3],
    }
}

/// Largest head size [`attention_tiled`] handles (Whisper's is 64 at every size).
pub const ATTENTION_TILED_MAX_HEAD_DIM: usize = 64;

/// The kernels declared in this module.
pub static KERNELS: &[&Kernel] = &[
    &IM2COL_1D,
    &ATTENTION_TILED,
    &ATTENTION_TILED_MERGE,
    &WHISPER_SELECT_PART,
    &WHISPER_SELECT,
    &WHISPER_SAMPLE,
    &WHISPER_NEXT,
];

/// Non-causal attention over the spans `seqs` (uploaded as `seqs_buf` =
/// `gpu::dense::pack_seqs`): span i's `q_len` query rows from `q_start`
/// attend to its `kv_len` keys from `kv_start`; at most `max_q_len` query
/// rows a span. For the long sequences of the encoder (one span of 1500
/// rows over themselves) and the decoder's cross-attention (each
/// sequence's few rows over its window's 1500 audio positions); same maths
/// as `cpu::attention` over those spans. out: [rows, heads * head_dim].
///
/// `gpu::dense::attention` gives each query row its own thread with
/// head-size registers; on Mesa lavapipe (22.3) that kernel writes only the
/// first element of each row once sequences pass ~500 keys at head size 64,
/// so the encoder uses this tiled kernel, which also reads each key row once
/// per 16 queries instead of once per query.
// The arguments are the kernel's bindings and sizes, as in every dispatch wrapper.
#[allow(clippy::too_many_arguments)]
pub fn attention_tiled(
    gpu: &Gpu,
    q: &wgpu::Buffer,
    k: &wgpu::Buffer,
    v: &wgpu::Buffer,
    seqs_buf: &wgpu::Buffer,
    n_seqs: usize,
    max_q_len: usize,
    out: &wgpu::Buffer,
    shape: &AttentionShape,
) -> Result<Dispatch> {
    bind_tiled(gpu, q, k, v, seqs_buf, n_seqs, max_q_len, out, shape, None)
}

/// [`attention_tiled`] as flash-decoding, for a few query rows over many
/// keys: each span's keys in `splits` pieces of whole tiles, a workgroup
/// each, their partial sums in `part` ([rows, heads, splits, head_dim + 2]
/// f32), then `attention_tiled_merge` combining them into `out` for the
/// `rows` query rows the spans cover. Same maths as `cpu::attention`.
#[allow(clippy::too_many_arguments)]
pub fn attention_tiled_split(
    gpu: &Gpu,
    q: &wgpu::Buffer,
    k: &wgpu::Buffer,
    v: &wgpu::Buffer,
    seqs_buf: &wgpu::Buffer,
    n_seqs: usize,
    max_q_len: usize,
    rows: usize,
    part: &wgpu::Buffer,
    out: &wgpu::Buffer,
    shape: &AttentionShape,
    splits: usize,
) -> Result<[Dispatch; 2]> {
    assert!(
        splits >= 1 && (1..=65535).contains(&rows),
        "attention_tiled_split: {splits} splits, {rows} rows"
    );
    let main = bind_tiled(
        gpu,
        q,
        k,
        v,
        seqs_buf,
        n_seqs,
        max_q_len,
        part,
        shape,
        Some(splits),
    )?;
    let params = MergeParams {
        rows: rows as u32,
        heads: shape.heads as u32,
        splits: splits as u32,
        head_dim: shape.head_dim as u32,
    };
    let bound = gpu.bind(
        &ATTENTION_TILED_MERGE,
        &Variant::default(),
        &[part, out],
        &params,
    )?;
    let merge = Dispatch {
        bound,
        groups: [rows as u32, shape.heads as u32, 1],
    };
    Ok([main, merge])
}

#[allow(clippy::too_many_arguments)]
fn bind_tiled(
    gpu: &Gpu,
    q: &wgpu::Buffer,
    k: &wgpu::Buffer,
    v: &wgpu::Buffer,
    seqs_buf: &wgpu::Buffer,
    n_seqs: usize,
    max_q_len: usize,
    out: &wgpu::Buffer,
    shape: &AttentionShape,
    split: Option<usize>,
) -> Result<Dispatch> {
    let splits = split.unwrap_or(1);
    assert!(
        !shape.causal && shape.kv_heads == shape.heads,
        "attention_tiled: bidirectional, one kv head per head"
    );
    assert!(
        shape.head_dim.is_multiple_of(4) && shape.head_dim <= ATTENTION_TILED_MAX_HEAD_DIM,
        "attention_tiled: head_dim {} must be a multiple of 4 up to {ATTENTION_TILED_MAX_HEAD_DIM}",
        shape.head_dim
    );
    if n_seqs == 0
        || max_q_len == 0
        || max_q_len.div_ceil(4) > 65535
        || shape.heads > 65535
        || n_seqs * splits > 65535
    {
        return Err(crate::Error::gpu(format!(
            "attention of {n_seqs} spans of up to {max_q_len} rows, {} heads and {splits} splits \
             cannot be dispatched",
            shape.heads
        )));
    }
    let params = AttentionTiledParams {
        heads: shape.heads as u32,
        q_stride: shape.q_stride as u32,
        k_stride: shape.k_stride as u32,
        v_stride: shape.v_stride as u32,
        q_col: shape.q_col as u32,
        k_col: shape.k_col as u32,
        v_col: shape.v_col as u32,
        scale: shape.scale,
        splits: splits as u32,
        _pad: [0; 3],
    };
    let variant = match split {
        Some(_) => Variant::new(&["SPLIT"]),
        None => Variant::default(),
    }
    .with("HEAD_DIM", shape.head_dim as u32);
    let bound = gpu.bind(
        &ATTENTION_TILED,
        &variant,
        &[q, k, v, seqs_buf, out],
        &params,
    )?;
    // Query rows a workgroup: attention_tiled.wgsl's BQ.
    let block = if split.is_some() { 4 } else { 16 };
    Ok(Dispatch {
        bound,
        groups: [
            max_q_len.div_ceil(block) as u32,
            shape.heads as u32,
            (n_seqs * splits) as u32,
        ],
    })
}

/// Whisper's choice of the next token for each of `rows` rows of `logits`
/// ([rows, rules.vocab]) under its rule in `rules_buf` (`rows` x
/// [`cpu::whisper::RowRule`]) and the run's token sets in `masks_buf`
/// ([`cpu::whisper::SelectRules::masks`]): the k likeliest tokens, their
/// log probabilities and the probe's, into `out` ([rows,
/// `cpu::whisper::select_words(k)`] u32). Two dispatches: each chunk of
/// 512 tokens of each row into `part` ([`select_part_words`] u32; with a
/// `temperature` above 0 also its sums for [`whisper_sample`]), then one
/// workgroup a row merging them. CPU twin: [`cpu::whisper::whisper_select`].
#[allow(clippy::too_many_arguments)]
pub fn whisper_select(
    gpu: &Gpu,
    logits: &wgpu::Buffer,
    rules_buf: &wgpu::Buffer,
    masks_buf: &wgpu::Buffer,
    part: &wgpu::Buffer,
    out: &wgpu::Buffer,
    rows: usize,
    rules: &cpu::whisper::SelectRules,
    k: usize,
    temperature: f32,
) -> Result<[Dispatch; 2]> {
    assert!(
        rows > 0 && rows <= 65535 && k <= rules.vocab,
        "whisper_select: {rows} rows, k {k}"
    );
    let params = select_params(rules, k, temperature);
    let bound = gpu.bind(
        &WHISPER_SELECT_PART,
        &Variant::default(),
        &[logits, rules_buf, masks_buf, part],
        &params,
    )?;
    let first = Dispatch {
        bound,
        groups: [params.chunks, rows as u32, 1],
    };
    let bound = gpu.bind(
        &WHISPER_SELECT,
        &Variant::default(),
        &[logits, rules_buf, masks_buf, part, out],
        &params,
    )?;
    let merge = Dispatch {
        bound,
        groups: [rows as u32, 1, 1],
    };
    Ok([first, merge])
}

/// A token drawn at `temperature` for each of `draws` draws
/// ([`cpu::whisper::Draw`] pairs (row, u bits) in `draws_buf`), from the
/// rows [`whisper_select`] went over with k = 1 and the same temperature
/// (its `part` and `picks`), into `out` ([draws,
/// `cpu::whisper::SAMPLE_WORDS`] u32). A draw flagged
/// `cpu::whisper::DRAW_ON_CPU` must be drawn again on the CPU; every other
/// one is the token [`cpu::whisper::whisper_sample`] draws.
#[allow(clippy::too_many_arguments)]
pub fn whisper_sample(
    gpu: &Gpu,
    logits: &wgpu::Buffer,
    rules_buf: &wgpu::Buffer,
    masks_buf: &wgpu::Buffer,
    part: &wgpu::Buffer,
    picks: &wgpu::Buffer,
    draws_buf: &wgpu::Buffer,
    out: &wgpu::Buffer,
    draws: usize,
    rules: &cpu::whisper::SelectRules,
    temperature: f32,
) -> Result<Dispatch> {
    assert!(
        draws > 0 && draws <= 65535 && temperature > 0.0,
        "whisper_sample: {draws} draws at temperature {temperature}"
    );
    let params = select_params(rules, 1, temperature);
    let bound = gpu.bind(
        &WHISPER_SAMPLE,
        &Variant::default(),
        &[logits, rules_buf, masks_buf, part, picks, draws_buf, out],
        &params,
    )?;
    Ok(Dispatch {
        bound,
        groups: [draws as u32, 1, 1],
    })
}

/// Greedy decoding a step ahead: the token [`whisper_select`] picked for
/// each of `rows` rows (`picks`, k = 1) goes into the row's
/// [`cpu::whisper::RuleState`] in `states`, the rule of its next step into
/// `rules_buf` (where `whisper_select` reads it) and its row of `table`
/// ([vocab, d] f32) into `emb` ([rows, d]). CPU twin:
/// [`cpu::whisper::whisper_next`].
#[allow(clippy::too_many_arguments)]
pub fn whisper_next(
    gpu: &Gpu,
    picks: &wgpu::Buffer,
    table: &wgpu::Buffer,
    states: &wgpu::Buffer,
    rules_buf: &wgpu::Buffer,
    emb: &wgpu::Buffer,
    rows: usize,
    d: usize,
    rules: &cpu::whisper::TimestampRules,
) -> Result<Dispatch> {
    assert!(
        rows > 0 && rows <= 65535 && rules.vocab > 0,
        "whisper_next: {rows} rows"
    );
    let params = NextParams {
        d: d as u32,
        vocab: rules.vocab,
        timestamp_begin: rules.timestamp_begin,
        eot: rules.eot,
        timestamps: rules.timestamps as u32,
        _pad: 0,
        words: cpu::whisper::select_words(1) as u32,
        rows: rows as u32,
    };
    let bound = gpu.bind(
        &WHISPER_NEXT,
        &Variant::default(),
        &[picks, table, states, rules_buf, emb],
        &params,
    )?;
    Ok(Dispatch {
        bound,
        groups: [rows as u32, 1, 1],
    })
}

/// The columns of a 1-D convolution (see `model::im2col_1d` for the layout).
#[allow(clippy::too_many_arguments)]
pub fn im2col_1d(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    cols: &wgpu::Buffer,
    t_in: usize,
    channels: usize,
    t_stride: usize,
    c_stride: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    t_out: usize,
) -> Result<Dispatch> {
    let params = Im2colParams {
        t_in: t_in as u32,
        channels: channels as u32,
        t_stride: t_stride as u32,
        c_stride: c_stride as u32,
        kernel: kernel as u32,
        stride: stride as u32,
        pad: pad as u32,
        t_out: t_out as u32,
    };
    let bound = gpu.bind(&IM2COL_1D, &Variant::default(), &[x, cols], &params)?;
    Ok(Dispatch {
        bound,
        groups: groups_1d(t_out * channels * kernel, 256),
    })
}
