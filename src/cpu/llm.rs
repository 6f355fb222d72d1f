//! Decoder-LLM ops: the CPU twins of the kernels in `gpu::llm_ops`, and the
//! pieces [`crate::models::llm::CpuLlm`] runs. Fused kernels (a norm folded
//! into the following product, the SwiGLU product, the whole short-conv
//! block) have a twin here that composes the plain reference ops in the
//! order the unfused model applies them.

use super::{add_assign, dot, dot_many, gelu_tanh, rms_norm, silu, softmax_rows};
use crate::quant;
use crate::tensor::{self, Tensor};
use crate::util::par;

/// Which dimensions RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// (i, i + d/2): transformers' `rotate_half`, llama.cpp's NEOX mode.
    Halves,
    /// (2i, 2i + 1): llama.cpp's normal mode, used for GGUF Llama files whose
    /// q/k rows the converter permuted.
    Interleaved,
}

/// The activation of the gated feed-forward: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// SwiGLU (Llama, Qwen, LFM2, Phi-3).
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma).
    GeluTanh,
}

/// The rotation frequencies of plain RoPE with base `theta`, for the
/// dimension pairs `0..rope_dim / 2`, in f64.
pub fn rope_freqs(theta: f32, rope_dim: usize) -> Vec<f64> {
    (0..rope_dim / 2)
        .map(|i| (theta as f64).powf(-2.0 * i as f64 / rope_dim as f64))
        .collect()
}

/// cos and sin of every RoPE angle for positions `pos0..pos0 + n` of plain
/// RoPE with base `theta`: [n, rope_dim / 2, 2] (see [`rope_table_freqs`]).
pub fn rope_table(pos0: usize, n: usize, rope_dim: usize, theta: f32) -> Vec<f32> {
    rope_table_freqs(pos0, n, &rope_freqs(theta, rope_dim))
}

/// cos and sin of every RoPE angle for positions `pos0..pos0 + n` and the
/// rotation frequencies `freqs` ([rope_dim / 2]): [n, rope_dim / 2, 2].
/// Angles are computed in f64 so long positions keep their precision; the
/// GPU reads this very table, so both backends rotate by identical values.
pub fn rope_table_freqs(pos0: usize, n: usize, freqs: &[f64]) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * freqs.len() * 2);
    for t in 0..n {
        let p = (pos0 + t) as f64;
        for &freq in freqs {
            let (sin, cos) = (p * freq).sin_cos();
            out.push(cos as f32);
            out.push(sin as f32);
        }
    }
    out
}

/// Rotates `x` ([n, heads, head_dim]) in place by the angles of `table`
/// ([n, rope_dim / 2, 2], [`rope_table_freqs`]).
pub fn rope_with_table(
    x: &mut [f32],
    heads: usize,
    head_dim: usize,
    rope_dim: usize,
    table: &[f32],
    style: RopeStyle,
) {
    let half = rope_dim / 2;
    for (t, row) in x.chunks_exact_mut(heads * head_dim).enumerate() {
        let cs = &table[t * half * 2..][..half * 2];
        for head in row.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (cos, sin) = (cs[2 * i], cs[2 * i + 1]);
                let (a, b) = match style {
                    RopeStyle::Halves => (i, i + half),
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

/// table: [vocab, hidden] (any type), tokens: `[n]` -> out: [n, hidden]. The
/// caller has checked every token against the vocabulary.
pub fn embedding(table: &Tensor, tokens: &[u32], out: &mut [f32]) {
    let d = table.row_len();
    assert_eq!(
        out.len(),
        tokens.len() * d,
        "embedding: out is not [n, hidden]"
    );
    for (&t, row) in tokens.iter().zip(out.chunks_exact_mut(d)) {
        quant::dequantize_row(table.dtype, table.row(t as usize), row);
    }
}

/// w: [rows, k] (any type), x: `[k]` -> y: `[rows]`; y = W x.
pub fn gemv(w: &Tensor, x: &[f32], y: &mut [f32]) {
    tensor::matvec(w, x, y);
}

/// y = W rms_norm(x, nw): an RMSNorm followed by a product.
pub fn gemv_norm(w: &Tensor, x: &[f32], nw: &[f32], eps: f32, y: &mut [f32]) {
    let mut h = vec![0.0; x.len()];
    rms_norm(x, nw, eps, &mut h);
    tensor::matvec(w, &h, y);
}

/// y = act(G h) * (U h) with h = rms_norm(x, nw): the feed-forward's first
/// half for one token.
pub fn gemv_swiglu(
    gate: &Tensor,
    up: &Tensor,
    x: &[f32],
    nw: &[f32],
    eps: f32,
    act: FfnAct,
    y: &mut [f32],
) {
    let mut g = vec![0.0; y.len()];
    let mut u = vec![0.0; y.len()];
    gemv_norm(gate, x, nw, eps, &mut g);
    gemv_norm(up, x, nw, eps, &mut u);
    for ((y, g), u) in y.iter_mut().zip(&g).zip(&u) {
        *y = ffn_act(act, *g) * u;
    }
}

/// LFM2's short-conv block for one token, up to the output projection:
/// bcx = in_proj rms_norm(x, nw); y = short_conv(bcx) (see [`short_conv`]).
#[allow(clippy::too_many_arguments)]
pub fn gemv_conv(
    in_proj: &Tensor,
    x: &[f32],
    nw: &[f32],
    eps: f32,
    conv: &[f32],
    kernel: usize,
    state: &mut Vec<f32>,
    y: &mut [f32],
) {
    let mut bcx = vec![0.0; 3 * x.len()];
    gemv_norm(in_proj, x, nw, eps, &mut bcx);
    short_conv(&bcx, conv, kernel, x.len(), state, y);
}

/// w: [rows, k] (any type), x: [n, k] -> y: [n, rows]; y = x W^T.
pub fn gemm(w: &Tensor, x: &[f32], n: usize, y: &mut [f32]) {
    tensor::matmul(w, x, n, y);
}

/// Shapes of one attention layer, for [`qk_rope`] and [`flash_attention`].
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    pub eps: f32,
    /// The softmax scale of the scores.
    pub scale: f32,
    /// Positions a query sees back, itself included; 0 for all.
    pub window: usize,
}

/// Prepares the new tokens' queries and keys and stores them: qkv is
/// [n, (heads + 2 kv_heads) head_dim] as the projections produce it (q, then
/// k, then v). Optional biases (Qwen2, [(heads + 2 kv_heads) head_dim]) are
/// added, optional per-head RMSNorms of q and k applied (LFM2, Qwen3,
/// Gemma-3), RoPE by the angles of `table` ([n, rope_dim / 2, 2],
/// [`rope_table_freqs`] for positions `pos0..pos0 + n`), then q -> `q_out`
/// [n, heads * head_dim] and k, v -> rows `pos0..pos0 + n` of the caches
/// ([positions, kv_heads * head_dim]).
#[allow(clippy::too_many_arguments)]
pub fn qk_rope(
    qkv: &[f32],
    n: usize,
    s: &AttnShape,
    q_norm: Option<&[f32]>,
    k_norm: Option<&[f32]>,
    bias: Option<&[f32]>,
    table: &[f32],
    pos0: usize,
    q_out: &mut [f32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) {
    let hd = s.head_dim;
    let (qw, kvw) = (s.heads * hd, s.kv_heads * hd);
    let stride = qw + 2 * kvw;
    assert_eq!(qkv.len(), n * stride, "qk_rope: qkv is not [n, q + 2 kv]");
    let mut rows = qkv.to_vec();
    if let Some(b) = bias {
        assert_eq!(b.len(), stride, "qk_rope: bias is not [q + 2 kv]");
        for row in rows.chunks_exact_mut(stride) {
            add_assign(row, b);
        }
    }
    let mut q = Vec::with_capacity(n * qw);
    let mut k = Vec::with_capacity(n * kvw);
    for row in rows.chunks_exact(stride) {
        q.extend_from_slice(&row[..qw]);
        k.extend_from_slice(&row[qw..qw + kvw]);
    }
    for (x, w) in [(&mut q, q_norm), (&mut k, k_norm)] {
        if let Some(w) = w {
            let src = x.clone();
            rms_norm(&src, w, s.eps, x);
        }
    }
    rope_with_table(&mut q, s.heads, hd, s.rope_dim, table, s.rope_style);
    rope_with_table(&mut k, s.kv_heads, hd, s.rope_dim, table, s.rope_style);
    q_out.copy_from_slice(&q);
    k_cache[pos0 * kvw..(pos0 + n) * kvw].copy_from_slice(&k);
    for (t, row) in rows.chunks_exact(stride).enumerate() {
        v_cache[(pos0 + t) * kvw..][..kvw].copy_from_slice(&row[qw + kvw..]);
    }
}

/// Causal grouped-query attention of `n` new queries against all `kv_len`
/// cached positions (the new ones are the last `n`), each query seeing the
/// last `s.window` positions up to its own (all of them when 0).
/// q: [n, heads, hd], k/v: [kv_len, kv_heads, hd] -> out: [n, heads, hd]
pub fn flash_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    kv_len: usize,
    s: &AttnShape,
    out: &mut [f32],
) {
    flash_attention_at(q, k, v, n, kv_len, s, out, |p| p)
}

/// [`flash_attention`] over a cache whose position p is row `row(p)` of k
/// and v (a paged cache: the row in the block its table names). Every
/// (query, head) pair is one piece of parallel work; each is
/// computed the same way whichever thread takes it.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_at(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    kv_len: usize,
    s: &AttnShape,
    out: &mut [f32],
    row: impl Fn(usize) -> usize + Sync,
) {
    let (heads, hd) = (s.heads, s.head_dim);
    let group = heads / s.kv_heads;
    assert_eq!(
        out.len(),
        n * heads * hd,
        "flash_attention: out is not [n, heads, hd]"
    );
    if hd == 0 {
        return;
    }
    par::for_each_chunk_mut(&mut [out], hd, |_, start, o| {
        let (t, h) = (start / hd / heads, start / hd % heads);
        // Query t sits at absolute position kv_len - n + t and sees up to it.
        let qv = &q[(t * heads + h) * hd..][..hd];
        attend(qv, k, v, kv_len - n + t + 1, h / group, s, o, &row);
    });
}

/// [`flash_attention_at`] for sequences of one new query each (a batch's
/// decode step), in one parallel step over every (sequence, head) pair:
/// query i (row i of q: [seqs, heads, hd]) is the last of its sequence's
/// `kv_lens[i]` positions, position p of which is row `row(i, p)` of k and
/// v. Each pair is computed as `flash_attention_at` computes it alone.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_last(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    kv_lens: &[usize],
    s: &AttnShape,
    out: &mut [f32],
    row: impl Fn(usize, usize) -> usize + Sync,
) {
    let (heads, hd) = (s.heads, s.head_dim);
    let group = heads / s.kv_heads;
    assert_eq!(
        out.len(),
        kv_lens.len() * heads * hd,
        "flash_attention_last: out is not [seqs, heads, hd]"
    );
    if hd == 0 {
        return;
    }
    par::for_each_chunk_mut(&mut [out], hd, |_, start, o| {
        let (i, h) = (start / hd / heads, start / hd % heads);
        let qv = &q[(i * heads + h) * hd..][..hd];
        attend(qv, k, v, kv_lens[i], h / group, s, o, &|p| row(i, p));
    });
}

/// One query head `qv` against key/value head `kh` at positions up to
/// `end` (exclusive; the last `s.window` of them when windowed) into `o`.
#[allow(clippy::too_many_arguments)]
fn attend(
    qv: &[f32],
    k: &[f32],
    v: &[f32],
    end: usize,
    kh: usize,
    s: &AttnShape,
    o: &mut [f32],
    row: &impl Fn(usize) -> usize,
) {
    let hd = s.head_dim;
    let kvw = s.kv_heads * hd;
    let first = if s.window > 0 {
        end.saturating_sub(s.window)
    } else {
        0
    };
    let visible = end - first;
    let key = |p: usize| &k[row(p) * kvw + kh * hd..][..hd];
    let mut scores = vec![0.0f32; visible];
    let mut quads = scores.chunks_exact_mut(4);
    for (i, sc) in (&mut quads).enumerate() {
        let p = first + 4 * i;
        let d = dot_many(qv, [key(p), key(p + 1), key(p + 2), key(p + 3)]);
        for (sc, d) in sc.iter_mut().zip(d) {
            *sc = d * s.scale;
        }
    }
    let done = visible / 4 * 4;
    for (j, sc) in quads.into_remainder().iter_mut().enumerate() {
        *sc = dot(qv, key(first + done + j)) * s.scale;
    }
    softmax_rows(&mut scores, visible);
    let value = |j: usize| &v[row(first + j) * kvw + kh * hd..][..hd];
    match hd {
        64 => weighted_sum::<64>(&scores, value, o),
        128 => weighted_sum::<128>(&scores, value, o),
        _ => {
            o.fill(0.0);
            for (j, &sc) in scores.iter().enumerate() {
                for (o, &vv) in o.iter_mut().zip(value(j)) {
                    *o += sc * vv;
                }
            }
        }
    }
}

/// o = sum_j scores[j] value(j), for a head size known when compiled: the
/// sums stay in registers across the keys (the same operations in the same
/// order as the general loop).
fn weighted_sum<'v, const D: usize>(
    scores: &[f32],
    value: impl Fn(usize) -> &'v [f32],
    o: &mut [f32],
) {
    let mut acc = [0.0f32; D];
    for (j, &sc) in scores.iter().enumerate() {
        let vv: &[f32; D] = value(j).try_into().expect("a value row of D elements");
        for d in 0..D {
            acc[d] += sc * vv[d];
        }
    }
    o.copy_from_slice(&acc);
}

/// The softmax scale 1 / sqrt(head_dim), as one f32 both backends use.
pub fn attention_scale(hd: usize) -> f32 {
    1.0 / (hd as f32).sqrt()
}

/// LFM2's gated short convolution over `n` tokens, continuing from `state`
/// (the previous `kernel - 1` gated inputs, [kernel - 1, hidden]), which is
/// updated. bcx: [n, 3 hidden] (B, C, x from the input projection) ->
/// out: [n, hidden]; with bx = B * x,
/// out[t, c] = C[t, c] * sum_j conv[c, j] * bx[t - (kernel - 1) + j, c].
pub fn short_conv(
    bcx: &[f32],
    conv: &[f32],
    kernel: usize,
    hidden: usize,
    state: &mut Vec<f32>,
    out: &mut [f32],
) {
    let d = hidden;
    let n = bcx.len() / (3 * d);
    let hist = kernel - 1;
    assert_eq!(
        state.len(),
        hist * d,
        "short_conv: state is not [kernel - 1, hidden]"
    );
    // The convolution's input: history, then the new gated rows.
    let mut seq = Vec::with_capacity((hist + n) * d);
    seq.extend_from_slice(state);
    for r in bcx.chunks_exact(3 * d) {
        seq.extend((0..d).map(|i| r[i] * r[2 * d + i]));
    }
    for t in 0..n {
        for c in 0..d {
            let mut acc = 0.0;
            for j in 0..kernel {
                acc += conv[c * kernel + j] * seq[(t + j) * d + c];
            }
            out[t * d + c] = bcx[t * 3 * d + d + c] * acc;
        }
    }
    state.clear();
    state.extend_from_slice(&seq[n * d..]);
}

/// gu: [n, 2 f] (gate, then up, per row) -> y: [n, f]; y = silu(gate) * up.
pub fn swiglu(gu: &[f32], f: usize, y: &mut [f32]) {
    gated(gu, f, FfnAct::Silu, y)
}

/// gu: [n, 2 f] (gate, then up, per row) -> y: [n, f]; y = act(gate) * up.
pub fn gated(gu: &[f32], f: usize, act: FfnAct, y: &mut [f32]) {
    assert_eq!(gu.len(), 2 * y.len(), "gated: gu is not [n, 2 f]");
    for (r, yr) in gu.chunks_exact(2 * f).zip(y.chunks_exact_mut(f)) {
        for i in 0..f {
            yr[i] = ffn_act(act, r[i]) * r[f + i];
        }
    }
}

/// The feed-forward's activation of one gate value.
pub fn ffn_act(act: FfnAct, x: f32) -> f32 {
    match act {
        FfnAct::Silu => silu(x),
        FfnAct::GeluTanh => gelu_tanh(x),
    }
}

/// Index of the largest value; the first one on ties (as torch.argmax).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Whether `mask`, a bitmap over tokens (bit `i % 32` of word `i / 32`, as
/// a grammar's allowed tokens reach the GPU), allows token `i`.
pub fn mask_allows(mask: &[u32], i: usize) -> bool {
    mask.get(i / 32).is_some_and(|w| (w >> (i % 32)) & 1 == 1)
}

/// Index of the largest of the x[i] that `mask` allows, the first on ties,
/// never a NaN; None when it allows none.
pub fn masked_argmax(x: &[f32], mask: &[u32]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &v) in x.iter().enumerate() {
        if mask_allows(mask, i) && !v.is_nan() && best.is_none_or(|b| v > x[b]) {
            best = Some(i);
        }
    }
    best
}

/// `x` with every value `mask` does not allow made -inf, unless it is not
/// finite (what the masked top-k selects from).
pub fn masked_logits(x: &[f32], mask: &[u32]) -> Vec<f32> {
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            if mask_allows(mask, i) || !v.is_finite() {
                v
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect()
}

/// The `k` largest of `x` as (index, value), sorted by value descending
/// (`f32::total_cmp`), ties by index: the order a stable sort of every
/// (index, value) pair gives, which sampling draws from.
pub fn top_k(x: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut cand: Vec<(u32, f32)> = x.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
    // A total order (ids are distinct), so selecting the first k and then
    // sorting them gives what sorting everything would: a full sort of a
    // 262k vocabulary took the sampler ~17 ms a token.
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k > 0 && k < cand.len() {
        cand.select_nth_unstable_by(k - 1, order);
    }
    cand.truncate(k);
    cand.sort_by(order);
    cand
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_styles_agree_up_to_permutation() {
        // Interleaved on a permuted head equals halves on the original.
        let hd = 8;
        let x: Vec<f32> = (0..hd).map(|i| i as f32 * 0.37 - 1.0).collect();
        let perm: Vec<usize> = (0..hd / 2).flat_map(|i| [i, i + hd / 2]).collect();
        let mut a = x.clone();
        let table = rope_table(5, 1, hd, 10_000.0);
        rope_with_table(&mut a, 1, hd, hd, &table, RopeStyle::Halves);
        let mut b: Vec<f32> = perm.iter().map(|&i| x[i]).collect();
        rope_with_table(&mut b, 1, hd, hd, &table, RopeStyle::Interleaved);
        for (j, &i) in perm.iter().enumerate() {
            assert!((a[i] - b[j]).abs() < 1e-6);
        }
    }

    #[test]
    fn short_conv_streams_like_one_pass() {
        let (hidden, kernel) = (3, 3);
        let conv: Vec<f32> = (0..hidden * kernel).map(|i| i as f32 * 0.1 + 0.2).collect();
        let bcx: Vec<f32> = (0..5 * 3 * hidden)
            .map(|i| (i as f32 * 0.7).sin())
            .collect();
        let mut whole = vec![0.0; 5 * hidden];
        short_conv(
            &bcx,
            &conv,
            kernel,
            hidden,
            &mut vec![0.0; 2 * hidden],
            &mut whole,
        );
        let mut state = vec![0.0; 2 * hidden];
        let mut stepped = vec![0.0; 5 * hidden];
        for t in 0..5 {
            short_conv(
                &bcx[t * 3 * hidden..][..3 * hidden],
                &conv,
                kernel,
                hidden,
                &mut state,
                &mut stepped[t * hidden..][..hidden],
            );
        }
        assert_eq!(whole, stepped);
        // The first output only sees the first input, through the last tap.
        let (b, c, x) = (bcx[0], bcx[hidden], bcx[2 * hidden]);
        assert!((whole[0] - c * conv[2] * b * x).abs() < 1e-7);
    }

    #[test]
    fn argmax_takes_the_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[2.0]), 0);
    }
}
