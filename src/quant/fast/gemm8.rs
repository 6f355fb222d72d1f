//! The int8 matrix product over many input rows: Q8_0 weights repacked
//! into panels of 16 rows, inputs rounded to 8-bit levels in blocks of 32
//! as [`super::int8::Q8Input`] rounds them, every block's sum of level
//! products exact in i32 and scaled once (`d_w d_x`) into f32 lanes. One
//! pass over a panel's bytes serves up to eight input rows, so a product of
//! several rows (a beam's rows, an encoder's 1500 frames) reads each
//! weight once per eight rows instead of once per row, and with AVX-512
//! VNNI one `dpbusd` does 64 multiply-adds (16 weight rows by 4 bytes).
//!
//! `dpbusd` multiplies unsigned by signed bytes: the weights are stored
//! as `level + 128` (unsigned) and each input block's `128 * sum(levels)`
//! is subtracted from its sums, which leaves the exact sum of the signed
//! products. The portable copy computes the same integers and the same
//! f32 operations in the same order, so both give the same bits.

use rayon::prelude::*;

use super::f16_to_f32;
use super::int8::Q8Input;
use crate::quant::q8_0::BlockQ8_0;
use crate::util::par;

/// Weight rows a panel (the f32 lanes of one AVX-512 register).
const LANES: usize = 16;
/// Bytes of one block of one panel: 8 groups of 16 rows x 4 levels, then
/// the 16 rows' f32 scales.
const PANEL_BLOCK: usize = 8 * 64 + LANES * 4;
/// Input rows one pass over a panel serves.
const TILE: usize = 8;
/// Input rows a piece of parallel work takes at most.
const ROWS_PER_TASK: usize = 256;

/// Q8_0 weights `[n, k]` repacked for [`matmul`]: for each panel of 16
/// rows and each block of 32 columns, group g (columns 4g..4g + 4) holds
/// row r's four levels plus 128 at bytes `64 g + 4 r..`, then the rows'
/// scales as f32 (rows past `n` are zeros).
pub struct PackedQ8 {
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl PackedQ8 {
    /// Packs `n` Q8_0 rows of `k` elements (`k` a multiple of 32), back
    /// to back in `rows`.
    pub fn pack(rows: &[u8], n: usize, k: usize) -> PackedQ8 {
        assert!(k.is_multiple_of(32), "PackedQ8: rows are not whole blocks");
        let nb = k / 32;
        let blocks: &[BlockQ8_0] = bytemuck::cast_slice(rows);
        assert_eq!(blocks.len(), n * nb, "PackedQ8: not {n} rows of {k}");
        let panels = n.div_ceil(LANES);
        let mut data = vec![0u8; panels * nb * PANEL_BLOCK];
        data.par_chunks_mut(nb * PANEL_BLOCK)
            .enumerate()
            .for_each(|(p, panel)| {
                for (b, out) in panel.chunks_exact_mut(PANEL_BLOCK).enumerate() {
                    for r in 0..LANES {
                        let row = p * LANES + r;
                        let (d, qs) = match blocks.get(row * nb + b) {
                            Some(blk) if row < n => (f16_to_f32(blk.d), blk.qs),
                            _ => (0.0, [0; 32]),
                        };
                        for (c, &q) in qs.iter().enumerate() {
                            out[(c / 4) * 64 + r * 4 + c % 4] = q ^ 0x80;
                        }
                        out[512 + 4 * r..512 + 4 * r + 4].copy_from_slice(&d.to_le_bytes());
                    }
                }
            });
        PackedQ8 { n, k, data }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    fn panel(&self, p: usize) -> &[u8] {
        let size = self.k / 32 * PANEL_BLOCK;
        &self.data[p * size..(p + 1) * size]
    }
}

/// Input rows `[m, k]` in blocks of 32 levels: the levels, each block's
/// scale, and each block's `128 * sum(levels)`.
struct Inputs {
    qs: Vec<i8>,
    d: Vec<f32>,
    c: Vec<i32>,
}

impl Inputs {
    fn new(x: &[f32], k: usize) -> Inputs {
        let rows: Vec<Q8Input> = x.par_chunks(k).map(Q8Input::new).collect();
        let mut q = Inputs {
            qs: Vec::with_capacity(x.len()),
            d: Vec::with_capacity(x.len() / 32),
            c: Vec::with_capacity(x.len() / 32),
        };
        for r in rows {
            for b in r.qs.chunks_exact(32) {
                q.c.push(128 * b.iter().map(|&l| l as i32).sum::<i32>());
            }
            q.qs.extend_from_slice(&r.qs);
            q.d.extend_from_slice(&r.d);
        }
        q
    }
}

/// One panel times up to [`TILE`] input rows (`out.len()` of them, from
/// row `i0`): out[r][l] = the dot of weight row l with input row i0 + r.
type TileKernel = fn(&[u8], &Inputs, usize, usize, &mut [[f32; LANES]]);

/// The best copy of the tile kernel this CPU runs.
fn kernel() -> TileKernel {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the CPU reports the instructions.
        return |w, x, k, i0, out| unsafe { vnni::tile(w, x, k, i0, out) };
    }
    tile_portable
}

/// Whether this CPU has the fast copy (AVX-512 with VNNI); without it the
/// portable copy is slower than the row kernels of `tensor::matvec_rows`.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512f") && has!("avx512bw") && has!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn tile_portable(w: &[u8], x: &Inputs, k: usize, i0: usize, out: &mut [[f32; LANES]]) {
    let nb = k / 32;
    for (r, o) in out.iter_mut().enumerate() {
        let i = i0 + r;
        let mut acc = [0.0f32; LANES];
        for (b, blk) in w.chunks_exact(PANEL_BLOCK).enumerate() {
            let xq = &x.qs[i * k + b * 32..][..32];
            for (l, a) in acc.iter_mut().enumerate() {
                let mut s = 0i32;
                for (c, &v) in xq.iter().enumerate() {
                    s += blk[(c / 4) * 64 + l * 4 + c % 4] as i32 * v as i32;
                }
                let t = (s - x.c[i * nb + b]) as f32;
                let d = f32::from_le_bytes(blk[512 + 4 * l..512 + 4 * l + 4].try_into().unwrap());
                *a = t.mul_add(d * x.d[i * nb + b], *a);
            }
        }
        *o = acc;
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{Inputs, LANES, PANEL_BLOCK, TILE};
    use std::arch::x86_64::*;

    /// [`super::tile_portable`] with AVX-512 VNNI: per block, eight
    /// `dpbusd` a row (16 weight rows x 4 columns each), the weight
    /// register shared by the tile's rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile(w: &[u8], x: &Inputs, k: usize, i0: usize, out: &mut [[f32; LANES]]) {
        assert!(out.len() <= TILE && (i0 + out.len()) * k <= x.qs.len());
        assert_eq!(w.len(), k / 32 * PANEL_BLOCK, "gemm8: wrong panel size");
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
        w: &[u8],
        x: &Inputs,
        k: usize,
        i0: usize,
        out: &mut [[f32; LANES]],
    ) {
        let nb = k / 32;
        let (wp, xq) = (w.as_ptr(), x.qs.as_ptr().add(i0 * k));
        let (xd, xc) = (&x.d[i0 * nb..], &x.c[i0 * nb..]);
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..nb {
            let blk = wp.add(b * PANEL_BLOCK);
            let mut s = [_mm512_setzero_si512(); R];
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
            let d = _mm512_loadu_ps(blk.add(512).cast());
            for (r, (a, s)) in acc.iter_mut().zip(s).enumerate() {
                let t = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, _mm512_set1_epi32(xc[r * nb + b])));
                *a = _mm512_fmadd_ps(t, _mm512_mul_ps(d, _mm512_set1_ps(xd[r * nb + b])), *a);
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            _mm512_storeu_ps(o.as_mut_ptr(), a);
        }
    }
}

/// y = x W^T: w `[n, k]` packed, x `[m, k]` -> y `[m, n]`, the inputs
/// rounded to 8 bits in blocks of 32. Pieces of work are groups of panels
/// (about 32 KiB of weights) times up to 256 input rows; within one, each
/// tile of eight input rows passes over the group's panels.
pub fn matmul(w: &PackedQ8, x: &[f32], m: usize, y: &mut [f32]) {
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
    use crate::quant::q8_0;

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

    /// Each output against the dot of the dequantised weights with the
    /// dequantised input levels in f64 (what the integer sums compute
    /// exactly, before the f32 scaling); the fast copy bit-equal to the
    /// portable one; sizes with a partial panel and partial tiles.
    #[test]
    fn matches_the_dequantised_product() {
        for (m, n, k) in [(1, 16, 32), (5, 37, 64), (13, 50, 96), (300, 20, 32)] {
            let w = lcg(n as u64, n * k);
            let x = lcg(7 + m as u64, m * k);
            let mut blocks = vec![BlockQ8_0::default(); n * k / 32];
            q8_0::quantize(&w, &mut blocks);
            let wq: Vec<f32> = blocks
                .iter()
                .flat_map(|b| b.qs.map(|q| f16_to_f32(b.d) * q as i8 as f32))
                .collect();
            let packed = PackedQ8::pack(bytemuck::cast_slice(&blocks), n, k);
            let mut y = vec![f32::NAN; m * n];
            matmul(&packed, &x, m, &mut y);
            let xi = Inputs::new(&x, k);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|c| {
                            let xv = xi.qs[i * k + c] as f64 * xi.d[i * k / 32 + c / 32] as f64;
                            xv * wq[j * k + c] as f64
                        })
                        .sum();
                    let got = y[i * n + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "({m},{n},{k}) [{i},{j}]: {got} vs {want}"
                    );
                }
            }
            let panels = n.div_ceil(LANES);
            for p in 0..panels {
                for i0 in (0..m).step_by(TILE) {
                    let t = TILE.min(m - i0);
                    let mut a = [[0.0f32; LANES]; TILE];
                    let mut b = a;
                    tile_portable(packed.panel(p), &xi, k, i0, &mut a[..t]);
                    kernel()(packed.panel(p), &xi, k, i0, &mut b[..t]);
                    assert_eq!(a, b, "copies differ: panel {p}, rows {i0}..");
                }
            }
        }
    }
}
