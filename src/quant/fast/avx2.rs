//! AVX2 + FMA copies of the most used kernels of `quant::fast`, written with
//! intrinsics: compiled with AVX2 enabled, the portable bodies still keep
//! their lanes in 128-bit registers. Same algorithm as the portable kernel of
//! each type (levels times x per block, scale applied once per block or
//! sub-block, constant parts through the precomputed sums of x), in 8 lanes
//! of 256 bits with fused multiply-adds.
//!
//! Every function here is `unsafe`: the caller must have checked that the CPU
//! has AVX2 and FMA, and that `row` holds whole blocks for `x.len()` values
//! and `sums` the sums that `RowDot::new` computes for the type.

use super::{f16_to_f32, q5_levels, KBlock};
use crate::quant::{
    q4_0::BlockQ4_0, q4_1::BlockQ4_1, q4_k::BlockQ4K, q5_0::BlockQ5_0, q5_1::BlockQ5_1,
    q5_k::BlockQ5K, q6_k::BlockQ6K, q8_0::BlockQ8_0, util::get_scale_min_k4, GgmlType, QK_K,
};
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Calls `block(i, h)` for every block `i` in order, `h` the accumulator it
/// adds into: 0 for even blocks, 1 for odd ones, two chains the core can
/// overlap. A kernel and its four-input copy both alternate through here,
/// so each input gets the same bits from either.
#[inline(always)]
fn alternate(n: usize, mut block: impl FnMut(usize, usize)) {
    let mut i = 0;
    while i + 2 <= n {
        block(i, 0);
        block(i + 1, 1);
        i += 2;
    }
    if i < n {
        block(i, 0);
    }
}

/// acc + 16 levels already widened to i32 (`lo`: elements 0..8, `hi`:
/// 8..16) times 16 values at `x`, in 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot16_i32(lo: __m256i, hi: __m256i, x: *const f32, acc: __m256) -> __m256 {
    _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(hi),
        _mm256_loadu_ps(x.add(8)),
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_loadu_ps(x), acc),
    )
}

/// acc + sum of 16 unsigned byte levels times 16 values at `x`, in 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot16_u8(q: __m128i, x: *const f32, acc: __m256) -> __m256 {
    let hi = _mm_unpackhi_epi64(q, q);
    dot16_i32(_mm256_cvtepu8_epi32(q), _mm256_cvtepu8_epi32(hi), x, acc)
}

/// As [`dot16_u8`] for signed byte levels.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot16_i8(q: __m128i, x: *const f32, acc: __m256) -> __m256 {
    let hi = _mm_unpackhi_epi64(q, q);
    dot16_i32(_mm256_cvtepi8_epi32(q), _mm256_cvtepi8_epi32(hi), x, acc)
}

/// Sum of 32 unsigned byte levels times 32 values at `x`, in 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot32_u8(q: __m256i, x: *const f32) -> __m256 {
    let lo = dot16_u8(_mm256_castsi256_si128(q), x, _mm256_setzero_ps());
    dot16_u8(_mm256_extracti128_si256(q, 1), x.add(16), lo)
}

/// Sum of a Q4_0/Q4_1 block's levels times x: low nibbles are elements
/// 0..16, high nibbles 16..32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn nibbles32(qs: &[u8; 16], x: *const f32) -> __m256 {
    let mask = _mm_set1_epi8(0x0F);
    let q = _mm_loadu_si128(qs.as_ptr().cast());
    let lo = _mm_and_si128(q, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    dot16_u8(hi, x.add(16), dot16_u8(lo, x, _mm256_setzero_ps()))
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q4_0(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    let blocks: &[BlockQ4_0] = bytemuck::cast_slice(row);
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0.0f32;
    for ((b, xs), &s) in blocks.iter().zip(x.chunks_exact(32)).zip(sums) {
        let d = f16_to_f32(b.d);
        acc = _mm256_fmadd_ps(nibbles32(&b.qs, xs.as_ptr()), _mm256_set1_ps(d), acc);
        offset += d * s;
    }
    hsum(acc) - 8.0 * offset
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q4_1(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    let blocks: &[BlockQ4_1] = bytemuck::cast_slice(row);
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0.0f32;
    for ((b, xs), &s) in blocks.iter().zip(x.chunks_exact(32)).zip(sums) {
        let d = f16_to_f32(b.d);
        acc = _mm256_fmadd_ps(nibbles32(&b.qs, xs.as_ptr()), _mm256_set1_ps(d), acc);
        offset += f16_to_f32(b.m) * s;
    }
    hsum(acc) + offset
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q8_0(row: &[u8], x: &[f32], _sums: &[f32]) -> f32 {
    let blocks: &[BlockQ8_0] = bytemuck::cast_slice(row);
    let mut acc = _mm256_setzero_ps();
    for (b, xs) in blocks.iter().zip(x.chunks_exact(32)) {
        let d = f16_to_f32(b.d);
        let q = b.qs.as_ptr();
        let xp = xs.as_ptr();
        let lo = dot16_i8(_mm_loadu_si128(q.cast()), xp, _mm256_setzero_ps());
        let t = dot16_i8(_mm_loadu_si128(q.add(16).cast()), xp.add(16), lo);
        acc = _mm256_fmadd_ps(t, _mm256_set1_ps(d), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q5_0(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    let blocks: &[BlockQ5_0] = bytemuck::cast_slice(row);
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0.0f32;
    for ((b, xs), &s) in blocks.iter().zip(x.chunks_exact(32)).zip(sums) {
        let d = f16_to_f32(b.d);
        let q = q5_levels(&b.qs, b.qh);
        let t = dot32_u8(_mm256_loadu_si256(q.as_ptr().cast()), xs.as_ptr());
        acc = _mm256_fmadd_ps(t, _mm256_set1_ps(d), acc);
        offset += d * s;
    }
    hsum(acc) - 16.0 * offset
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q5_1(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    let blocks: &[BlockQ5_1] = bytemuck::cast_slice(row);
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0.0f32;
    for ((b, xs), &s) in blocks.iter().zip(x.chunks_exact(32)).zip(sums) {
        let d = f16_to_f32(b.d);
        let q = q5_levels(&b.qs, b.qh);
        let t = dot32_u8(_mm256_loadu_si256(q.as_ptr().cast()), xs.as_ptr());
        acc = _mm256_fmadd_ps(t, _mm256_set1_ps(d), acc);
        offset += f16_to_f32(b.m) * s;
    }
    hsum(acc) + offset
}

/// Bits `shift..` of every byte of `v` under `mask`, moved up to bit 4.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn high_bits(v: __m256i, shift: i32, mask: __m256i) -> __m256i {
    let b = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift));
    _mm256_slli_epi16(_mm256_and_si256(b, mask), 4)
}

/// Q4_K and Q5_K: sub-blocks `2k` and `2k + 1` of a super-block are the low
/// and high nibbles of the 32 bytes `qs[32k..]`, plus (Q5_K) bits `2k` and
/// `2k + 1` of `qh` as bit 4. Adds the level sums to `acc`, returns the min
/// part.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn k_quant(b: KBlock, xs: &[f32], ss: &[f32], acc: &mut __m256) -> f32 {
    let mask = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let high = b.qh.map(|h| _mm256_loadu_si256(h.as_ptr().cast()));
    let mut offset = 0.0f32;
    for k in 0..4 {
        let (sc1, m1) = get_scale_min_k4(2 * k, b.scales);
        let (sc2, m2) = get_scale_min_k4(2 * k + 1, b.scales);
        let q = _mm256_loadu_si256(b.qs.as_ptr().add(32 * k).cast());
        let mut lo = _mm256_and_si256(q, mask);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
        if let Some(h) = high {
            lo = _mm256_or_si256(lo, high_bits(h, 2 * k as i32, one));
            hi = _mm256_or_si256(hi, high_bits(h, 2 * k as i32 + 1, one));
        }
        let xp = xs.as_ptr().add(64 * k);
        *acc = _mm256_fmadd_ps(dot32_u8(lo, xp), _mm256_set1_ps(b.d * sc1 as f32), *acc);
        *acc = _mm256_fmadd_ps(
            dot32_u8(hi, xp.add(32)),
            _mm256_set1_ps(b.d * sc2 as f32),
            *acc,
        );
        offset += b.dmin * (m1 as f32 * ss[2 * k] + m2 as f32 * ss[2 * k + 1]);
    }
    offset
}

/// Q4_K and Q5_K rows: the super-blocks `blocks` yields, through [`k_quant`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn k_quant_row<'a>(
    blocks: impl Iterator<Item = KBlock<'a>>,
    x: &[f32],
    sums: &[f32],
) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0.0f32;
    for ((b, xs), ss) in blocks.zip(x.chunks_exact(QK_K)).zip(sums.chunks_exact(8)) {
        offset += k_quant(b, xs, ss, &mut acc);
    }
    hsum(acc) - offset
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q4_k(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    let blocks: &[BlockQ4K] = bytemuck::cast_slice(row);
    k_quant_row(blocks.iter().map(KBlock::q4_k), x, sums)
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q5_k(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    let blocks: &[BlockQ5K] = bytemuck::cast_slice(row);
    k_quant_row(blocks.iter().map(KBlock::q5_k), x, sums)
}

/// Q6_K: per half of 128, four runs of 32 levels (`ql` nibbles with two
/// `qh` bits each); the first and second 16 of each run have their own scale.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q6_k(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    let blocks: &[BlockQ6K] = bytemuck::cast_slice(row);
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0.0f32;
    for ((b, xs), ss) in blocks
        .iter()
        .zip(x.chunks_exact(QK_K))
        .zip(sums.chunks_exact(16))
    {
        let d = f16_to_f32(b.d);
        let mut ds = [0.0f32; 16];
        for g in 0..16 {
            ds[g] = d * (b.scales[g] as i8) as f32;
            offset += ds[g] * ss[g];
        }
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * h).cast());
            let ql1 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * h + 32).cast());
            let qh = _mm256_loadu_si256(b.qh.as_ptr().add(32 * h).cast());
            let runs = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), high_bits(qh, 0, m2)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), high_bits(qh, 2, m2)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    high_bits(qh, 4, m2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    high_bits(qh, 6, m2),
                ),
            ];
            for (r, q) in runs.into_iter().enumerate() {
                let xp = xs.as_ptr().add(128 * h + 32 * r);
                let g = 8 * h + 2 * r;
                let a = dot16_u8(_mm256_castsi256_si128(q), xp, _mm256_setzero_ps());
                let c = dot16_u8(
                    _mm256_extracti128_si256(q, 1),
                    xp.add(16),
                    _mm256_setzero_ps(),
                );
                acc = _mm256_fmadd_ps(a, _mm256_set1_ps(ds[g]), acc);
                acc = _mm256_fmadd_ps(c, _mm256_set1_ps(ds[g + 1]), acc);
            }
        }
    }
    hsum(acc) - 32.0 * offset
}

/// `super::dot_tile_body` with 256-bit fused multiply-adds written out: the
/// compiler keeps the portable body's 8-lane sums in 128-bit registers even
/// with AVX2 enabled, at about half this speed. Two input rows by four
/// weight rows a step (AVX2's 16 registers hold their 8 sums and the 6
/// loads), so each load feeds more than one multiply-add.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_tile(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    dot_tile_blocked::<2>(x, w, k, out)
}

/// [`dot_tile`] four input rows by four weight rows a step, for CPUs with
/// AVX-512VL: its 32 vector registers hold the 16 sums and 8 loads. Each
/// sum is the same chain of 8-lane multiply-adds as in [`dot_tile`], so the
/// results are bit-equal to it.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
pub(super) unsafe fn dot_tile_avx512vl(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    dot_tile_blocked::<4>(x, w, k, out)
}

/// Every `x_i . w_t` in blocks of `R` input rows by 4 weight rows, each
/// summed in 8 lanes over the first `k - k % 8` elements (fused
/// multiply-adds in element order), then `hsum` plus the scalar tail. Rows
/// left over at either edge go through blocks of one.
#[inline(always)]
unsafe fn dot_tile_blocked<const R: usize>(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    let m = x.len() / k;
    let nr = w.len() / k;
    let full = k - k % 8;
    let tail = |xr: &[f32], wr: &[f32]| -> f32 {
        let mut s = 0.0f32;
        for j in full..k {
            s += xr[j] * wr[j];
        }
        s
    };
    let mut i = 0;
    while i < m {
        let ri = if i + R <= m { R } else { 1 };
        let mut t = 0;
        while t < nr {
            let rt = if t + 4 <= nr { 4 } else { 1 };
            match (ri == R, rt == 4) {
                (true, true) => block::<R, 4>(x, w, k, full, m, i, t, out, &tail),
                (true, false) => block::<R, 1>(x, w, k, full, m, i, t, out, &tail),
                (false, true) => block::<1, 4>(x, w, k, full, m, i, t, out, &tail),
                (false, false) => block::<1, 1>(x, w, k, full, m, i, t, out, &tail),
            }
            t += rt;
        }
        i += ri;
    }
}

/// One `RI` x `RT` block of [`dot_tile_blocked`], from input row `i` and
/// weight row `t`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const RI: usize, const RT: usize>(
    x: &[f32],
    w: &[f32],
    k: usize,
    full: usize,
    m: usize,
    i: usize,
    t: usize,
    out: &mut [f32],
    tail: &impl Fn(&[f32], &[f32]) -> f32,
) {
    let xr: [&[f32]; RI] = std::array::from_fn(|r| &x[(i + r) * k..(i + r + 1) * k]);
    let wr: [&[f32]; RT] = std::array::from_fn(|c| &w[(t + c) * k..(t + c + 1) * k]);
    let mut acc = [[_mm256_setzero_ps(); RT]; RI];
    let mut j = 0;
    while j < full {
        // SAFETY: j + 8 <= full <= k, the length of every row.
        let xv: [__m256; RI] =
            std::array::from_fn(|r| unsafe { _mm256_loadu_ps(xr[r].as_ptr().add(j)) });
        let wv: [__m256; RT] =
            std::array::from_fn(|c| unsafe { _mm256_loadu_ps(wr[c].as_ptr().add(j)) });
        for r in 0..RI {
            for c in 0..RT {
                acc[r][c] = _mm256_fmadd_ps(xv[r], wv[c], acc[r][c]);
            }
        }
        j += 8;
    }
    for r in 0..RI {
        for c in 0..RT {
            out[(t + c) * m + i + r] = hsum(acc[r][c]) + tail(xr[r], wr[c]);
        }
    }
}

/// `super::panel_product` with 256-bit fused multiply-adds: 6 input rows by
/// 16 panel columns a pass (12 accumulators, 2 loads of weights and 6
/// broadcast inputs a step), two passes a panel.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn panel_product(x: &[f32], k: usize, panel: &[f32], out: &mut [f32]) {
    let m = x.len() / k;
    for half in [0, 16] {
        let mut i = 0;
        while i + 6 <= m {
            panel_rows_256::<6>(x, k, panel, out, i, half);
            i += 6;
        }
        while i < m {
            panel_rows_256::<1>(x, k, panel, out, i, half);
            i += 1;
        }
    }
}

/// Rows `i..i + R` of [`panel_product`] by panel columns `c0..c0 + 16`.
#[inline(always)]
unsafe fn panel_rows_256<const R: usize>(
    x: &[f32],
    k: usize,
    panel: &[f32],
    out: &mut [f32],
    i: usize,
    c0: usize,
) {
    use super::PANEL;
    let xp = x[i * k..(i + R) * k].as_ptr();
    let pp = panel.as_ptr().add(c0);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for j in 0..k {
        let p0 = _mm256_loadu_ps(pp.add(j * PANEL));
        let p1 = _mm256_loadu_ps(pp.add(j * PANEL + 8));
        for (r, a) in acc.iter_mut().enumerate() {
            let xb = _mm256_broadcast_ss(&*xp.add(r * k + j));
            a[0] = _mm256_fmadd_ps(xb, p0, a[0]);
            a[1] = _mm256_fmadd_ps(xb, p1, a[1]);
        }
    }
    let o = out[i * PANEL..(i + R) * PANEL].as_mut_ptr().add(c0);
    for (r, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(o.add(r * PANEL), a[0]);
        _mm256_storeu_ps(o.add(r * PANEL + 8), a[1]);
    }
}

/// `super::panel_product` with 512-bit fused multiply-adds: 6 input rows by
/// the panel's 32 columns a step (12 accumulators of AVX-512's 32
/// registers); the same chains as [`panel_product`], so the same bits.
#[target_feature(enable = "avx2,fma,avx512f")]
pub(super) unsafe fn panel_product_avx512(x: &[f32], k: usize, panel: &[f32], out: &mut [f32]) {
    let m = x.len() / k;
    let mut i = 0;
    while i + 6 <= m {
        panel_rows_512::<6>(x, k, panel, out, i);
        i += 6;
    }
    while i < m {
        panel_rows_512::<1>(x, k, panel, out, i);
        i += 1;
    }
}

/// Rows `i..i + R` of [`panel_product_avx512`].
#[inline(always)]
unsafe fn panel_rows_512<const R: usize>(
    x: &[f32],
    k: usize,
    panel: &[f32],
    out: &mut [f32],
    i: usize,
) {
    use super::PANEL;
    let xp = x[i * k..(i + R) * k].as_ptr();
    let pp = panel.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for j in 0..k {
        let p0 = _mm512_loadu_ps(pp.add(j * PANEL));
        let p1 = _mm512_loadu_ps(pp.add(j * PANEL + 16));
        for (r, a) in acc.iter_mut().enumerate() {
            let xb = _mm512_set1_ps(*xp.add(r * k + j));
            a[0] = _mm512_fmadd_ps(xb, p0, a[0]);
            a[1] = _mm512_fmadd_ps(xb, p1, a[1]);
        }
    }
    let o = out[i * PANEL..(i + R) * PANEL].as_mut_ptr();
    for (r, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(o.add(r * PANEL), a[0]);
        _mm512_storeu_ps(o.add(r * PANEL + 16), a[1]);
    }
}

/// Sum of 32 byte products (unsigned `w` times signed `x`) in 8 i32 lanes,
/// each the exact sum of four consecutive products, as one VNNI `dpbusd`
/// gives them: `maddubs` sums pairs to i16 (at most 2 * 255 * 127, no
/// saturation for 4-bit and sign-folded 7-bit levels), `madd` pairs of those.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot32_u8_i8(w: __m256i, x: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
}

/// The weight types of the int8 kernels (`F` below).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;

/// Bytes of a block of type `F`; each starts with its f16 scale d (and
/// Q4_1 with its f16 min after it).
const fn block_bytes(f: u8) -> usize {
    match f {
        Q4_0 => std::mem::size_of::<BlockQ4_0>(),
        Q4_1 => std::mem::size_of::<BlockQ4_1>(),
        _ => std::mem::size_of::<BlockQ8_0>(),
    }
}

/// A block's 32 levels as unsigned bytes, and the input's 32 levels signed
/// to match, so that their byte products are the products of the levels:
/// Q4_0/Q4_1 nibbles (low nibbles are elements 0..16, high ones 16..32), and
/// Q8_0's |w| with w's sign moved onto the input.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn operands<const F: u8>(b: *const u8, x: __m256i) -> (__m256i, __m256i) {
    if F == Q8_0 {
        let w = _mm256_loadu_si256(b.add(2).cast());
        (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
    } else {
        let q = _mm_loadu_si128(b.add(if F == Q4_1 { 4 } else { 2 }).cast());
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(q, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        (_mm256_set_m128i(hi, lo), x)
    }
}

/// The int8 kernels' sum for one row: per block the exact integer sums of
/// the level products in 8 lanes (four products a lane), converted and
/// scaled by d_w d_x into f32 lanes, blocks alternating between two
/// accumulators so consecutive blocks do not wait on one chain; the
/// weight's constant part c_w (Q4_0's -8 d_w, Q4_1's min, none for Q8_0)
/// times s_x in two scalar sums alike; the lanes summed once at the end.
/// Every copy (AVX2, AVX-VNNI, AVX-512 VNNI) gets the same i32 lanes, so
/// all give the same bits, and a row's bits do not depend on the rows
/// computed with it. (Reducing each block's sums horizontally instead, to
/// match a scalar order, made decode 0.6-0.7x as fast on AMD Zen 4.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int8_row<const F: u8>(
    p: *const u8,
    x: &super::int8::Q8Input,
    dot: impl Fn(__m256i, __m256i) -> __m256i,
) -> f32 {
    let (xq, xd, xs) = (x.qs.as_ptr(), &x.d, &x.s);
    let block = |i: usize, acc: __m256, off: f32| {
        let b = p.add(i * block_bytes(F));
        let (w, v) = operands::<F>(b, _mm256_loadu_si256(xq.add(32 * i).cast()));
        let t = _mm256_cvtepi32_ps(dot(w, v));
        let (d, e) = f16_pair([*b, *b.add(1)], [*b.add(2), *b.add(3)]);
        let acc = _mm256_fmadd_ps(t, _mm256_set1_ps(d * xd[i]), acc);
        let off = match F {
            Q4_0 => (-8.0 * d).mul_add(xs[i], off),
            Q4_1 => e.mul_add(xs[i], off),
            _ => off,
        };
        (acc, off)
    };
    let (mut a, mut o) = ([_mm256_setzero_ps(); 2], [0.0f32; 2]);
    alternate(xd.len(), |i, h| (a[h], o[h]) = block(i, a[h], o[h]));
    hsum(_mm256_add_ps(a[0], a[1])) + (o[0] + o[1])
}

/// [`int8_row`] of one row with four inputs (a batch's decode rows): each
/// input's sum takes exactly the operations `int8_row` takes for it (the
/// same bits), while the row's nibbles are unpacked and its f16 scales
/// converted once for the four, the four scales `d_w d_x` are one vector
/// product (lane m broadcast for input m) and the four constant parts one
/// vector fma, from `four`'s interleaved scales and sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int8_row_x4<const F: u8>(
    p: *const u8,
    xs: [&super::int8::Q8Input; 4],
    four: &super::int8::Four,
    dot: impl Fn(__m256i, __m256i) -> __m256i,
) -> [f32; 4] {
    let nb = xs[0].d.len();
    assert!(
        four.d.len() == 4 * nb && four.s.len() == 4 * nb,
        "int8 x4: the interleaved scales are not the inputs'"
    );
    let (fd, fs) = (four.d.as_ptr(), four.s.as_ptr());
    let lane: [__m256i; 4] = std::array::from_fn(|m| _mm256_set1_epi32(m as i32));
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    let mut off = [_mm_setzero_ps(); 2];
    // Block i into accumulator h, as `int8_row` adds it (see `alternate`).
    let block = |i: usize, h: usize| {
        let b = p.add(i * block_bytes(F));
        let (d, e) = f16_pair([*b, *b.add(1)], [*b.add(2), *b.add(3)]);
        let nibbles = operands::<F>(b, _mm256_setzero_si256()).0;
        let scales = _mm_mul_ps(_mm_set1_ps(d), _mm_loadu_ps(fd.add(4 * i)));
        let scales = _mm256_castps128_ps256(scales);
        for (m, x) in xs.iter().enumerate() {
            let xv = _mm256_loadu_si256(x.qs.as_ptr().add(32 * i).cast());
            let (w, v) = if F == Q8_0 {
                operands::<F>(b, xv)
            } else {
                (nibbles, xv)
            };
            let t = _mm256_cvtepi32_ps(dot(w, v));
            let scale = _mm256_permutevar8x32_ps(scales, lane[m]);
            acc[h][m] = _mm256_fmadd_ps(t, scale, acc[h][m]);
        }
        let c = match F {
            Q4_0 => -8.0 * d,
            Q4_1 => e,
            _ => return,
        };
        off[h] = _mm_fmadd_ps(_mm_set1_ps(c), _mm_loadu_ps(fs.add(4 * i)), off[h]);
    };
    alternate(nb, block);
    let (mut o0, mut o1) = ([0.0f32; 4], [0.0f32; 4]);
    _mm_storeu_ps(o0.as_mut_ptr(), off[0]);
    _mm_storeu_ps(o1.as_mut_ptr(), off[1]);
    std::array::from_fn(|m| hsum(_mm256_add_ps(acc[0][m], acc[1][m])) + (o0[m] + o1[m]))
}

/// Rows of type `F` (`out.len()` of them, back to back in `rows`) dotted
/// with the int8 input, one at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int8_rows<const F: u8>(
    rows: &[u8],
    x: &super::int8::Q8Input,
    out: &mut [f32],
    dot: impl Fn(__m256i, __m256i) -> __m256i + Copy,
) {
    let rb = x.d.len() * block_bytes(F);
    assert_eq!(rows.len(), rb * out.len(), "int8 rows: wrong size");
    for (i, o) in out.iter_mut().enumerate() {
        *o = int8_row::<F>(rows.as_ptr().add(i * rb), x, dot);
    }
}

/// Two f16 values (little-endian, `lo` then `hi`) as f32, with F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_pair(lo: [u8; 2], hi: [u8; 2]) -> (f32, f32) {
    let bits = u32::from_le_bytes([lo[0], lo[1], hi[0], hi[1]]);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The int8 row kernels, once per way of computing a block's byte
/// products: AVX2's `maddubs` + `madd`, and the single `dpbusd` of AVX-VNNI
/// or of AVX-512 VNNI (on 256-bit registers). Every way gives the same i32
/// lanes (sums of four consecutive byte products, exact), so the copies are
/// bit-equal. Each also has a copy for one row and four inputs
/// ([`int8_row_x4`]).
macro_rules! int8_kernels {
    ($features:literal, $dot:expr, $q4_0:ident, $q4_1:ident, $q8_0:ident, $x4:ident) => {
        /// One row of type `t` (Q4_0, Q4_1 or Q8_0) with four inputs.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $x4(
            t: GgmlType,
            row: &[u8],
            xs: [&super::int8::Q8Input; 4],
            four: &super::int8::Four,
        ) -> [f32; 4] {
            let blocks = xs[0].d.len();
            assert!(
                xs.iter().all(|x| x.d.len() == blocks),
                "int8 x4: inputs of different lengths"
            );
            let p = row.as_ptr();
            match t {
                GgmlType::Q4_0 => {
                    assert_eq!(row.len(), blocks * block_bytes(Q4_0), "int8 x4: wrong size");
                    int8_row_x4::<Q4_0>(p, xs, four, $dot)
                }
                GgmlType::Q4_1 => {
                    assert_eq!(row.len(), blocks * block_bytes(Q4_1), "int8 x4: wrong size");
                    int8_row_x4::<Q4_1>(p, xs, four, $dot)
                }
                GgmlType::Q8_0 => {
                    assert_eq!(row.len(), blocks * block_bytes(Q8_0), "int8 x4: wrong size");
                    int8_row_x4::<Q8_0>(p, xs, four, $dot)
                }
                _ => unreachable!("int8 x4: no kernel for {t}"),
            }
        }

        // The closures are written here, inside the functions with the
        // features, so they inherit them and inline (a closure outside is a
        // call per block: a fifth of decode).
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $q4_0(rows: &[u8], x: &super::int8::Q8Input, out: &mut [f32]) {
            int8_rows::<Q4_0>(rows, x, out, $dot)
        }

        #[target_feature(enable = $features)]
        pub(super) unsafe fn $q4_1(rows: &[u8], x: &super::int8::Q8Input, out: &mut [f32]) {
            int8_rows::<Q4_1>(rows, x, out, $dot)
        }

        #[target_feature(enable = $features)]
        pub(super) unsafe fn $q8_0(rows: &[u8], x: &super::int8::Q8Input, out: &mut [f32]) {
            int8_rows::<Q8_0>(rows, x, out, $dot)
        }
    };
}

int8_kernels!(
    "avx2,fma,f16c",
    |w, x| dot32_u8_i8(w, x),
    q4_0_int8,
    q4_1_int8,
    q8_0_int8,
    int8_x4
);
int8_kernels!(
    "avx2,fma,f16c,avxvnni",
    |w, x| _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, x),
    q4_0_int8_avxvnni,
    q4_1_int8_avxvnni,
    q8_0_int8_avxvnni,
    int8_x4_avxvnni
);
int8_kernels!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    |w, x| _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x),
    q4_0_int8_avx512vnni,
    q4_1_int8_avx512vnni,
    q8_0_int8_avx512vnni,
    int8_x4_avx512vnni
);

/// Q8_0 rows times a 16-bit input (the vocabulary projection): per block,
/// the 32 weight bytes widened to i16 and multiplied in pairs with the
/// input's levels into i32 lanes (`madd`, or VNNI's `dpwssd` on 512 bits),
/// converted and scaled by `d_w d_x` into f32 lanes, blocks alternating
/// between two accumulators (with one, each block waited on the last's fma:
/// on AMD Zen 1 that made this kernel slower than the f32 one).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_int16(row: &[u8], x: &super::int8::Q16Input) -> f32 {
    let blocks: &[BlockQ8_0] = bytemuck::cast_slice(row);
    let (xq, xd) = (x.qs.as_ptr(), &x.d[..blocks.len()]);
    let block = |i: usize, acc: __m256| {
        let b = &blocks[i];
        let w = b.qs.as_ptr();
        let lo = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm_loadu_si128(w.cast())),
            _mm256_loadu_si256(xq.add(32 * i).cast()),
        );
        let hi = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(16).cast())),
            _mm256_loadu_si256(xq.add(32 * i + 16).cast()),
        );
        let (d, _) = f16_pair(b.d, [0, 0]);
        let t = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
        _mm256_fmadd_ps(t, _mm256_set1_ps(d * xd[i]), acc)
    };
    let mut a = [_mm256_setzero_ps(); 2];
    alternate(blocks.len(), |i, h| a[h] = block(i, a[h]));
    hsum(_mm256_add_ps(a[0], a[1]))
}

/// [`q8_0_int16`] of one row with four inputs: each input's sum takes
/// exactly the operations of its own call (the same bits), the row's bytes
/// widened and its scales converted once for the four, the four `d_w d_x`
/// one vector product from `four`'s interleaved scales.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_int16_x4(
    row: &[u8],
    xs: [&super::int8::Q16Input; 4],
    four: &super::int8::Four,
) -> [f32; 4] {
    let blocks: &[BlockQ8_0] = bytemuck::cast_slice(row);
    for x in xs {
        assert!(x.d.len() >= blocks.len(), "q8_0_int16_x4: a short input");
    }
    assert!(
        four.d.len() >= 4 * blocks.len(),
        "q8_0_int16_x4: short scales"
    );
    let lane: [__m256i; 4] = std::array::from_fn(|m| _mm256_set1_epi32(m as i32));
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    // Block i into accumulator h, as the single kernel adds it (see
    // `alternate`).
    let block = |i: usize, h: usize| {
        let b = &blocks[i];
        let w = b.qs.as_ptr();
        let wlo = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.cast()));
        let whi = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(16).cast()));
        let (d, _) = f16_pair(b.d, [0, 0]);
        let scales = _mm_mul_ps(_mm_set1_ps(d), _mm_loadu_ps(four.d.as_ptr().add(4 * i)));
        let scales = _mm256_castps128_ps256(scales);
        for ((a, x), lane) in acc[h].iter_mut().zip(xs).zip(lane) {
            let xq = x.qs.as_ptr();
            let lo = _mm256_madd_epi16(wlo, _mm256_loadu_si256(xq.add(32 * i).cast()));
            let hi = _mm256_madd_epi16(whi, _mm256_loadu_si256(xq.add(32 * i + 16).cast()));
            let t = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
            *a = _mm256_fmadd_ps(t, _mm256_permutevar8x32_ps(scales, lane), *a);
        }
    };
    alternate(blocks.len(), block);
    std::array::from_fn(|m| hsum(_mm256_add_ps(acc[0][m], acc[1][m])))
}

/// [`q8_0_int16_avx512vnni`] of one row with four inputs, as
/// [`q8_0_int16_x4`] is of [`q8_0_int16`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn q8_0_int16_x4_avx512vnni(
    row: &[u8],
    xs: [&super::int8::Q16Input; 4],
    four: &super::int8::Four,
) -> [f32; 4] {
    let blocks: &[BlockQ8_0] = bytemuck::cast_slice(row);
    for x in xs {
        assert!(x.d.len() >= blocks.len(), "q8_0_int16_x4: a short input");
    }
    assert!(
        four.d.len() >= 4 * blocks.len(),
        "q8_0_int16_x4: short scales"
    );
    let lane: [__m512i; 4] = std::array::from_fn(|m| _mm512_set1_epi32(m as i32));
    let mut acc = [[_mm512_setzero_ps(); 4]; 2];
    // Block i into accumulator h, as the single kernel adds it (see
    // `alternate`).
    let block = |i: usize, h: usize| {
        let b = &blocks[i];
        let w16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(b.qs.as_ptr().cast()));
        let (d, _) = f16_pair(b.d, [0, 0]);
        let scales = _mm_mul_ps(_mm_set1_ps(d), _mm_loadu_ps(four.d.as_ptr().add(4 * i)));
        let scales = _mm512_castps128_ps512(scales);
        for ((a, x), lane) in acc[h].iter_mut().zip(xs).zip(lane) {
            let p = _mm512_dpwssd_epi32(
                _mm512_setzero_si512(),
                w16,
                _mm512_loadu_si512(x.qs.as_ptr().add(32 * i).cast()),
            );
            let scale = _mm512_permutexvar_ps(lane, scales);
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, *a);
        }
    };
    alternate(blocks.len(), block);
    std::array::from_fn(|m| _mm512_reduce_add_ps(_mm512_add_ps(acc[0][m], acc[1][m])))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn q8_0_int16_avx512vnni(row: &[u8], x: &super::int8::Q16Input) -> f32 {
    let blocks: &[BlockQ8_0] = bytemuck::cast_slice(row);
    let (xq, xd) = (x.qs.as_ptr(), &x.d[..blocks.len()]);
    let block = |i: usize, acc: __m512| {
        let b = &blocks[i];
        let w16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(b.qs.as_ptr().cast()));
        let p = _mm512_dpwssd_epi32(
            _mm512_setzero_si512(),
            w16,
            _mm512_loadu_si512(xq.add(32 * i).cast()),
        );
        let (d, _) = f16_pair(b.d, [0, 0]);
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(d * xd[i]), acc)
    };
    let mut a = [_mm512_setzero_ps(); 2];
    alternate(blocks.len(), |i, h| a[h] = block(i, a[h]));
    _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]))
}

/// Asks for the cache lines of the group block `AHEAD` bytes past `b`
/// (`bb` bytes), which a repacked kernel reads a few blocks later: weights
/// streamed from memory arrive in time, where the hardware prefetcher
/// alone left the kernels waiting (AMD Zen 1; BENCHMARKS.md, forty-fifth
/// session). Prefetching past the end of the matrix is harmless.
#[inline(always)]
unsafe fn prefetch_ahead(b: *const u8, bb: usize) {
    const AHEAD: usize = 1024;
    for line in (0..bb).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(AHEAD + line).cast());
    }
}

/// The repacked kernels ([`super::rows8`]): eight rows a group, a lane per
/// row. A Q4 block's chunks are unpacked into low and high nibbles and
/// multiplied with the input's 4-byte groups broadcast to every lane; the
/// eight pair sums a lane gets stay below 2^15 (8 x 2 x 15 x 127), so they
/// add in i16 and one `madd` makes each row's i32 sum. Q8_0's pair sums
/// reach 2 x 127 x 127, so each chunk is widened to i32 before adding.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows8(t: GgmlType, packed: &[u8], x: &super::int8::Q8Input, out: &mut [f32]) {
    super::rows8::check(t, packed, x.d.len(), out);
    match t {
        GgmlType::Q4_0 => rows8_typed::<Q4_0>(packed, x, out),
        GgmlType::Q4_1 => rows8_typed::<Q4_1>(packed, x, out),
        _ => rows8_typed::<Q8_0>(packed, x, out),
    }
}

/// The repacked kernels' common part: per group of eight rows, per block
/// `i` (at `b`), `sums(b, i)` gives the rows' exact integer sums (lanes in
/// `order`'s row order, natural where `None`), scaled by `d_w d_x[i]` into
/// two alternating accumulators, the constant parts times `s_x[i]` beside
/// them, as `rows8` describes; the rows' products stored in natural order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8_groups<const F: u8>(
    packed: &[u8],
    xd: &[f32],
    xs: &[f32],
    out: &mut [f32],
    order: Option<__m256i>,
    sums: impl Fn(*const u8, usize) -> __m256i,
) {
    let nb = xd.len();
    let bb = 8 * block_bytes(F);
    let arrange = |v: __m256| order.map_or(v, |o| _mm256_permutevar8x32_ps(v, o));
    for (g, o) in out.chunks_exact_mut(8).enumerate() {
        let p = packed.as_ptr().add(g * nb * bb);
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut off = [_mm256_setzero_ps(); 2];
        alternate(nb, |i, h| {
            let b = p.add(i * bb);
            prefetch_ahead(b, bb);
            let d = arrange(_mm256_cvtph_ps(_mm_loadu_si128(b.cast())));
            let t = _mm256_cvtepi32_ps(sums(b, i));
            acc[h] = _mm256_fmadd_ps(t, _mm256_mul_ps(d, _mm256_set1_ps(xd[i])), acc[h]);
            let c = match F {
                Q4_0 => _mm256_mul_ps(d, _mm256_set1_ps(-8.0)),
                Q4_1 => arrange(_mm256_cvtph_ps(_mm_loadu_si128(b.add(16).cast()))),
                _ => return,
            };
            off[h] = _mm256_fmadd_ps(c, _mm256_set1_ps(xs[i]), off[h]);
        });
        let r = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(off[0], off[1]));
        _mm256_storeu_ps(o.as_mut_ptr(), arrange(r));
    }
}

/// Bytes before a repacked block's levels: the eight scales (and mins).
const fn rows8_levels(f: u8) -> usize {
    if f == Q4_1 {
        32
    } else {
        16
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8_typed<const F: u8>(packed: &[u8], x: &super::int8::Q8Input, out: &mut [f32]) {
    let xq = x.qs.as_ptr().cast::<u8>();
    let bcast = |at: usize| _mm256_set1_epi32(xq.add(at).cast::<i32>().read_unaligned());
    let (mask, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
    rows8_groups::<F>(packed, &x.d, &x.s, out, None, |b, i| {
        let q = b.add(rows8_levels(F));
        let mut s = _mm256_setzero_si256();
        if F == Q8_0 {
            for c in 0..8 {
                let w = _mm256_loadu_si256(q.add(32 * c).cast());
                let v = bcast(32 * i + 4 * c);
                let p = dot32_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(v, w));
                s = _mm256_add_epi32(s, p);
            }
            return s;
        }
        for c in 0..4 {
            let w = _mm256_loadu_si256(q.add(32 * c).cast());
            let lo = _mm256_and_si256(w, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo, bcast(32 * i + 4 * c)));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi, bcast(32 * i + 16 + 4 * c)));
        }
        _mm256_madd_epi16(s, ones)
    })
}

/// The repacked rows times a 16-bit input ([`super::rows8`]'s vocabulary
/// projection): each 32-byte chunk's levels (Q4: its low and its high
/// nibbles) in halves, rows 0-3 and 4-7 of 4 levels each, widened to i16
/// and multiplied in pairs with the chunk's 4 input levels (`madd`); the
/// pair sums are exact in i32 (at most 8 x 2 x 127 x 32767 a lane). One
/// horizontal add a block pairs them into the rows' sums, in the order rows
/// 0 1 4 5 2 3 6 7, which the scales are permuted to match and the result
/// back from.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows8_int16(
    t: GgmlType,
    packed: &[u8],
    x: &super::int8::Q16Input,
    out: &mut [f32],
) {
    super::rows8::check(t, packed, x.d.len(), out);
    match t {
        GgmlType::Q4_0 => rows8_int16_typed::<Q4_0>(packed, x, out),
        GgmlType::Q4_1 => rows8_int16_typed::<Q4_1>(packed, x, out),
        _ => rows8_int16_typed::<Q8_0>(packed, x, out),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8_int16_typed<const F: u8>(
    packed: &[u8],
    x: &super::int8::Q16Input,
    out: &mut [f32],
) {
    let xq = x.qs.as_ptr();
    let order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    let mask = _mm256_set1_epi8(0x0F);
    // Rows 0-3 and 4-7 of 16 bytes of levels (`wl`, `wh`, widened) times
    // the input's 4 levels at `at`, into `lo` and `hi`.
    let madd4 = |lo: &mut __m256i, hi: &mut __m256i, wl: __m256i, wh: __m256i, at: usize| {
        let v = _mm256_set1_epi64x(xq.add(at).cast::<i64>().read_unaligned());
        *lo = _mm256_add_epi32(*lo, _mm256_madd_epi16(wl, v));
        *hi = _mm256_add_epi32(*hi, _mm256_madd_epi16(wh, v));
    };
    rows8_groups::<F>(packed, &x.d, &x.s, out, Some(order), |b, i| {
        let q = b.add(rows8_levels(F));
        let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        if F == Q8_0 {
            for c in 0..8 {
                let w = q.add(32 * c);
                let wl = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.cast()));
                let wh = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(16).cast()));
                madd4(&mut lo, &mut hi, wl, wh, 32 * i + 4 * c);
            }
        } else {
            for c in 0..4 {
                let w = _mm256_loadu_si256(q.add(32 * c).cast());
                let low = _mm256_and_si256(w, mask);
                let high = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
                for (n, e) in [(low, 4 * c), (high, 16 + 4 * c)] {
                    let wl = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(n));
                    let wh = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(n, 1));
                    madd4(&mut lo, &mut hi, wl, wh, 32 * i + e);
                }
            }
        }
        _mm256_hadd_epi32(lo, hi)
    })
}

/// Inputs a pass of [`rows8_many`] over a group's blocks serves.
const MANY_TILE: usize = 4;

/// [`rows8`] of several inputs (a batch's decode rows) into `out` ([rows,
/// inputs]): per group of eight rows and tile of [`MANY_TILE`] inputs, each
/// chunk of a block's levels is loaded and unpacked once for the tile. Each
/// input's integer sums are exact (however their products are grouped), and
/// its scaling and accumulators are `rows8`'s: the products' blocks
/// alternate between two accumulators, the constant parts' too (in a second
/// pass over the scales, which keeps the first pass's registers for the
/// sums), and the row's value is `(acc_0 + acc_1) + (off_0 + off_1)`; so
/// every input gets the bits it gets alone. `dot` adds a chunk's byte
/// products (unsigned levels times signed input bytes, four a lane) to the
/// lanes' i32 sums: AVX2's `maddubs` + `madd`, or one VNNI `dpbusd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8_many_typed<const F: u8>(
    packed: &[u8],
    xs: &[&super::int8::Q8Input],
    out: &mut [f32],
    dot: impl Fn(__m256i, __m256i, __m256i) -> __m256i + Copy,
) {
    const T: usize = MANY_TILE;
    let (m, nb) = (xs.len(), xs[0].d.len());
    let bb = 8 * block_bytes(F);
    let mask = _mm256_set1_epi8(0x0F);
    for (g, o) in out.chunks_exact_mut(8 * m).enumerate() {
        let p = packed.as_ptr().add(g * nb * bb);
        for t0 in (0..m).step_by(T) {
            let tile = T.min(m - t0);
            // A short last tile repeats its last input (results dropped).
            let tx: [&super::int8::Q8Input; T] = std::array::from_fn(|j| xs[t0 + j.min(tile - 1)]);
            let xq = tx.map(|x| x.qs.as_ptr().cast::<u8>());
            let (xd, xsum) = (tx.map(|x| x.d.as_ptr()), tx.map(|x| x.s.as_ptr()));
            let bcast = |j: usize, at: usize| {
                _mm256_set1_epi32(xq[j].add(at).cast::<i32>().read_unaligned())
            };
            let mut acc = [[_mm256_setzero_ps(); 2]; T];
            // Block i into accumulator h: `alternate`'s order, written out
            // (as a closure the block is not inlined and the accumulators
            // live in memory). Each input's sum in two chains (low and high
            // nibbles; Q8_0's even and odd chunks) so the tile's sums
            // overlap.
            macro_rules! block {
                ($i:expr, $h:literal) => {{
                    let i = $i;
                    let b = p.add(i * bb);
                    let q = b.add(rows8_levels(F));
                    let mut s = [[_mm256_setzero_si256(); 2]; T];
                    if F == Q8_0 {
                        for c in 0..8 {
                            let w = _mm256_loadu_si256(q.add(32 * c).cast());
                            let wa = _mm256_sign_epi8(w, w);
                            for (j, s) in s.iter_mut().enumerate() {
                                let v = _mm256_sign_epi8(bcast(j, 32 * i + 4 * c), w);
                                s[c % 2] = dot(s[c % 2], wa, v);
                            }
                        }
                    } else {
                        for c in 0..4 {
                            let w = _mm256_loadu_si256(q.add(32 * c).cast());
                            let lo = _mm256_and_si256(w, mask);
                            let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
                            for (j, s) in s.iter_mut().enumerate() {
                                s[0] = dot(s[0], lo, bcast(j, 32 * i + 4 * c));
                                s[1] = dot(s[1], hi, bcast(j, 32 * i + 16 + 4 * c));
                            }
                        }
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(b.cast()));
                    for j in 0..T {
                        let t = _mm256_cvtepi32_ps(_mm256_add_epi32(s[j][0], s[j][1]));
                        let scale = _mm256_mul_ps(d, _mm256_set1_ps(*xd[j].add(i)));
                        acc[j][$h] = _mm256_fmadd_ps(t, scale, acc[j][$h]);
                    }
                }};
            }
            let mut i = 0;
            while i + 2 <= nb {
                block!(i, 0);
                block!(i + 1, 1);
                i += 2;
            }
            if i < nb {
                block!(i, 0);
            }
            // The constant parts, in the same alternation.
            let mut off = [[_mm256_setzero_ps(); 2]; T];
            if F != Q8_0 {
                for i in 0..nb {
                    let b = p.add(i * bb);
                    let c = if F == Q4_0 {
                        _mm256_mul_ps(
                            _mm256_cvtph_ps(_mm_loadu_si128(b.cast())),
                            _mm256_set1_ps(-8.0),
                        )
                    } else {
                        _mm256_cvtph_ps(_mm_loadu_si128(b.add(16).cast()))
                    };
                    // `alternate` gives an odd last block accumulator 0,
                    // as the parity does.
                    let h = i % 2;
                    for j in 0..T {
                        off[j][h] = _mm256_fmadd_ps(c, _mm256_set1_ps(*xsum[j].add(i)), off[j][h]);
                    }
                }
            }
            for j in 0..tile {
                let r = _mm256_add_ps(
                    _mm256_add_ps(acc[j][0], acc[j][1]),
                    _mm256_add_ps(off[j][0], off[j][1]),
                );
                let mut lanes = [0.0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), r);
                for (row, v) in lanes.iter().enumerate() {
                    o[row * m + t0 + j] = *v;
                }
            }
        }
    }
}

/// [`rows8_many_typed`] for `t`, once per way of adding a chunk's byte
/// products (bit-equal copies).
macro_rules! rows8_many_kernel {
    ($features:literal, $name:ident, $dot:expr) => {
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(
            t: GgmlType,
            packed: &[u8],
            xs: &[&super::int8::Q8Input],
            out: &mut [f32],
        ) {
            super::rows8::check_many(t, packed, xs, out);
            match t {
                GgmlType::Q4_0 => rows8_many_typed::<Q4_0>(packed, xs, out, $dot),
                GgmlType::Q4_1 => rows8_many_typed::<Q4_1>(packed, xs, out, $dot),
                _ => rows8_many_typed::<Q8_0>(packed, xs, out, $dot),
            }
        }
    };
}

rows8_many_kernel!("avx2,fma,f16c", rows8_many, |s, w, x| {
    _mm256_add_epi32(s, dot32_u8_i8(w, x))
});
rows8_many_kernel!("avx2,fma,f16c,avxvnni", rows8_many_avxvnni, |s, w, x| {
    _mm256_dpbusd_avx_epi32(s, w, x)
});
rows8_many_kernel!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    rows8_many_avx512vnni,
    |s, w, x| _mm256_dpbusd_epi32(s, w, x)
);

/// [`rows8_many`] on 512-bit registers for Q4_0 and Q4_1: two groups (16
/// rows) a register, each input's four-byte group broadcast once for both,
/// the same lanes' operations as the 256-bit copies (the same bits); an
/// odd last group, and Q8_0 (AVX-512 has no byte `sign`), through
/// [`rows8_many_avx512vnni`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows8_many_zmm(
    t: GgmlType,
    packed: &[u8],
    xs: &[&super::int8::Q8Input],
    out: &mut [f32],
) {
    super::rows8::check_many(t, packed, xs, out);
    let (m, nb) = (xs.len(), xs[0].d.len());
    let pairs = match t {
        GgmlType::Q4_0 | GgmlType::Q4_1 => out.len() / (16 * m),
        _ => 0,
    };
    let (bytes, rows) = (16 * nb * t.block_bytes(), 16 * m);
    match t {
        GgmlType::Q4_0 => {
            rows8_many_zmm_typed::<Q4_0>(&packed[..pairs * bytes], xs, &mut out[..pairs * rows])
        }
        GgmlType::Q4_1 => {
            rows8_many_zmm_typed::<Q4_1>(&packed[..pairs * bytes], xs, &mut out[..pairs * rows])
        }
        _ => {}
    }
    if out.len() > pairs * rows {
        rows8_many_avx512vnni(t, &packed[pairs * bytes..], xs, &mut out[pairs * rows..]);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows8_many_zmm_typed<const F: u8>(
    packed: &[u8],
    xs: &[&super::int8::Q8Input],
    out: &mut [f32],
) {
    const T: usize = MANY_TILE;
    let (m, nb) = (xs.len(), xs[0].d.len());
    let bb = 8 * block_bytes(F);
    let mask = _mm512_set1_epi8(0x0F);
    // Group g's and g + 1's 16 bytes at `at` of block i as 16 f32 lanes.
    let halves = |p: *const u8, q: *const u8| {
        _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(p.cast())),
            _mm_loadu_si128(q.cast()),
            1,
        ))
    };
    for (g, o) in out.chunks_exact_mut(16 * m).enumerate() {
        let p0 = packed.as_ptr().add(2 * g * nb * bb);
        let p1 = p0.add(nb * bb);
        for t0 in (0..m).step_by(T) {
            let tile = T.min(m - t0);
            let tx: [&super::int8::Q8Input; T] = std::array::from_fn(|j| xs[t0 + j.min(tile - 1)]);
            let xq = tx.map(|x| x.qs.as_ptr().cast::<u8>());
            let (xd, xsum) = (tx.map(|x| x.d.as_ptr()), tx.map(|x| x.s.as_ptr()));
            let bcast = |j: usize, at: usize| {
                _mm512_set1_epi32(xq[j].add(at).cast::<i32>().read_unaligned())
            };
            let mut acc = [[_mm512_setzero_ps(); 2]; T];
            // As in `rows8_many_typed`.
            macro_rules! block {
                ($i:expr, $h:literal) => {{
                    let i = $i;
                    let (b0, b1) = (p0.add(i * bb), p1.add(i * bb));
                    let (q0, q1) = (b0.add(rows8_levels(F)), b1.add(rows8_levels(F)));
                    let mut s = [[_mm512_setzero_si512(); 2]; T];
                    for c in 0..4 {
                        let w = _mm512_inserti64x4(
                            _mm512_castsi256_si512(_mm256_loadu_si256(q0.add(32 * c).cast())),
                            _mm256_loadu_si256(q1.add(32 * c).cast()),
                            1,
                        );
                        let lo = _mm512_and_si512(w, mask);
                        let hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
                        for (j, s) in s.iter_mut().enumerate() {
                            s[0] = _mm512_dpbusd_epi32(s[0], lo, bcast(j, 32 * i + 4 * c));
                            s[1] = _mm512_dpbusd_epi32(s[1], hi, bcast(j, 32 * i + 16 + 4 * c));
                        }
                    }
                    let d = halves(b0, b1);
                    for j in 0..T {
                        let t = _mm512_cvtepi32_ps(_mm512_add_epi32(s[j][0], s[j][1]));
                        let scale = _mm512_mul_ps(d, _mm512_set1_ps(*xd[j].add(i)));
                        acc[j][$h] = _mm512_fmadd_ps(t, scale, acc[j][$h]);
                    }
                }};
            }
            let mut i = 0;
            while i + 2 <= nb {
                block!(i, 0);
                block!(i + 1, 1);
                i += 2;
            }
            if i < nb {
                block!(i, 0);
            }
            let mut off = [[_mm512_setzero_ps(); 2]; T];
            for i in 0..nb {
                let (b0, b1) = (p0.add(i * bb), p1.add(i * bb));
                let c = if F == Q4_0 {
                    _mm512_mul_ps(halves(b0, b1), _mm512_set1_ps(-8.0))
                } else {
                    halves(b0.add(16), b1.add(16))
                };
                let h = i % 2;
                for j in 0..T {
                    off[j][h] = _mm512_fmadd_ps(c, _mm512_set1_ps(*xsum[j].add(i)), off[j][h]);
                }
            }
            for j in 0..tile {
                let r = _mm512_add_ps(
                    _mm512_add_ps(acc[j][0], acc[j][1]),
                    _mm512_add_ps(off[j][0], off[j][1]),
                );
                let mut lanes = [0.0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), r);
                for (row, v) in lanes.iter().enumerate() {
                    o[row * m + t0 + j] = *v;
                }
            }
        }
    }
}
