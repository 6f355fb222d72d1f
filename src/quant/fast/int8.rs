//! Row dot products with the input rounded to 8-bit integers, as llama.cpp's
//! CPU backend does for its Q4_0, Q4_1 and Q8_0 weights: the input is cut
//! into blocks of 32 with one f32 scale `d = max|x| / 127` and levels
//! `round(x / d)` (ggml's Q8_1 activations), so each block's sum of products
//! is a sum of integer products, scaled once. Faster than the f32 kernels of
//! `quant::fast` (the byte products need no conversions) and less exact: the
//! input's rounding adds a relative error of about 2^-9 per value to each
//! sum, which the tests bound. The exact kernels stay the reference; callers
//! choose this path ([`crate::tensor::Activations::Int8`]).

use super::f16_to_f32;
use crate::quant::{q4_0::BlockQ4_0, q4_1::BlockQ4_1, q8_0::BlockQ8_0, GgmlType};

/// The input in blocks of 32 levels.
pub struct Q8Input {
    /// Levels, 32 per block.
    pub qs: Vec<i8>,
    /// Each block's scale.
    pub d: Vec<f32>,
    /// Each block's `d * sum(levels)`: the weight formats' constant parts
    /// (Q4_0's `- 8`, Q4_1's min) multiply it.
    pub s: Vec<f32>,
}

impl Q8Input {
    /// `x` in blocks; `x.len()` must be a multiple of 32.
    pub fn new(x: &[f32]) -> Q8Input {
        assert!(x.len().is_multiple_of(32), "Q8Input: not whole blocks");
        let blocks = x.len() / 32;
        let mut q = Q8Input {
            qs: vec![0; x.len()],
            d: Vec::with_capacity(blocks),
            s: Vec::with_capacity(blocks),
        };
        // The rounding is one instruction from SSE4.1 on (a libm call per
        // value in the baseline build): the same body compiled with AVX2.
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            #[target_feature(enable = "avx2")]
            unsafe fn fill_avx2(x: &[f32], q: &mut Q8Input) {
                fill(x, q)
            }
            // SAFETY: the CPU reports AVX2.
            unsafe { fill_avx2(x, &mut q) };
            return q;
        }
        fill(x, &mut q);
        q
    }
}

/// [`Q8Input::new`]'s blocks of `x` into `q` (levels zeroed, scales and
/// sums empty).
#[inline(always)]
fn fill(x: &[f32], q: &mut Q8Input) {
    for (xb, qb) in x.chunks_exact(32).zip(q.qs.chunks_exact_mut(32)) {
        let d = block_max_abs(xb) / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        // Ties to even, which vectorises (ties away from zero does not).
        for (l, &v) in qb.iter_mut().zip(xb) {
            *l = (v * id).round_ties_even() as i8;
        }
        let sum: i32 = qb.iter().map(|&l| l as i32).sum();
        q.d.push(d);
        q.s.push(d * sum as f32);
    }
}

/// The largest |x| of a block of 32, in 8 lanes (a fold over one value at a
/// time does not vectorise).
#[inline(always)]
fn block_max_abs(xb: &[f32]) -> f32 {
    let mut m = [0.0f32; 8];
    for c in xb.chunks_exact(8) {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    m.iter().fold(0.0f32, |a, &b| a.max(b))
}

/// The input in blocks of 32 16-bit levels (`d = max|x| / 32767`): for
/// the vocabulary projection, where 8-bit inputs move the logits too far
/// (see `tensor::Activations::Int16`); 2^-16 of each block's largest value
/// per element, still integer products.
pub struct Q16Input {
    /// Levels, 32 per block.
    pub qs: Vec<i16>,
    /// Each block's scale.
    pub d: Vec<f32>,
    /// Each block's `d * sum(levels)`, for the constant parts of Q4_0 and
    /// Q4_1 weights (the repacked kernels of `rows8`).
    pub s: Vec<f32>,
}

impl Q16Input {
    /// `x` in blocks; `x.len()` must be a multiple of 32.
    pub fn new(x: &[f32]) -> Q16Input {
        assert!(x.len().is_multiple_of(32), "Q16Input: not whole blocks");
        let mut q = Q16Input {
            qs: vec![0; x.len()],
            d: Vec::with_capacity(x.len() / 32),
            s: Vec::with_capacity(x.len() / 32),
        };
        for (xb, qb) in x.chunks_exact(32).zip(q.qs.chunks_exact_mut(32)) {
            let d = block_max_abs(xb) / 32767.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            for (l, &v) in qb.iter_mut().zip(xb) {
                *l = (v * id).round_ties_even() as i16;
            }
            let sum: i32 = qb.iter().map(|&l| l as i32).sum();
            q.d.push(d);
            q.s.push(d * sum as f32);
        }
        q
    }
}

/// A Q8_0 row kernel over a 16-bit input.
pub type Kernel16 = fn(&[u8], &Q16Input) -> f32;

/// A Q8_0 row kernel over four 16-bit inputs (and their [`Four`]): what
/// its [`Kernel16`] gives each, bit for bit.
pub type Kernel16x4 = fn(&[u8], [&Q16Input; 4], &Four) -> [f32; 4];

/// Four inputs' block scales (and, for 8-bit inputs, block sums)
/// interleaved, `d[4 block + input]`: one vector load gives the four-input
/// kernels a block's four, where four scalar loads and broadcasts cost as
/// much as a block's products.
pub struct Four {
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

impl Four {
    /// From each input's scales and sums (`s` empty: none).
    pub fn new(d: [&[f32]; 4], s: [&[f32]; 4]) -> Four {
        let interleave = |v: [&[f32]; 4]| -> Vec<f32> {
            (0..v[0].len()).flat_map(|i| v.map(|x| x[i])).collect()
        };
        for m in 1..4 {
            assert_eq!(d[m].len(), d[0].len(), "Four: inputs of different lengths");
            assert_eq!(s[m].len(), s[0].len(), "Four: inputs of different lengths");
        }
        Four {
            d: interleave(d),
            s: interleave(s),
        }
    }

    /// Of four 8-bit inputs.
    pub fn of_q8(xs: [&Q8Input; 4]) -> Four {
        Four::new(xs.map(|x| &x.d[..]), xs.map(|x| &x.s[..]))
    }

    /// Of four 16-bit inputs.
    pub fn of_q16(xs: [&Q16Input; 4]) -> Four {
        Four::new(xs.map(|x| &x.d[..]), [&[]; 4])
    }
}

/// The copies of the 16-bit-input kernel for `t` this CPU runs, each with
/// its four-input copy where it has one (the SIMD ones), best last; empty
/// for types without one. Q4_0 and Q4_1 have only the portable row copy:
/// their SIMD ones are over repacked rows (`rows8`), which a vocabulary
/// projection of whole groups of eight rows always is on the CPU.
pub fn variants16(t: GgmlType) -> Vec<(Kernel16, Option<Kernel16x4>)> {
    match t {
        GgmlType::Q4_0 => return vec![(q4_0_16, None)],
        GgmlType::Q4_1 => return vec![(q4_1_16, None)],
        GgmlType::Q8_0 => {}
        _ => return Vec::new(),
    }
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v: Vec<(Kernel16, Option<Kernel16x4>)> =
        vec![(|r, q| q8_0_16(bytemuck::cast_slice(r), q), None)];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        // SAFETY (each): listed only when the CPU reports the instructions;
        // RowDot checked the row size against the input's length.
        if has!("avx2") && has!("fma") && has!("f16c") {
            v.push((
                |r, q| unsafe { super::avx2::q8_0_int16(r, q) },
                Some(|r, xs, f| unsafe { super::avx2::q8_0_int16_x4(r, xs, f) }),
            ));
            if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
                v.push((
                    |r, q| unsafe { super::avx2::q8_0_int16_avx512vnni(r, q) },
                    Some(|r, xs, f| unsafe { super::avx2::q8_0_int16_x4_avx512vnni(r, xs, f) }),
                ));
            }
        }
    }
    v
}

/// A Q4 row over a 16-bit input: per block `acc = fma(S, d_w d_x, acc)`
/// and `off = fma(c_w, s_x, off)`, as [`rows_with`] does for 8-bit inputs.
fn q4_16<B: bytemuck::Pod>(
    row: &[u8],
    x: &Q16Input,
    block: impl Fn(&B) -> (&[u8; 16], f32, f32),
) -> f32 {
    let blocks: &[B] = bytemuck::cast_slice(row);
    let (mut acc, mut off) = (0.0f32, 0.0f32);
    for (i, b) in blocks.iter().enumerate() {
        let (qs, d, c) = block(b);
        let sum = nibble_dot(qs, &x.qs[32 * i..32 * i + 32]);
        acc = (sum as f32).mul_add(d * x.d[i], acc);
        off = c.mul_add(x.s[i], off);
    }
    acc + off
}

fn q4_0_16(row: &[u8], x: &Q16Input) -> f32 {
    q4_16(row, x, |b: &BlockQ4_0| {
        let d = f16_to_f32(b.d);
        (&b.qs, d, -8.0 * d)
    })
}

fn q4_1_16(row: &[u8], x: &Q16Input) -> f32 {
    q4_16(row, x, |b: &BlockQ4_1| {
        (&b.qs, f16_to_f32(b.d), f16_to_f32(b.m))
    })
}

fn q8_0_16(blocks: &[BlockQ8_0], x: &Q16Input) -> f32 {
    let mut acc = 0.0f32;
    for ((b, xq), &d) in blocks.iter().zip(x.qs.chunks_exact(32)).zip(&x.d) {
        let dot: i32 =
            b.qs.iter()
                .zip(xq)
                .map(|(&w, &v)| w as i8 as i32 * v as i32)
                .sum();
        acc += f16_to_f32(b.d) * d * dot as f32;
    }
    acc
}

/// A kernel over a quantised input: (rows, input, out): the dot products
/// of `out.len()` rows, back to back in `rows`, with the input.
pub type Kernel = fn(&[u8], &Q8Input, &mut [f32]);

/// The copies of the int8 kernel for `t` this CPU runs, best last; empty
/// for types without one.
pub fn variants(t: GgmlType) -> Vec<Kernel> {
    // Only x86-64 adds variants below.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v: Vec<Kernel> = match t {
        GgmlType::Q4_0 => vec![q4_0],
        GgmlType::Q4_1 => vec![q4_1],
        GgmlType::Q8_0 => vec![q8_0],
        _ => return Vec::new(),
    };
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            // SAFETY (each): listed only when the CPU reports the
            // instructions; the kernels check the rows' size.
            match t {
                GgmlType::Q4_0 => v.push(|r, q, o| unsafe { super::avx2::q4_0_int8(r, q, o) }),
                GgmlType::Q4_1 => v.push(|r, q, o| unsafe { super::avx2::q4_1_int8(r, q, o) }),
                GgmlType::Q8_0 => v.push(|r, q, o| unsafe { super::avx2::q8_0_int8(r, q, o) }),
                _ => {}
            }
            // The same integer sums in one instruction a block (bit-equal).
            let vnni = if has!("avxvnni") {
                Some(0)
            } else if has!("avx512vnni") && has!("avx512vl") {
                Some(1)
            } else {
                None
            };
            match (t, vnni) {
                (GgmlType::Q4_0, Some(0)) => {
                    v.push(|r, q, o| unsafe { super::avx2::q4_0_int8_avxvnni(r, q, o) })
                }
                (GgmlType::Q4_1, Some(0)) => {
                    v.push(|r, q, o| unsafe { super::avx2::q4_1_int8_avxvnni(r, q, o) })
                }
                (GgmlType::Q8_0, Some(0)) => {
                    v.push(|r, q, o| unsafe { super::avx2::q8_0_int8_avxvnni(r, q, o) })
                }
                (GgmlType::Q4_0, Some(1)) => {
                    v.push(|r, q, o| unsafe { super::avx2::q4_0_int8_avx512vnni(r, q, o) })
                }
                (GgmlType::Q4_1, Some(1)) => {
                    v.push(|r, q, o| unsafe { super::avx2::q4_1_int8_avx512vnni(r, q, o) })
                }
                (GgmlType::Q8_0, Some(1)) => {
                    v.push(|r, q, o| unsafe { super::avx2::q8_0_int8_avx512vnni(r, q, o) })
                }
                _ => {}
            }
        }
    }
    v
}

/// A kernel for one row of type `t` and four inputs: what [`Kernel`]
/// gives each input, bit for bit, for less than four times its work.
pub type Kernel4 = fn(GgmlType, &[u8], [&Q8Input; 4], &Four) -> [f32; 4];

/// The copies of the four-input kernel this CPU runs for `t`, best last;
/// empty for types without an int8 kernel, or without a SIMD copy here (the
/// caller then runs [`variants`]' kernel once per input).
pub fn variants4(t: GgmlType) -> Vec<Kernel4> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v: Vec<Kernel4> = Vec::new();
    if !matches!(t, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0) {
        return v;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            // SAFETY (each): listed only when the CPU reports the
            // instructions; the kernels check the row's and inputs' sizes.
            v.push(|t, r, xs, f| unsafe { super::avx2::int8_x4(t, r, xs, f) });
            if has!("avxvnni") {
                v.push(|t, r, xs, f| unsafe { super::avx2::int8_x4_avxvnni(t, r, xs, f) });
            } else if has!("avx512vnni") && has!("avx512vl") {
                v.push(|t, r, xs, f| unsafe { super::avx2::int8_x4_avx512vnni(t, r, xs, f) });
            }
        }
    }
    v
}

/// The portable copy, per row: for each block, the exact integer sum S of
/// its level products and the block's scale d_w and constant part c_w
/// (weight = d_w level + c_w), then acc = fma(S, d_w d_x, acc) and
/// off = fma(c_w, s_x, off); the row's dot product is acc + off. The SIMD
/// copies sum the same integers in 8 lanes and scale the lanes (see
/// `avx2::int8_row`): within rounding of this, and bit-equal to each other.
fn rows_with<B: bytemuck::Pod>(
    rows: &[u8],
    x: &Q8Input,
    out: &mut [f32],
    block: impl Fn(&B, &[i8]) -> (i32, f32, f32),
) {
    let nb = x.d.len();
    let blocks: &[B] = bytemuck::cast_slice(rows);
    assert_eq!(blocks.len(), nb * out.len(), "int8 rows: wrong size");
    if nb == 0 {
        return out.fill(0.0);
    }
    for (row, o) in blocks.chunks_exact(nb).zip(out.iter_mut()) {
        let (mut acc, mut off) = (0.0f32, 0.0f32);
        for ((b, xq), (&d, &s)) in row
            .iter()
            .zip(x.qs.chunks_exact(32))
            .zip(x.d.iter().zip(&x.s))
        {
            let (sum, dw, c) = block(b, xq);
            acc = (sum as f32).mul_add(dw * d, acc);
            if c != 0.0 {
                off = c.mul_add(s, off);
            }
        }
        *o = acc + off;
    }
}

/// Sum of 16 low-nibble and 16 high-nibble levels times their inputs (8-
/// or 16-bit levels).
#[inline(always)]
fn nibble_dot<L: Copy + Into<i32>>(qs: &[u8; 16], x: &[L]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += (qs[j] & 0x0F) as i32 * x[j].into() + (qs[j] >> 4) as i32 * x[j + 16].into();
    }
    s
}

/// Levels q - 8: d_w q - 8 d_w.
fn q4_0(rows: &[u8], x: &Q8Input, out: &mut [f32]) {
    rows_with(rows, x, out, |b: &BlockQ4_0, xq| {
        let d = f16_to_f32(b.d);
        (nibble_dot(&b.qs, xq), d, -8.0 * d)
    })
}

/// d_w q + m.
fn q4_1(rows: &[u8], x: &Q8Input, out: &mut [f32]) {
    rows_with(rows, x, out, |b: &BlockQ4_1, xq| {
        (nibble_dot(&b.qs, xq), f16_to_f32(b.d), f16_to_f32(b.m))
    })
}

fn q8_0(rows: &[u8], x: &Q8Input, out: &mut [f32]) {
    rows_with(rows, x, out, |b: &BlockQ8_0, xq| {
        let dot: i32 =
            b.qs.iter()
                .zip(xq)
                .map(|(&w, &v)| w as i8 as i32 * v as i32)
                .sum();
        (dot, f16_to_f32(b.d), 0.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_row, quantize_row};
    use crate::util::rng::Rng;

    /// `Q8Input::new` (the AVX2 copy where the CPU has it) gives the
    /// portable body's levels, scales and sums, ties included (a block of
    /// max 127 has scale 1, so k + 0.5 is a tie).
    #[test]
    fn q8_input_copies_agree() {
        let mut rng = Rng::new(23);
        let mut x = rng.vec(32 * 9, -3.0, 3.0);
        x[..32]
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = i as f32 - 15.5);
        x[0] = 127.0;
        x[64..96].fill(0.0);
        let got = Q8Input::new(&x);
        let mut want = Q8Input {
            qs: vec![0; x.len()],
            d: Vec::new(),
            s: Vec::new(),
        };
        fill(&x, &mut want);
        assert_eq!(got.qs, want.qs);
        assert_eq!(got.d, want.d);
        assert_eq!(got.s, want.s);
        assert_eq!(&got.qs[1..4], &[-14, -14, -12], "ties to even");
    }

    /// How far rounding the input to `2 * half_levels + 1` levels may move
    /// the dot of `wd` and `x`: half a level of each 32-block's max |x| per
    /// value, times the block's sum |w|, plus a relative 1e-6 of `want`.
    fn input_rounding_bound(wd: &[f32], x: &[f32], half_levels: f64, want: f64) -> f64 {
        wd.chunks_exact(32)
            .zip(x.chunks_exact(32))
            .map(|(wb, xb)| {
                let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
                wb.iter().map(|v| v.abs() as f64).sum::<f64>() * amax / (2.0 * half_levels)
            })
            .sum::<f64>()
            + 1e-6 * want.abs()
    }

    /// Every copy of each kernel against the f32 dot product of the
    /// dequantised row with the input: rounding the input to 8 bits moves
    /// each block's sum by at most 1/254 of its sum |w| max|x| (half a
    /// level of 127 per value); swapped nibble halves or a wrong scale
    /// exceed it.
    #[test]
    fn int8_kernels_are_within_the_input_rounding_of_the_f32_dot() {
        let mut rng = Rng::new(41);
        for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for k in [32, 256, 4096] {
                for scale in [1.0, 1e-3, 30.0] {
                    let w: Vec<f32> = (0..k).map(|_| rng.normal() * scale).collect();
                    let mut row = vec![0u8; t.row_bytes(k).unwrap()];
                    quantize_row(t, &w, &mut row);
                    let mut wd = vec![0.0f32; k];
                    dequantize_row(t, &row, &mut wd);
                    // An input with a few large values, as activations have.
                    let mut x = rng.vec(k, -1.0, 1.0);
                    x[k / 3] = 20.0;
                    let want: f64 = wd.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let bound = input_rounding_bound(&wd, &x, 127.0, want);
                    let q = Q8Input::new(&x);
                    let vs = variants(t);
                    assert!(!vs.is_empty());
                    for (v, kern) in vs.into_iter().enumerate() {
                        let mut got = 0.0f32;
                        kern(&row, &q, std::slice::from_mut(&mut got));
                        let got = got as f64;
                        assert!(
                            (got - want).abs() <= bound,
                            "{t} k {k} scale {scale} variant {v}: {got} vs {want} (bound {bound})"
                        );
                    }
                }
            }
        }
    }

    /// The SIMD copies (AVX2, then VNNI where the CPU has it) sum the same
    /// integers in the same order, so they give the same bits, and a row's
    /// bits do not depend on the rows computed with it: 11 rows at once
    /// equal each row alone. The portable copy scales block by block, so
    /// it agrees within rounding.
    #[test]
    fn int8_simd_copies_agree_bit_for_bit_in_any_grouping() {
        let mut rng = Rng::new(42);
        for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let (k, n) = (1024, 11);
            let rb = t.row_bytes(k).unwrap();
            let mut rows = vec![0u8; n * rb];
            // Per row, the sum of |w| |x| over its elements (|x| <= 3): the
            // size of the terms whose rounding the two orders differ in.
            let mut scale = Vec::with_capacity(n);
            for row in rows.chunks_exact_mut(rb) {
                let w: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
                quantize_row(t, &w, row);
                scale.push(3.0 * w.iter().map(|v| v.abs()).sum::<f32>());
            }
            let q = Q8Input::new(&rng.vec(k, -3.0, 3.0));
            let mut portable = vec![0.0f32; n];
            variants(t)[0](&rows, &q, &mut portable);
            let mut want = vec![0.0f32; n];
            variants(t).last().expect("a copy")(&rows, &q, &mut want);
            for ((p, w), s) in portable.iter().zip(&want).zip(&scale) {
                // A block's rounding per block of 32, relative to the terms.
                let bound = (k / 32) as f32 * f32::EPSILON * s;
                assert!((p - w).abs() <= bound, "{t}: {p} vs {w} (bound {bound})");
            }
            for (v, kern) in variants(t).into_iter().enumerate().skip(1) {
                let mut together = vec![0.0f32; n];
                kern(&rows, &q, &mut together);
                let mut alone = vec![0.0f32; n];
                for (row, o) in rows.chunks_exact(rb).zip(alone.iter_mut()) {
                    kern(row, &q, std::slice::from_mut(o));
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&together), bits(&want), "{t} variant {v}");
                assert_eq!(bits(&alone), bits(&want), "{t} variant {v} row by row");
            }
        }
    }

    /// The four-input kernel (through `ManyDots`, seven inputs:
    /// a group of four and three alone; and each copy alone) gives each
    /// input what its own dot gives, bit for bit, for odd and even block
    /// counts.
    #[test]
    fn four_inputs_at_once_give_each_input_its_own_bits() {
        let mut rng = Rng::new(46);
        for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for k in [32, 96, 1024] {
                let w: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
                let mut row = vec![0u8; t.row_bytes(k).unwrap()];
                quantize_row(t, &w, &mut row);
                let xs: Vec<Vec<f32>> = (0..7).map(|_| rng.vec(k, -3.0, 3.0)).collect();
                let dots: Vec<_> = xs
                    .iter()
                    .map(|x| crate::quant::fast::RowDot::new_int8(t, x))
                    .collect();
                let mut many = vec![0.0f32; dots.len()];
                crate::quant::fast::ManyDots::new(
                    xs.iter()
                        .map(|x| crate::quant::fast::RowDot::new_int8(t, x))
                        .collect(),
                )
                .dot_row(&row, &mut many);
                for (i, (d, m)) in dots.iter().zip(&many).enumerate() {
                    assert_eq!(d.dot(&row).to_bits(), m.to_bits(), "{t} k={k} input {i}");
                }
                // Every copy this CPU runs, not only the best.
                let qs: Vec<Q8Input> = xs.iter().map(|x| Q8Input::new(x)).collect();
                let four = Four::of_q8([&qs[0], &qs[1], &qs[2], &qs[3]]);
                for (v, k4) in variants4(t).into_iter().enumerate() {
                    let got = k4(t, &row, [&qs[0], &qs[1], &qs[2], &qs[3]], &four);
                    let want: Vec<u32> = many[..4].iter().map(|x| x.to_bits()).collect();
                    let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(got, want, "{t} k={k} copy {v}");
                }
                // The 16-bit inputs (Q8_0's vocabulary projection): each
                // copy's four-input kernel against its own single one.
                if t == GgmlType::Q8_0 {
                    let q16: Vec<Q16Input> = xs.iter().map(|x| Q16Input::new(x)).collect();
                    let four = Four::of_q16([&q16[0], &q16[1], &q16[2], &q16[3]]);
                    for (v, (k1, k4)) in variants16(t).into_iter().enumerate() {
                        let Some(k4) = k4 else { continue };
                        let got = k4(&row, [&q16[0], &q16[1], &q16[2], &q16[3]], &four);
                        for (m, g) in got.iter().enumerate() {
                            let want = k1(&row, &q16[m]);
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "int16 k={k} copy {v} input {m}"
                            );
                        }
                    }
                    let dots: Vec<_> = xs
                        .iter()
                        .map(|x| crate::quant::fast::RowDot::new_int16(t, x))
                        .collect();
                    crate::quant::fast::ManyDots::new(
                        xs.iter()
                            .map(|x| crate::quant::fast::RowDot::new_int16(t, x))
                            .collect(),
                    )
                    .dot_row(&row, &mut many);
                    for (i, (d, m)) in dots.iter().zip(&many).enumerate() {
                        assert_eq!(d.dot(&row).to_bits(), m.to_bits(), "int16 k={k} input {i}");
                    }
                }
            }
        }
    }

    /// The 16-bit-input kernels against the f32 dot of the dequantised
    /// row: half a level of 32767 per value.
    #[test]
    fn int16_kernels_are_within_the_input_rounding_of_the_f32_dot() {
        let mut rng = Rng::new(45);
        assert!(variants16(GgmlType::Q5_0).is_empty());
        for (t, k) in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0]
            .into_iter()
            .flat_map(|t| [32, 576, 4096].map(|k| (t, k)))
        {
            let w: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
            let mut row = vec![0u8; t.row_bytes(k).unwrap()];
            quantize_row(t, &w, &mut row);
            let mut wd = vec![0.0f32; k];
            dequantize_row(t, &row, &mut wd);
            let mut x = rng.vec(k, -1.0, 1.0);
            x[k / 2] = 25.0;
            let want: f64 = wd.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let bound = input_rounding_bound(&wd, &x, 32767.0, want);
            let q = Q16Input::new(&x);
            let got: Vec<f32> = variants16(t)
                .into_iter()
                .map(|(kern, _)| kern(&row, &q))
                .collect();
            for (v, &g) in got.iter().enumerate() {
                assert!(
                    (g as f64 - want).abs() <= bound,
                    "{t} k {k} variant {v}: {g} vs {want} (bound {bound})"
                );
            }
        }
    }

    #[test]
    fn quantised_input_round_trips_within_half_a_level() {
        let mut rng = Rng::new(43);
        let x = rng.vec(96, -5.0, 5.0);
        let q = Q8Input::new(&x);
        for (b, xb) in x.chunks_exact(32).enumerate() {
            let mut sum = 0i32;
            for (j, &v) in xb.iter().enumerate() {
                let l = q.qs[32 * b + j];
                sum += l as i32;
                assert!((l as f32 * q.d[b] - v).abs() <= 0.5 * q.d[b] * 1.0001);
            }
            assert!((q.s[b] - q.d[b] * sum as f32).abs() <= 1e-6 * q.s[b].abs().max(1.0));
        }
        // All zeros: scale 0, levels 0, no NaN.
        let z = Q8Input::new(&[0.0; 32]);
        assert_eq!((z.d[0], z.s[0]), (0.0, 0.0));
        assert!(z.qs.iter().all(|&l| l == 0));
    }
}
