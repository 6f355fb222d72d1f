//! The fast CPU matrix multiply, for the CPU backend's heavy lifting. Same
//! contract as [`super::matmul()`] (the plain oracle it is tested against):
//! y[m, n] = x[m, k] · w[n, k]^T + `bias[n]`, with the weights repacked once.
//!
//! The weights are stored in panels of 16 rows of w, k-major (`[k][16]`), so
//! one k step of a panel is 16 contiguous floats: two 8-wide vectors. The
//! inner kernel holds a 6 x 16 block of y in 12 vector accumulators and, per
//! k, loads the two panel vectors, broadcasts 6 values of x and issues 12
//! fused multiply-adds (the classic 6x16 AVX2 sgemm kernel); no horizontal
//! sums. Blocks of rows of y are computed in parallel. On x86_64 with AVX2
//! and FMA (checked at run time) the kernel uses those instructions;
//! elsewhere the same loops in plain Rust, which compilers vectorise.

use rayon::prelude::*;

/// Rows of y in one register block.
const MR: usize = 6;
/// Rows of w per panel (columns of y in one register block).
const NR: usize = 16;
/// The width of one packed panel of [`matmul_columns`]' b: [k][16].
pub const PANEL_WIDTH: usize = NR;
/// At most this many rows of y per parallel task.
const MB: usize = 96;
/// The most elements of x (256 KiB) for which [`matmul_packed`] streams
/// w once past all of x rather than once per block of rows.
const WIDE_X: usize = 1 << 16;

/// A weight matrix [n, k] repacked for [`matmul_packed`].
#[derive(Clone, Debug)]
pub struct PackedMatrix {
    n: usize,
    k: usize,
    /// ceil(n / 16) panels of [k][16]; rows past n are zero.
    panels: Vec<f32>,
}

impl PackedMatrix {
    /// Packs a row-major [n, k] matrix (PyTorch's Linear layout).
    pub fn pack(w: &[f32], n: usize, k: usize) -> PackedMatrix {
        assert_eq!(w.len(), n * k, "PackedMatrix: w is not [n, k]");
        let mut panels = vec![0.0f32; n.div_ceil(NR) * k * NR];
        for (p, panel) in panels.chunks_exact_mut(k * NR).enumerate() {
            for j in 0..NR.min(n - p * NR) {
                let row = &w[(p * NR + j) * k..(p * NR + j + 1) * k];
                for (kk, v) in row.iter().enumerate() {
                    panel[kk * NR + j] = *v;
                }
            }
        }
        PackedMatrix { n, k, panels }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }
}

/// y[m, n] = x[m, k] · w[n, k]^T (+ `bias[n]`) for a packed w; equal to
/// [`super::matmul()`]'s result up to the order of the additions.
pub fn matmul_packed(x: &[f32], w: &PackedMatrix, bias: Option<&[f32]>, m: usize, y: &mut [f32]) {
    let (n, k) = (w.n, w.k);
    assert_eq!(x.len(), m * k, "matmul_packed: x is not [m, k]");
    assert_eq!(y.len(), m * n, "matmul_packed: y is not [m, n]");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "matmul_packed: bias is not [n]");
    }
    if m == 0 || n == 0 {
        return;
    }
    let simd = Simd::detect();
    let threads = rayon::current_num_threads();
    // Blocks of at most MB rows, as many as a multiple of the threads (so
    // none waits on a last odd one), each a whole number of register blocks.
    let blocks = m.div_ceil(MB).next_multiple_of(threads);
    let rows = m.div_ceil(blocks).next_multiple_of(MR);
    if rows < m && n >= 4 * m && m * k <= WIDE_X {
        // Tens of rows against many columns (a CTC head's 6,625 classes):
        // x stays in cache while w streams past once, a run of panels per
        // task. The same sums, element by element.
        let pack = |_: usize, c0: usize, _: usize, panel: &mut [f32]| {
            panel.copy_from_slice(&w.panels[c0 / NR * k * NR..][..k * NR]);
        };
        let epilogue = |_: usize, _: usize, c0: usize, piece: &mut [f32]| {
            if let Some(b) = bias {
                super::add_assign(piece, &b[c0..c0 + piece.len()]);
            }
        };
        matmul_columns_batched(x, [m, k, n], 1, y, pack, epilogue);
        return;
    }
    if rows >= m && threads > 1 && w.panels.len() / (k * NR).max(1) > 1 {
        // One block of rows (a short batch): share the panels out instead.
        let cols: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(NR))
            .into_par_iter()
            .map(|p| {
                let mut out = vec![0.0f32; m * NR];
                block(simd, x, w, p, m, &mut out, NR);
                (p, out)
            })
            .collect();
        for (p, out) in cols {
            let nc = NR.min(n - p * NR);
            for i in 0..m {
                y[i * n + p * NR..i * n + p * NR + nc].copy_from_slice(&out[i * NR..i * NR + nc]);
            }
        }
        if let Some(b) = bias {
            for row in y.chunks_exact_mut(n) {
                super::add_assign(row, b);
            }
        }
    } else {
        y.par_chunks_mut(rows * n)
            .zip(x.par_chunks(rows * k))
            .for_each(|(yb, xb)| {
                let mb = yb.len() / n;
                for p in (0..n.div_ceil(NR)).step_by(2) {
                    block_pair(simd, xb, w, p, mb, &mut yb[p * NR..], n);
                }
                if let Some(b) = bias {
                    for row in yb.chunks_exact_mut(n) {
                        super::add_assign(row, b);
                    }
                }
            });
    }
}

/// [`block`] for panels p and p + 1 (p alone when it is the last).
fn block_pair(
    simd: Simd,
    x: &[f32],
    w: &PackedMatrix,
    p: usize,
    mb: usize,
    y: &mut [f32],
    ys: usize,
) {
    let k = w.k;
    let first = &w.panels[p * k * NR..(p + 1) * k * NR];
    let second = w
        .panels
        .get((p + 1) * k * NR..(p + 2) * k * NR)
        .unwrap_or(&[]);
    let pair = if second.is_empty() { 1 } else { 2 };
    for i0 in (0..mb).step_by(MR) {
        let mr = MR.min(mb - i0);
        let accs = simd.kernel_pair(&x[i0 * k..(i0 + mr) * k], first, second, k, mr);
        for (h, acc) in accs.iter().enumerate().take(pair) {
            let nc = NR.min(w.n - (p + h) * NR);
            for (i, row) in acc.iter().enumerate().take(mr) {
                let at = (i0 + i) * ys + h * NR;
                y[at..at + nc].copy_from_slice(&row[..nc]);
            }
        }
    }
}

/// y[i, 0..16] (row stride `ys`, only columns < n written) for the `mb` rows
/// of x against panel `p` of w.
fn block(simd: Simd, x: &[f32], w: &PackedMatrix, p: usize, mb: usize, y: &mut [f32], ys: usize) {
    let k = w.k;
    let panel = &w.panels[p * k * NR..(p + 1) * k * NR];
    let nc = NR.min(w.n - p * NR);
    for i0 in (0..mb).step_by(MR) {
        let mr = MR.min(mb - i0);
        let acc = simd.kernel(&x[i0 * k..(i0 + mr) * k], panel, k, mr);
        for (i, row) in acc.iter().enumerate().take(mr) {
            y[(i0 + i) * ys..(i0 + i) * ys + nc].copy_from_slice(&row[..nc]);
        }
    }
}

/// Column panels per parallel task in [`matmul_columns`], at most: the
/// task's packed operand (k x 16 floats a panel) stays in L2.
const COLUMN_PANELS: usize = 8;

/// y[m, n] = a[m, k] · b[k, n] with b never stored whole: `pack(col0,
/// cols, panel)` writes columns col0..col0 + cols (cols <= 16) of b into
/// `panel` as [k][16] (entries past `cols` must be zero or are ignored),
/// and `epilogue(row, col0, piece)` runs once over each finished piece of
/// row `row` of y (columns col0.., in place) while it is still in cache.
///
/// For convolutions in NCHW order: a is the [c_out, c_in * kh * kw]
/// weight, b the image's channels (a 1x1 layer) or their im2col columns
/// packed on the fly, y the output planes. Tasks own runs of columns (so
/// b is packed once and a streams past it); each element of y is the same
/// k-ordered sum of fused multiply-adds as in [`matmul_packed`].
pub fn matmul_columns<P, E>(
    a: &[f32],
    m: usize,
    k: usize,
    n: usize,
    y: &mut [f32],
    pack: P,
    epilogue: E,
) where
    P: Fn(usize, usize, &mut [f32]) + Sync,
    E: Fn(usize, usize, &mut [f32]) + Sync,
{
    matmul_columns_batched(
        a,
        [m, k, n],
        1,
        y,
        |_, c0, cols, panel| pack(c0, cols, panel),
        |_, row, c0, piece| epilogue(row, c0, piece),
    )
}

/// [`matmul_columns`] for `images` products with the same a at once:
/// y[image] = a · b[image], y is [images][m][n], and `pack` and `epilogue`
/// take the image first. One pool of tasks for all of them (a task owns a
/// run of columns of one image), so a batch costs one parallel pass; each
/// element is the same sum as for its image alone.
pub fn matmul_columns_batched<P, E>(
    a: &[f32],
    [m, k, n]: [usize; 3],
    images: usize,
    y: &mut [f32],
    pack: P,
    epilogue: E,
) where
    P: Fn(usize, usize, usize, &mut [f32]) + Sync,
    E: Fn(usize, usize, usize, &mut [f32]) + Sync,
{
    assert_eq!(a.len(), m * k, "matmul_columns: a is not [m, k]");
    assert_eq!(
        y.len(),
        images * m * n,
        "matmul_columns: y is not [images, m, n]"
    );
    if m == 0 || n == 0 || images == 0 {
        return;
    }
    let simd = Simd::detect();
    let threads = rayon::current_num_threads();
    let panels = n.div_ceil(NR);
    // A few tasks per thread, so uneven ones even out.
    let per_task = (images * panels)
        .div_ceil(4 * threads)
        .clamp(1, COLUMN_PANELS);
    let cols = per_task * NR;
    let per_image = n.div_ceil(cols);
    // Each task owns one run of columns of every row of one image's y.
    let mut tasks: Vec<Vec<&mut [f32]>> = (0..images * per_image)
        .map(|_| Vec::with_capacity(m))
        .collect();
    for (image, planes) in y.chunks_mut(m * n).enumerate() {
        for row in planes.chunks_mut(n) {
            let image_tasks = &mut tasks[image * per_image..(image + 1) * per_image];
            for (task, piece) in image_tasks.iter_mut().zip(row.chunks_mut(cols)) {
                task.push(piece);
            }
        }
    }
    tasks.into_par_iter().enumerate().for_each(|(t, mut rows)| {
        let (image, c0) = (t / per_image, (t % per_image) * cols);
        let width = rows[0].len();
        let count = width.div_ceil(NR);
        let mut packed = vec![0.0f32; count * k * NR];
        for (p, panel) in packed.chunks_exact_mut(k * NR).enumerate() {
            pack(image, c0 + p * NR, NR.min(width - p * NR), panel);
        }
        for i0 in (0..m).step_by(MR) {
            let mr = MR.min(m - i0);
            let ab = &a[i0 * k..(i0 + mr) * k];
            // Two panels a step: 12 accumulators with 16-wide vectors.
            for (q, pair) in packed.chunks(2 * k * NR).enumerate() {
                let (first, second) = pair.split_at(k * NR);
                let accs = simd.kernel_pair(ab, first, second, k, mr);
                for (h, acc) in accs.iter().enumerate().take(pair.len() / (k * NR)) {
                    let at = (2 * q + h) * NR;
                    let nc = NR.min(width - at);
                    for (i, row) in acc.iter().enumerate().take(mr) {
                        copy_panel_row(&mut rows[i0 + i][at..at + nc], row);
                    }
                }
            }
            for (i, piece) in rows[i0..i0 + mr].iter_mut().enumerate() {
                epilogue(image, i0 + i, c0, piece);
            }
        }
    });
}

/// dst = src[..dst.len()] for a row of one panel (at most 16 floats):
/// a whole row as one fixed-size move rather than a call to memcpy.
#[inline(always)]
fn copy_panel_row(dst: &mut [f32], src: &[f32; NR]) {
    match <&mut [f32; NR]>::try_from(&mut *dst) {
        Ok(whole) => *whole = *src,
        Err(_) => dst.copy_from_slice(&src[..dst.len()]),
    }
}

#[derive(Clone, Copy)]
enum Simd {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    /// AVX2 and FMA for single panels, AVX-512 for pairs.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Simd {
    fn detect() -> Simd {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            if is_x86_feature_detected!("avx512f") {
                return Simd::Avx512;
            }
            return Simd::Avx2Fma;
        }
        Simd::Portable
    }

    /// [`Simd::kernel`] for two panels (`second` may be empty: then only
    /// the first result is meaningful). Same sums, element by element.
    fn kernel_pair(
        self,
        x: &[f32],
        first: &[f32],
        second: &[f32],
        k: usize,
        mr: usize,
    ) -> [[[f32; NR]; MR]; 2] {
        match self {
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 if second.len() == k * NR => {
                assert!(
                    mr <= MR && x.len() == mr * k && first.len() == k * NR,
                    "kernel_pair: operands out of shape"
                );
                // SAFETY: detect() found AVX-512F; the checks above keep
                // every load inside x and the two panels.
                unsafe { avx512::kernel_pair(x, first, second, k, mr) }
            }
            _ => {
                let one = self.kernel(x, first, k, mr);
                let two = if second.is_empty() {
                    [[0.0; NR]; MR]
                } else {
                    self.kernel(x, second, k, mr)
                };
                [one, two]
            }
        }
    }

    /// The [mr, 16] block of x rows (mr <= 6, each k long) times one panel.
    fn kernel(self, x: &[f32], panel: &[f32], k: usize, mr: usize) -> [[f32; NR]; MR] {
        assert!(
            mr <= MR && x.len() == mr * k && panel.len() == k * NR,
            "kernel: operands out of shape"
        );
        match self {
            Simd::Portable => portable_kernel(x, panel, k, mr),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: detect() found AVX2 and FMA; the assert above keeps
            // every load inside x and the panel.
            Simd::Avx2Fma | Simd::Avx512 => unsafe { avx2::kernel(x, panel, k, mr) },
        }
    }
}

fn portable_kernel(x: &[f32], panel: &[f32], k: usize, mr: usize) -> [[f32; NR]; MR] {
    let mut acc = [[0.0f32; NR]; MR];
    for (kk, wv) in panel.chunks_exact(NR).enumerate() {
        for (i, a) in acc.iter_mut().enumerate().take(mr) {
            let xv = x[i * k + kk];
            for (a, w) in a.iter_mut().zip(wv) {
                *a += xv * w;
            }
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// See [`super::Simd::kernel`].
    ///
    /// # Safety
    /// Needs AVX2 and FMA; x holds mr rows of k, the panel k * 16 floats.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn kernel(x: &[f32], panel: &[f32], k: usize, mr: usize) -> [[f32; NR]; MR] {
        match mr {
            6 => rows::<6>(x, panel, k),
            5 => rows::<5>(x, panel, k),
            4 => rows::<4>(x, panel, k),
            3 => rows::<3>(x, panel, k),
            2 => rows::<2>(x, panel, k),
            _ => rows::<1>(x, panel, k),
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows<const R: usize>(x: &[f32], panel: &[f32], k: usize) -> [[f32; NR]; MR] {
        let (xp, wp) = (x.as_ptr(), panel.as_ptr());
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for kk in 0..k {
            let w0 = _mm256_loadu_ps(wp.add(kk * NR));
            let w1 = _mm256_loadu_ps(wp.add(kk * NR + 8));
            for i in 0..R {
                let xv = _mm256_broadcast_ss(&*xp.add(i * k + kk));
                lo[i] = _mm256_fmadd_ps(xv, w0, lo[i]);
                hi[i] = _mm256_fmadd_ps(xv, w1, hi[i]);
            }
        }
        let mut out = [[0.0f32; NR]; MR];
        for i in 0..R {
            _mm256_storeu_ps(out[i].as_mut_ptr(), lo[i]);
            _mm256_storeu_ps(out[i].as_mut_ptr().add(8), hi[i]);
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// See [`super::Simd::kernel_pair`]: one 16-wide vector per panel row
    /// step, so each output element gets the same fused multiply-adds in
    /// the same k order as the AVX2 kernel.
    ///
    /// # Safety
    /// Needs AVX-512F; x holds mr rows of k, each panel k * 16 floats.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn kernel_pair(
        x: &[f32],
        a: &[f32],
        b: &[f32],
        k: usize,
        mr: usize,
    ) -> [[[f32; NR]; MR]; 2] {
        match mr {
            6 => rows::<6>(x, a, b, k),
            5 => rows::<5>(x, a, b, k),
            4 => rows::<4>(x, a, b, k),
            3 => rows::<3>(x, a, b, k),
            2 => rows::<2>(x, a, b, k),
            _ => rows::<1>(x, a, b, k),
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn rows<const R: usize>(
        x: &[f32],
        a: &[f32],
        b: &[f32],
        k: usize,
    ) -> [[[f32; NR]; MR]; 2] {
        let (xp, ap, bp) = (x.as_ptr(), a.as_ptr(), b.as_ptr());
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for kk in 0..k {
            let w0 = _mm512_loadu_ps(ap.add(kk * NR));
            let w1 = _mm512_loadu_ps(bp.add(kk * NR));
            for i in 0..R {
                let xv = _mm512_set1_ps(*xp.add(i * k + kk));
                lo[i] = _mm512_fmadd_ps(xv, w0, lo[i]);
                hi[i] = _mm512_fmadd_ps(xv, w1, hi[i]);
            }
        }
        let mut out = [[[0.0f32; NR]; MR]; 2];
        for i in 0..R {
            _mm512_storeu_ps(out[0][i].as_mut_ptr(), lo[i]);
            _mm512_storeu_ps(out[1][i].as_mut_ptr(), hi[i]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::rng::Rng;

    #[test]
    fn matches_the_plain_matmul() {
        let mut rng = Rng::new(11);
        // Odd sizes around the register block and panel edges, one row,
        // and shapes that take each way of sharing out the work (blocks of
        // rows, single panels, runs of columns: the last one).
        for (m, k, n) in [
            (1, 33, 7),
            (5, 8, 65),
            (7, 1, 3),
            (50, 384, 129),
            (97, 1031, 66),
            (130, 17, 5),
            (300, 64, 40),
            (240, 120, 1000),
        ] {
            let x = rng.vec(m * k, -1.0, 1.0);
            let w = rng.vec(n * k, -1.0, 1.0);
            let b = rng.vec(n, -1.0, 1.0);
            let mut want = vec![0.0; m * n];
            let mut got = vec![f32::NAN; m * n];
            super::super::matmul(&x, &w, Some(&b), m, k, n, &mut want);
            let packed = PackedMatrix::pack(&w, n, k);
            assert_eq!((packed.rows(), packed.cols()), (n, k));
            matmul_packed(&x, &packed, Some(&b), m, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // Only the summation order differs: a few ulps of sqrt(k).
                assert!(
                    (g - w).abs() <= 1e-5 * (k as f32).sqrt(),
                    "m={m} k={k} n={n} element {i}: {g} vs {w}"
                );
            }
        }
    }
}
