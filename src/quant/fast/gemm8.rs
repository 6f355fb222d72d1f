//! The int8 matrix product of CTranslate2's CPU `int8` compute type, which
//! faster-whisper runs: each weight row rounded to 8-bit levels with one
//! scale (`127 / max|row|`), each input row likewise (through the unsigned
//! shift CTranslate2's x86 GEMMs take: `round(x s + 128) - 128`), the
//! products summed exactly in i32 over the whole row, then
//! `(sum * (1 / s_x)) / s_w` in f32. The levels and those three f32
//! operations are CTranslate2's, so on the same inputs every output has
//! its bits.
//!
//! Weights are repacked into panels of 16 rows; one pass over a panel
//! serves up to eight input rows, so a product of several rows (a beam's
//! rows, an encoder's 1500 frames) reads each weight once per eight rows.
//! With AVX-512 VNNI one `dpbusd` does 64 multiply-adds (16 weight rows by
//! 4 bytes); it multiplies unsigned by signed bytes, so the weights are
//! stored as `level + 128` and each input row's `128 * sum(levels)` is
//! subtracted. Every copy computes the same integers and the same f32
//! operations, so all give the same bits.

use rayon::prelude::*;

use crate::util::par;

/// Weight rows a panel (the f32 lanes of one AVX-512 register).
const LANES: usize = 16;
/// Bytes of 32 columns of one panel: 8 groups of 16 rows x 4 levels.
const PANEL_BLOCK: usize = 8 * 64;
/// Input rows one pass over a panel serves.
const TILE: usize = 8;
/// Input rows a piece of parallel work takes at most.
const ROWS_PER_TASK: usize = 256;

/// `row` as CTranslate2 quantises a weight row: levels `round(x s)` (ties
/// to even) with `s = 127 / max|x|` (1 for a row of zeros); returns `s`.
pub fn quantize_row(row: &[f32], levels: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(row: &[f32], levels: &mut [i8]) -> f32 {
            weight_row(row, levels)
        }
        // SAFETY: the CPU reports AVX2.
        return unsafe { avx2(row, levels) };
    }
    weight_row(row, levels)
}

/// [`quantize_row`]'s body, inlined into its AVX2 copy (one rounding
/// instruction a vector instead of a libm call a value).
#[inline(always)]
fn weight_row(row: &[f32], levels: &mut [i8]) -> f32 {
    let s = scale(row);
    for (l, &v) in levels.iter_mut().zip(row) {
        *l = (v * s).round_ties_even().clamp(-128.0, 127.0) as i8;
    }
    s
}

/// `127 / max|x|`, or 1 when every value is 0.
#[inline(always)]
fn scale(x: &[f32]) -> f32 {
    // Eight lanes: a fold over one value at a time does not vectorise.
    let mut m = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    let amax = chunks
        .remainder()
        .iter()
        .chain(&m)
        .fold(0.0f32, |a, &v| a.max(v.abs()));
    if amax != 0.0 {
        127.0 / amax
    } else {
        1.0
    }
}

/// Weights `[n, k]` as levels and row scales, repacked for [`matmul`]: for
/// each panel of 16 rows and each 32 columns, group g (columns 4g..4g + 4)
/// holds row r's four levels plus 128 at bytes `64 g + 4 r..` (rows past
/// `n` are levels of 0 with scale 1).
pub struct PackedI8 {
    n: usize,
    k: usize,
    data: Vec<u8>,
    scales: Vec<f32>,
}

impl PackedI8 {
    /// Quantises `w` (`[n, k]`, `k` a multiple of 32) row by row.
    pub fn quantize(w: &[f32], n: usize, k: usize) -> PackedI8 {
        assert!(k.is_multiple_of(32), "PackedI8: rows are not whole blocks");
        assert_eq!(w.len(), n * k, "PackedI8: not {n} rows of {k}");
        let panels = n.div_ceil(LANES);
        let mut data = vec![0x80u8; panels * k / 32 * PANEL_BLOCK];
        let mut scales = vec![1.0f32; panels * LANES];
        data.par_chunks_mut(k / 32 * PANEL_BLOCK)
            .zip(scales.par_chunks_mut(LANES))
            .enumerate()
            .for_each(|(p, (panel, scales))| {
                let mut levels = vec![0i8; k];
                for (r, s) in scales.iter_mut().enumerate() {
                    let row = p * LANES + r;
                    if row >= n {
                        break;
                    }
                    *s = quantize_row(&w[row * k..(row + 1) * k], &mut levels);
                    for (c, &l) in levels.iter().enumerate() {
                        let at = (c / 32) * PANEL_BLOCK + (c % 32 / 4) * 64 + r * 4 + c % 4;
                        panel[at] = l as u8 ^ 0x80;
                    }
                }
            });
        PackedI8 { n, k, data, scales }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    fn panel(&self, p: usize) -> Panel<'_> {
        let size = self.k / 32 * PANEL_BLOCK;
        Panel {
            w: &self.data[p * size..(p + 1) * size],
            scales: self.scales[p * LANES..(p + 1) * LANES].try_into().unwrap(),
        }
    }
}

/// One panel's packed levels and its 16 rows' scales.
#[derive(Clone, Copy)]
struct Panel<'a> {
    w: &'a [u8],
    scales: &'a [f32; LANES],
}

/// Input rows `[m, k]` as levels: each row's `1 / s` and `128 * sum(levels)`.
struct Inputs {
    qs: Vec<i8>,
    inv_scale: Vec<f32>,
    shift: Vec<i32>,
}

impl Inputs {
    /// CTranslate2's input rounding on x86 (its GEMMs there multiply
    /// unsigned inputs): `round(x s + 128)` in f32, ties to even, less 128.
    fn new(x: &[f32], k: usize) -> Inputs {
        let mut qs = vec![0i8; x.len()];
        let (inv_scale, shift): (Vec<f32>, Vec<i32>) = qs
            .par_chunks_mut(k)
            .zip(x.par_chunks(k))
            .map(|(q, row)| input_row_fast(row, q))
            .unzip();
        Inputs {
            qs,
            inv_scale,
            shift,
        }
    }
}

/// [`input_row`] compiled with AVX2 where the CPU has it, as
/// [`quantize_row`] is.
fn input_row_fast(row: &[f32], q: &mut [i8]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(row: &[f32], q: &mut [i8]) -> (f32, i32) {
            input_row(row, q)
        }
        // SAFETY: the CPU reports AVX2.
        return unsafe { avx2(row, q) };
    }
    input_row(row, q)
}

/// One input row's levels into `q`; returns `1 / s` and `128 * sum(levels)`.
#[inline(always)]
fn input_row(row: &[f32], q: &mut [i8]) -> (f32, i32) {
    let s = scale(row);
    for (l, &v) in q.iter_mut().zip(row) {
        *l = ((v * s + 128.0).round_ties_even().clamp(0.0, 255.0) - 128.0) as i8;
    }
    (1.0 / s, 128 * q.iter().map(|&l| l as i32).sum::<i32>())
}

/// The f32 operations on a row's exact sum, in CTranslate2's order.
#[inline(always)]
fn dequantize(sum: i32, inv_scale_x: f32, scale_w: f32) -> f32 {
    (sum as f32 * inv_scale_x) / scale_w
}

/// One panel times up to [`TILE`] input rows (`out.len()` of them, from
/// row `i0`): out[r][l] = the product of weight row l with input row i0 + r.
type TileKernel = fn(Panel, &Inputs, usize, usize, &mut [[f32; LANES]]);

/// The best copy of the tile kernel this CPU runs.
fn kernel() -> TileKernel {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
            // SAFETY: the CPU reports the instructions.
            return |w, x, k, i0, out| unsafe { vnni::tile(w, x, k, i0, out) };
        }
        if has!("avx2") {
            // SAFETY: the CPU reports the instructions.
            return |w, x, k, i0, out| unsafe { avx2::tile(w, x, k, i0, out) };
        }
    }
    tile_portable
}

fn tile_portable(w: Panel, x: &Inputs, k: usize, i0: usize, out: &mut [[f32; LANES]]) {
    for (r, o) in out.iter_mut().enumerate() {
        let i = i0 + r;
        let xq = &x.qs[i * k..(i + 1) * k];
        let mut sums = [0i32; LANES];
        for (blk, xb) in w.w.chunks_exact(PANEL_BLOCK).zip(xq.chunks_exact(32)) {
            for (l, s) in sums.iter_mut().enumerate() {
                for (c, &v) in xb.iter().enumerate() {
                    *s += blk[(c / 4) * 64 + l * 4 + c % 4] as i32 * v as i32;
                }
            }
        }
        for ((o, s), &sw) in o.iter_mut().zip(sums).zip(w.scales) {
            *o = dequantize(s - x.shift[i], x.inv_scale[i], sw);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{Inputs, Panel, LANES, PANEL_BLOCK, TILE};
    use std::arch::x86_64::*;

    /// [`super::tile_portable`] with AVX-512 VNNI: eight `dpbusd` a row
    /// per 32 columns (16 weight rows x 4 columns each), the weight
    /// register shared by the tile's rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile(w: Panel, x: &Inputs, k: usize, i0: usize, out: &mut [[f32; LANES]]) {
        assert!(out.len() <= TILE && (i0 + out.len()) * k <= x.qs.len());
        assert_eq!(w.w.len(), k / 32 * PANEL_BLOCK, "gemm8: wrong panel size");
        match out.len() {
            1 => rows::<1>(w, x, k, i0, out),
            2 => rows::<2>(w, x, k, i0, out),
            3 => rows::<3>(w, x, k, i0, out),
            4 => rows::<4>(w, x, k, i0, out),
            5 => rows::<5>(w, x, k, i0, out),
            6 => rows::<6>(w, x, k, i0, out),
            7 => rows::<7>(w, x, k, i0, out),
            _ => rows::<8>(w, x, k, i0, out),
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn rows<const R: usize>(
        w: Panel,
        x: &Inputs,
        k: usize,
        i0: usize,
        out: &mut [[f32; LANES]],
    ) {
        let (wp, xq) = (w.w.as_ptr(), x.qs.as_ptr().add(i0 * k));
        let mut s = [_mm512_setzero_si512(); R];
        for b in 0..k / 32 {
            let blk = wp.add(b * PANEL_BLOCK);
            for g in 0..8 {
                let wv = _mm512_loadu_si512(blk.add(64 * g).cast());
                for (r, s) in s.iter_mut().enumerate() {
                    let xv = xq
                        .add(r * k + 32 * b + 4 * g)
                        .cast::<i32>()
                        .read_unaligned();
                    *s = _mm512_dpbusd_epi32(*s, wv, _mm512_set1_epi32(xv));
                }
            }
        }
        let sw = _mm512_loadu_ps(w.scales.as_ptr());
        for (r, (o, s)) in out.iter_mut().zip(s).enumerate() {
            let i = i0 + r;
            let t = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, _mm512_set1_epi32(x.shift[i])));
            let y = _mm512_div_ps(_mm512_mul_ps(t, _mm512_set1_ps(x.inv_scale[i])), sw);
            _mm512_storeu_ps(o.as_mut_ptr(), y);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Inputs, Panel, LANES, PANEL_BLOCK, TILE};
    use std::arch::x86_64::*;

    /// [`super::tile_portable`] with AVX2, four input rows at a time: the
    /// levels lie in -127..=127 on both sides, so `maddubs` of |w| with the
    /// input carrying w's sign sums two products into 16 bits without
    /// saturating, and `madd` against ones widens them: the exact signed
    /// sums, with no shift to take off.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn tile(w: Panel, x: &Inputs, k: usize, i0: usize, out: &mut [[f32; LANES]]) {
        assert!(out.len() <= TILE && (i0 + out.len()) * k <= x.qs.len());
        assert_eq!(w.w.len(), k / 32 * PANEL_BLOCK, "gemm8: wrong panel size");
        for (c, chunk) in out.chunks_mut(4).enumerate() {
            let i = i0 + 4 * c;
            match chunk.len() {
                1 => rows::<1>(w, x, k, i, chunk),
                2 => rows::<2>(w, x, k, i, chunk),
                3 => rows::<3>(w, x, k, i, chunk),
                _ => rows::<4>(w, x, k, i, chunk),
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn rows<const R: usize>(
        w: Panel,
        x: &Inputs,
        k: usize,
        i0: usize,
        out: &mut [[f32; LANES]],
    ) {
        let (wp, xq) = (w.w.as_ptr(), x.qs.as_ptr().add(i0 * k));
        let (flip, ones) = (_mm256_set1_epi8(-128), _mm256_set1_epi16(1));
        // Rows 0..8 and 8..16 of the panel.
        let mut s = [[_mm256_setzero_si256(); 2]; R];
        for b in 0..k / 32 {
            let blk = wp.add(b * PANEL_BLOCK);
            for g in 0..8 {
                for (h, half) in [0usize, 32].into_iter().enumerate() {
                    let wv =
                        _mm256_xor_si256(_mm256_loadu_si256(blk.add(64 * g + half).cast()), flip);
                    let wa = _mm256_abs_epi8(wv);
                    for (r, s) in s.iter_mut().enumerate() {
                        let xv = xq
                            .add(r * k + 32 * b + 4 * g)
                            .cast::<i32>()
                            .read_unaligned();
                        let xs = _mm256_sign_epi8(_mm256_set1_epi32(xv), wv);
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xs), ones);
                        s[h] = _mm256_add_epi32(s[h], p);
                    }
                }
            }
        }
        for (r, (o, s)) in out.iter_mut().zip(s).enumerate() {
            let i = i0 + r;
            let inv = _mm256_set1_ps(x.inv_scale[i]);
            for (h, s) in s.into_iter().enumerate() {
                let sw = _mm256_loadu_ps(w.scales.as_ptr().add(8 * h));
                let y = _mm256_div_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), inv), sw);
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * h), y);
            }
        }
    }
}

/// y = x W^T: w `[n, k]` packed, x `[m, k]` -> y `[m, n]`, each input row
/// rounded to 8 bits. Pieces of work are groups of panels (about 32 KiB of
/// weights) times up to 256 input rows; within one, each tile of eight
/// input rows passes over the group's panels.
pub fn matmul(w: &PackedI8, x: &[f32], m: usize, y: &mut [f32]) {
    let (n, k) = (w.n, w.k);
    assert_eq!(x.len(), m * k, "gemm8: x is not [{m}, {k}]");
    assert_eq!(y.len(), m * n, "gemm8: y is not [{m}, {n}]");
    if m == 0 || n == 0 {
        return;
    }
    let xq = Inputs::new(x, k);
    let panels = n.div_ceil(LANES);
    let group = ((32 << 10) / (k / 32 * PANEL_BLOCK).max(1)).clamp(1, panels);
    let groups = panels.div_ceil(group);
    let row_parts = m.div_ceil(ROWS_PER_TASK);
    let kernel = kernel();
    let y = par::DisjointMut::new(y);
    par::for_each_index(groups * row_parts, |t| {
        let (g, rp) = (t % groups, t / groups);
        let rows = rp * ROWS_PER_TASK..(m.min((rp + 1) * ROWS_PER_TASK));
        let mut out = [[0.0f32; LANES]; TILE];
        for i0 in rows.clone().step_by(TILE) {
            let tile = TILE.min(rows.end - i0);
            for p in g * group..panels.min((g + 1) * group) {
                kernel(w.panel(p), &xq, k, i0, &mut out[..tile]);
                let (c0, nc) = (p * LANES, LANES.min(n - p * LANES));
                for (r, o) in out[..tile].iter().enumerate() {
                    // SAFETY: this piece alone writes rows `rows` of
                    // its panels' columns.
                    let dst = unsafe { y.part((i0 + r) * n + c0, nc) };
                    dst.copy_from_slice(&o[..nc]);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: u64, len: usize) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Each output is the exact integer sum of the two sides' levels put
    /// through the three f32 operations; every copy of the kernel this CPU
    /// runs gives the portable copy's bits; sizes with a partial panel and
    /// partial tiles, a row of zeros on each side.
    #[test]
    fn outputs_are_the_exact_level_sums_scaled() {
        for (m, n, k) in [(1, 16, 32), (5, 37, 64), (13, 50, 96), (300, 20, 32)] {
            let mut w = lcg(n as u64, n * k);
            w[k..2 * k].fill(0.0);
            let mut x = lcg(7 + m as u64, m * k);
            x[..k].fill(0.0);
            let packed = PackedI8::quantize(&w, n, k);
            let mut y = vec![f32::NAN; m * n];
            matmul(&packed, &x, m, &mut y);
            let xi = Inputs::new(&x, k);
            let mut wl = vec![0i8; k];
            for j in 0..n {
                let sw = quantize_row(&w[j * k..(j + 1) * k], &mut wl);
                assert!(
                    wl.iter().all(|&l| l != -128),
                    "a weight level outside -127..=127"
                );
                for i in 0..m {
                    let xl = &xi.qs[i * k..(i + 1) * k];
                    let sum: i32 = xl.iter().zip(&wl).map(|(&a, &b)| a as i32 * b as i32).sum();
                    let want = dequantize(sum, xi.inv_scale[i], sw);
                    assert_eq!(
                        y[i * n + j].to_bits(),
                        want.to_bits(),
                        "({m},{n},{k}) [{i},{j}]"
                    );
                }
            }
            let mut copies: Vec<TileKernel> = vec![kernel()];
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU reports AVX2.
                copies.push(|w, x, k, i0, out| unsafe { avx2::tile(w, x, k, i0, out) });
            }
            for p in 0..n.div_ceil(LANES) {
                for i0 in (0..m).step_by(TILE) {
                    let t = TILE.min(m - i0);
                    let mut a = [[0.0f32; LANES]; TILE];
                    tile_portable(packed.panel(p), &xi, k, i0, &mut a[..t]);
                    for copy in &copies {
                        let mut b = [[0.0f32; LANES]; TILE];
                        copy(packed.panel(p), &xi, k, i0, &mut b[..t]);
                        assert_eq!(a, b, "copies differ: panel {p}, rows {i0}..");
                    }
                }
            }
        }
    }

    /// The input levels as CTranslate2 rounds them: through `+ 128` in f32,
    /// so a product just above a half, which alone rounds up, lands on
    /// 128.5 after the shift and rounds to the even 128: level 0.
    #[test]
    fn input_levels_round_through_the_shift() {
        let x = [1.0f32, 0.500_000_1 / 127.0, -1.0, 0.0];
        assert_eq!((x[1] * 127.0).round_ties_even(), 1.0);
        let q = Inputs::new(&x, 4);
        assert_eq!(q.qs, vec![127, 0, -127, 0]);
        assert_eq!(q.inv_scale, vec![1.0 / 127.0]);
        assert_eq!(q.shift, vec![0]);
    }
}
