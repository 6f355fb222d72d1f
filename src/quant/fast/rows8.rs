//! Q4_0, Q4_1 and Q8_0 matrices repacked eight rows at a time for the int8
//! decode products (llama.cpp's CPU backend repacks its Q4_0 likewise): a
//! SIMD lane per row, so a block's integer sums land one per lane and are
//! scaled by the eight rows' scales in one vector operation, where the row
//! kernels of [`super::int8`] spend a conversion, a multiply-add and the
//! scalar scale work on every row's block.
//!
//! Layout: the rows in groups of eight; a group is its blocks in order; a
//! group's block `i` holds the eight rows' f16 scales `d` (16 bytes), for
//! Q4_1 then their f16 mins (16 bytes), then the levels in chunks of 32
//! bytes: chunk `c` is, row by row, the 4 bytes `qs[4c..4c + 4]` of the
//! row's block `i` (Q4 blocks have 4 chunks: low nibbles elements 4c..4c+4,
//! high ones 16 + 4c..; Q8_0 blocks 8, elements 4c..4c+4). Same size as the
//! rows it came from.
//!
//! Per row and block the kernels compute the exact integer sum S of the
//! level products, then `acc = fma(S, d_w d_x, acc)` and (Q4_0's `-8 d_w`,
//! Q4_1's min) `off = fma(c_w, s_x, off)`, blocks alternating between two
//! accumulators of each; the row's product is `(acc_0 + acc_1) + (off_0 +
//! off_1)`. The portable copy does exactly these f32 operations per row, so
//! every copy gives the same bits. Each type also has copies over 16-bit
//! inputs (the vocabulary projection's).

use super::f16_to_f32;
use super::int8::{Q16Input, Q8Input};
use crate::quant::GgmlType;

/// Rows a group.
pub const ROWS: usize = 8;

/// Whether `t` has a repacked layout and kernels.
pub fn supports(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// The parts of a block of `t`: (scale bytes before the levels in a
/// source block, level bytes of a source block).
fn parts(t: GgmlType) -> (usize, usize) {
    match t {
        GgmlType::Q4_0 => (2, 16),
        GgmlType::Q4_1 => (4, 16),
        GgmlType::Q8_0 => (2, 32),
        _ => panic!("rows8: no layout for {t}"),
    }
}

/// Where row `r`'s pieces of a block go in its group's block: (offset in
/// the source block, offset in the group's block, 2- or 4-byte piece).
#[inline(always)]
fn pieces(t: GgmlType, r: usize) -> impl Iterator<Item = (usize, usize, bool)> {
    let (head, qs) = parts(t);
    let scales = (0..head / 2).map(move |k| (2 * k, 16 * k + 2 * r, false));
    let levels = (0..qs / 4).map(move |c| (head + 4 * c, 8 * head + 32 * c + 4 * r, true));
    scales.chain(levels)
}

/// Copies a 2- or 4-byte piece (constant sizes: moves, not copy calls).
#[inline(always)]
fn piece(dst: &mut [u8], src: &[u8], four: bool) {
    if four {
        dst[..4].copy_from_slice(&src[..4]);
    } else {
        dst[..2].copy_from_slice(&src[..2]);
    }
}

/// `rows` (`n` rows of `nb` blocks of `t`, `n` a multiple of [`ROWS`]) in
/// the repacked layout.
pub fn repack(t: GgmlType, rows: &[u8], n: usize, nb: usize) -> Vec<u8> {
    use rayon::prelude::*;
    let bb = t.block_bytes();
    assert!(
        n.is_multiple_of(ROWS),
        "rows8: {n} rows are not whole groups"
    );
    assert_eq!(rows.len(), n * nb * bb, "rows8: wrong size");
    let mut out = vec![0u8; rows.len()];
    if nb == 0 {
        return out;
    }
    out.par_chunks_mut(ROWS * nb * bb)
        .zip(rows.par_chunks(ROWS * nb * bb))
        .for_each(|(dst, src)| {
            for (i, db) in dst.chunks_exact_mut(ROWS * bb).enumerate() {
                for r in 0..ROWS {
                    let sb = &src[(r * nb + i) * bb..][..bb];
                    for (s, p, four) in pieces(t, r) {
                        piece(&mut db[p..], &sb[s..], four);
                    }
                }
            }
        });
    out
}

/// Row `r`'s bytes in the source layout, from a repacked matrix of rows of
/// `nb` blocks, into `out` (one row's bytes).
pub fn gather_row(t: GgmlType, packed: &[u8], nb: usize, r: usize, out: &mut [u8]) {
    let bb = t.block_bytes();
    assert_eq!(out.len(), nb * bb, "rows8: a row of the wrong size");
    let group = &packed[(r / ROWS) * ROWS * nb * bb..][..ROWS * nb * bb];
    for (ob, b) in out.chunks_exact_mut(bb).zip(group.chunks_exact(ROWS * bb)) {
        for (s, p, four) in pieces(t, r % ROWS) {
            piece(&mut ob[s..], &b[p..], four);
        }
    }
}

/// Row `r` of a repacked matrix of rows of `nb` blocks dequantised into
/// `out` (`32 nb` values) straight from the groups, with the reference's
/// operations (`quant::dequantize_row`'s values, bit for bit).
pub fn dequantize_row(t: GgmlType, packed: &[u8], nb: usize, r: usize, out: &mut [f32]) {
    let bb = t.block_bytes();
    assert_eq!(out.len(), 32 * nb, "rows8: a row of the wrong length");
    let (head, qs) = parts(t);
    let group = &packed[(r / ROWS) * ROWS * nb * bb..][..ROWS * nb * bb];
    let r = r % ROWS;
    for (y, b) in out.chunks_exact_mut(32).zip(group.chunks_exact(ROWS * bb)) {
        let f16 = |at: usize| f16_to_f32([b[at], b[at + 1]]);
        let d = f16(2 * r);
        for c in 0..qs / 4 {
            let w = &b[8 * head + 32 * c + 4 * r..][..4];
            for (j, &l) in w.iter().enumerate() {
                match t {
                    GgmlType::Q4_0 => {
                        y[4 * c + j] = ((l & 0x0F) as i32 - 8) as f32 * d;
                        y[16 + 4 * c + j] = ((l >> 4) as i32 - 8) as f32 * d;
                    }
                    GgmlType::Q4_1 => {
                        let m = f16(16 + 2 * r);
                        y[4 * c + j] = (l & 0x0F) as f32 * d + m;
                        y[16 + 4 * c + j] = (l >> 4) as f32 * d + m;
                    }
                    _ => y[4 * c + j] = (l as i8) as f32 * d,
                }
            }
        }
    }
}

/// The copy of the kernel this CPU runs best: (repacked rows, input, out),
/// `out.len()` a multiple of [`ROWS`] rows of the input's length.
pub type Kernel = fn(GgmlType, &[u8], &Q8Input, &mut [f32]);

/// A kernel over a 16-bit input (the vocabulary projection): (type,
/// repacked rows, input, out).
pub type Kernel16 = fn(GgmlType, &[u8], &Q16Input, &mut [f32]);

/// The 16-bit-input copies this CPU runs, best last.
pub fn variants16() -> Vec<Kernel16> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v: Vec<Kernel16> = vec![portable16];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            // SAFETY: listed only when the CPU reports the instructions;
            // the kernel checks the sizes.
            v.push(|t, p, x, o| unsafe { super::avx2::rows8_int16(t, p, x, o) });
        }
    }
    v
}

/// The copies this CPU runs, best last.
pub fn variants() -> Vec<Kernel> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v: Vec<Kernel> = vec![portable];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            // SAFETY: listed only when the CPU reports the instructions;
            // the kernel checks the sizes.
            v.push(|t, p, x, o| unsafe { super::avx2::rows8(t, p, x, o) });
        }
    }
    v
}

/// A kernel over several int8 inputs (a batch's decode rows): (type, repacked
/// rows, inputs, out as [rows, inputs]); each input's products have the
/// bits [`Kernel`] gives it alone.
pub type KernelMany = fn(GgmlType, &[u8], &[&Q8Input], &mut [f32]);

/// The many-input copies this CPU runs, best last.
pub fn variants_many() -> Vec<KernelMany> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v: Vec<KernelMany> = vec![portable_many];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            // SAFETY (each): listed only when the CPU reports the
            // instructions; the kernels check the sizes.
            v.push(|t, p, xs, o| unsafe { super::avx2::rows8_many(t, p, xs, o) });
            if has!("avxvnni") {
                v.push(|t, p, xs, o| unsafe { super::avx2::rows8_many_avxvnni(t, p, xs, o) });
            } else if has!("avx512vnni") && has!("avx512vl") {
                v.push(|t, p, xs, o| unsafe { super::avx2::rows8_many_avx512vnni(t, p, xs, o) });
                if has!("avx512bw") {
                    v.push(|t, p, xs, o| unsafe { super::avx2::rows8_many_zmm(t, p, xs, o) });
                }
            }
        }
    }
    v
}

/// Checks a many-input call's sizes: inputs of one length, `out` one
/// value per row and input, `packed` those rows in whole groups.
pub(super) fn check_many(t: GgmlType, packed: &[u8], xs: &[&Q8Input], out: &[f32]) {
    assert!(!xs.is_empty(), "rows8: no inputs");
    let blocks = xs[0].d.len();
    assert!(
        xs.iter()
            .all(|x| x.d.len() == blocks && x.qs.len() == 32 * blocks),
        "rows8: inputs of different lengths"
    );
    assert!(
        out.len().is_multiple_of(xs.len()),
        "rows8: not one output per row and input"
    );
    // The rows' checks are the one-input kernels' (on one input's share
    // of `out`).
    check(t, packed, blocks, &out[..out.len() / xs.len()]);
}

/// The portable many-input copy: each input through [`portable`].
fn portable_many(t: GgmlType, packed: &[u8], xs: &[&Q8Input], out: &mut [f32]) {
    check_many(t, packed, xs, out);
    let m = xs.len();
    let mut col = vec![0.0f32; out.len() / m];
    for (j, x) in xs.iter().enumerate() {
        portable(t, packed, x, &mut col);
        for (o, &c) in out.iter_mut().skip(j).step_by(m).zip(&col) {
            *o = c;
        }
    }
}

/// Checks a call's sizes: `packed` holds `out.len()` rows of `blocks`
/// blocks, in whole groups.
pub(super) fn check(t: GgmlType, packed: &[u8], blocks: usize, out: &[f32]) {
    assert!(supports(t), "rows8: no kernel for {t}");
    assert!(
        out.len().is_multiple_of(ROWS),
        "rows8: {} rows are not whole groups",
        out.len()
    );
    assert_eq!(
        packed.len(),
        out.len() * blocks * t.block_bytes(),
        "rows8: wrong size"
    );
}

fn portable16(t: GgmlType, packed: &[u8], x: &Q16Input, out: &mut [f32]) {
    check(t, packed, x.d.len(), out);
    rows_portable(t, packed, &x.qs, &x.d, &x.s, out)
}

fn portable(t: GgmlType, packed: &[u8], x: &Q8Input, out: &mut [f32]) {
    check(t, packed, x.d.len(), out);
    rows_portable(t, packed, &x.qs, &x.d, &x.s, out)
}

/// The portable copies, row by row in the order the module describes,
/// over input levels `xq` (8- or 16-bit) with block scales `xd` and sums
/// `xs`.
fn rows_portable<L: Copy + Into<i32>>(
    t: GgmlType,
    packed: &[u8],
    xq: &[L],
    xd: &[f32],
    xs: &[f32],
    out: &mut [f32],
) {
    let (nb, bb) = (xd.len(), t.block_bytes());
    let (head, qs) = parts(t);
    if nb == 0 {
        return out.fill(0.0);
    }
    for (group, o) in packed
        .chunks_exact(ROWS * nb * bb)
        .zip(out.chunks_exact_mut(ROWS))
    {
        for (r, o) in o.iter_mut().enumerate() {
            let (mut acc, mut off) = ([0.0f32; 2], [0.0f32; 2]);
            for (i, b) in group.chunks_exact(ROWS * bb).enumerate() {
                let h = i % 2;
                let f16 = |at: usize| f16_to_f32([b[at], b[at + 1]]);
                let d = f16(2 * r);
                let xq = &xq[32 * i..32 * i + 32];
                let mut sum = 0i32;
                for c in 0..qs / 4 {
                    let w = &b[8 * head + 32 * c + 4 * r..][..4];
                    for (j, &l) in w.iter().enumerate() {
                        sum += if t == GgmlType::Q8_0 {
                            l as i8 as i32 * xq[4 * c + j].into()
                        } else {
                            (l & 0x0F) as i32 * xq[4 * c + j].into()
                                + (l >> 4) as i32 * xq[16 + 4 * c + j].into()
                        };
                    }
                }
                acc[h] = (sum as f32).mul_add(d * xd[i], acc[h]);
                let c = match t {
                    GgmlType::Q4_0 => -8.0 * d,
                    GgmlType::Q4_1 => f16(16 + 2 * r),
                    _ => continue,
                };
                off[h] = c.mul_add(xs[i], off[h]);
            }
            *o = (acc[0] + acc[1]) + (off[0] + off[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16-bit-input copies give the same bits, within rounding of the
    /// row kernel's products.
    fn check_int16(t: GgmlType, rows: &[u8], packed: &[u8], x: &[f32], k: usize) {
        let n = rows.len() / t.row_bytes(k).unwrap();
        let q = Q16Input::new(x);
        let mut want = vec![0.0f32; n];
        RowDot::new_int16(t, x).dot_rows(rows, &mut want);
        let rb = t.row_bytes(k).unwrap();
        let terms: Vec<f32> = rows
            .chunks_exact(rb)
            .map(|row| {
                let mut wd = vec![0.0f32; k];
                crate::quant::dequantize_row(t, row, &mut wd);
                wd.iter().zip(x).map(|(a, b)| (a * b).abs()).sum()
            })
            .collect();
        let mut first: Option<Vec<u32>> = None;
        for (v, kern) in variants16().into_iter().enumerate() {
            let mut got = vec![0.0f32; n];
            kern(t, packed, &q, &mut got);
            for ((g, w), t) in got.iter().zip(&want).zip(&terms) {
                let bound = 4.0 * (k / 32) as f32 * f32::EPSILON * t;
                assert!(
                    (g - w).abs() <= bound,
                    "{t} int16 k {k} copy {v}: {g} vs {w}"
                );
            }
            let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            match &first {
                None => first = Some(bits),
                Some(f) => assert_eq!(&bits, f, "{t} int16 k {k} copy {v}"),
            }
        }
    }
    use crate::quant::fast::RowDot;
    use crate::quant::quantize_row;
    use crate::util::rng::Rng;

    fn matrix(t: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut rng = Rng::new(seed);
        let rb = t.row_bytes(k).unwrap();
        let mut rows = vec![0u8; n * rb];
        for row in rows.chunks_exact_mut(rb) {
            let w: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
            quantize_row(t, &w, row);
        }
        rows
    }

    /// Repacking moves bytes only: gathering each row back gives its
    /// source bytes, dequantising it in place gives the reference's values,
    /// and the packed matrix has the source's size.
    #[test]
    fn gathered_rows_are_the_source_rows() {
        for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let (n, k) = (24, 96);
            let rows = matrix(t, n, k, 7);
            let packed = repack(t, &rows, n, k / 32);
            assert_eq!(packed.len(), rows.len());
            let rb = t.row_bytes(k).unwrap();
            let mut got = vec![0u8; rb];
            let (mut want, mut deq) = (vec![0.0f32; k], vec![0.0f32; k]);
            for r in 0..n {
                gather_row(t, &packed, k / 32, r, &mut got);
                assert_eq!(got, &rows[r * rb..(r + 1) * rb], "{t} row {r}");
                crate::quant::dequantize_row(t, &got, &mut want);
                dequantize_row(t, &packed, k / 32, r, &mut deq);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&deq), bits(&want), "{t} row {r} dequantised");
            }
        }
    }

    /// Every many-input copy gives each input the bits the single-input
    /// kernel gives it alone: tiles short and whole, an odd group after
    /// pairs of groups, every type.
    #[test]
    fn many_input_copies_give_each_input_its_own_bits() {
        let single = *variants().last().expect("a copy");
        for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for (n, k, m) in [(8, 32, 1), (24, 96, 3), (40, 1024, 9), (16, 64, 4)] {
                let packed = repack(t, &matrix(t, n, k, 21), n, k / 32);
                let x = Rng::new(22).vec(m * k, -3.0, 3.0);
                let qs: Vec<Q8Input> = x.chunks_exact(k).map(Q8Input::new).collect();
                let xs: Vec<&Q8Input> = qs.iter().collect();
                let mut want = vec![0.0f32; n * m];
                let mut col = vec![0.0f32; n];
                for (j, q) in qs.iter().enumerate() {
                    single(t, &packed, q, &mut col);
                    for (r, &v) in col.iter().enumerate() {
                        want[r * m + j] = v;
                    }
                }
                for (v, kern) in variants_many().into_iter().enumerate() {
                    let mut got = vec![f32::NAN; n * m];
                    kern(t, &packed, &xs, &mut got);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{t} n {n} k {k} m {m} copy {v}");
                }
            }
        }
    }

    /// Every copy gives the same bits, and each row is within rounding of
    /// the row kernels' product of the same input (the two sum a row's
    /// blocks in different orders).
    #[test]
    fn copies_agree_bit_for_bit_and_with_the_row_kernels() {
        let mut rng = Rng::new(8);
        for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for k in [32, 96, 1024] {
                let n = 16;
                let rows = matrix(t, n, k, 9);
                let packed = repack(t, &rows, n, k / 32);
                let x = rng.vec(k, -3.0, 3.0);
                let q = Q8Input::new(&x);
                let mut want = vec![0.0f32; n];
                RowDot::new_int8(t, &x).dot_rows(&rows, &mut want);
                let mut first = None;
                for (v, kern) in variants().into_iter().enumerate() {
                    let mut got = vec![0.0f32; n];
                    kern(t, &packed, &q, &mut got);
                    for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                        let mut wd = vec![0.0f32; k];
                        crate::quant::dequantize_row(
                            t,
                            &rows[r * t.row_bytes(k).unwrap()..][..t.row_bytes(k).unwrap()],
                            &mut wd,
                        );
                        let terms: f32 = wd.iter().map(|v| v.abs() * 3.0).sum();
                        let bound = 4.0 * (k / 32) as f32 * f32::EPSILON * terms;
                        assert!(
                            (g - w).abs() <= bound,
                            "{t} k {k} copy {v} row {r}: {g} vs {w}"
                        );
                    }
                    let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    if v == 0 {
                        check_int16(t, &rows, &packed, &x, k);
                    }
                    match &first {
                        None => first = Some(bits),
                        Some(f) => assert_eq!(&bits, f, "{t} k {k} copy {v}"),
                    }
                }
            }
        }
    }
}
