//! 2-D pooling and transposed convolution over one image in NCHW order
//! (`[c, h, w]`, row-major), as ONNX defines MaxPool, AveragePool and
//! ConvTranspose.

use rayon::prelude::*;

/// The window geometry of a 2-D pooling over one plane (floor rounding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2d {
    pub h_in: usize,
    pub w_in: usize,
    /// [height, width]
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    /// [top, left, bottom, right]
    pub pad: [usize; 4],
}

impl Pool2d {
    pub fn h_out(&self) -> usize {
        (self.h_in + self.pad[0] + self.pad[2] - self.kernel[0]) / self.stride[0] + 1
    }

    pub fn w_out(&self) -> usize {
        (self.w_in + self.pad[1] + self.pad[3] - self.kernel[1]) / self.stride[1] + 1
    }

    pub fn check(&self) -> Result<(), String> {
        let ok = self.kernel.iter().all(|&k| k > 0)
            && self.stride.iter().all(|&s| s > 0)
            && self.h_in + self.pad[0] + self.pad[2] >= self.kernel[0]
            && self.w_in + self.pad[1] + self.pad[3] >= self.kernel[1];
        if ok {
            Ok(())
        } else {
            Err(format!("invalid pooling {self:?}"))
        }
    }

    /// The input rows (or columns) output index `o` covers on axis `a`
    /// (0 vertical, 1 horizontal), padding excluded.
    fn window(&self, a: usize, o: usize) -> std::ops::Range<usize> {
        let n = [self.h_in, self.w_in][a];
        let start = (o * self.stride[a]) as isize - self.pad[a] as isize;
        let end = start + self.kernel[a] as isize;
        start.max(0) as usize..(end.max(0) as usize).min(n)
    }
}

/// x: [h_in, w_in] -> y: [h_out, w_out], the largest value of each window
/// (padding never wins).
pub fn max_pool2d(p: &Pool2d, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), p.h_in * p.w_in, "max_pool2d: x is not [h, w]");
    assert_eq!(y.len(), p.h_out() * p.w_out(), "max_pool2d: y size");
    let wo = p.w_out();
    for (oy, row) in y.chunks_exact_mut(wo).enumerate() {
        for (ox, out) in row.iter_mut().enumerate() {
            let mut m = f32::NEG_INFINITY;
            for r in p.window(0, oy) {
                for c in p.window(1, ox) {
                    m = m.max(x[r * p.w_in + c]);
                }
            }
            *out = m;
        }
    }
}

/// x: [h_in, w_in] -> y: [h_out, w_out], the mean of each window: over the
/// whole kernel when `count_include_pad`, else over its pixels inside the
/// image.
pub fn avg_pool2d(p: &Pool2d, x: &[f32], count_include_pad: bool, y: &mut [f32]) {
    assert_eq!(x.len(), p.h_in * p.w_in, "avg_pool2d: x is not [h, w]");
    assert_eq!(y.len(), p.h_out() * p.w_out(), "avg_pool2d: y size");
    let wo = p.w_out();
    for (oy, row) in y.chunks_exact_mut(wo).enumerate() {
        for (ox, out) in row.iter_mut().enumerate() {
            let (rows, cols) = (p.window(0, oy), p.window(1, ox));
            let mut sum = 0.0f32;
            for r in rows.clone() {
                for c in cols.clone() {
                    sum += x[r * p.w_in + c];
                }
            }
            let count = if count_include_pad {
                p.kernel[0] * p.kernel[1]
            } else {
                rows.len() * cols.len()
            };
            *out = sum / count.max(1) as f32;
        }
    }
}

/// The geometry of a 2-D transposed convolution (no dilation or output
/// padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2d {
    pub c_in: usize,
    pub h_in: usize,
    pub w_in: usize,
    pub c_out: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    /// [top, left, bottom, right]: cropped from the full output.
    pub pad: [usize; 4],
    pub groups: usize,
}

impl ConvTranspose2d {
    pub fn h_out(&self) -> usize {
        (self.h_in - 1) * self.stride[0] + self.kh - self.pad[0] - self.pad[2]
    }

    pub fn w_out(&self) -> usize {
        (self.w_in - 1) * self.stride[1] + self.kw - self.pad[1] - self.pad[3]
    }

    /// Elements of the weight `[c_in, c_out / groups, kh, kw]`.
    pub fn weight_len(&self) -> usize {
        self.c_in * (self.c_out / self.groups.max(1)) * self.kh * self.kw
    }

    pub fn check(&self) -> Result<(), String> {
        let ok = self.groups > 0
            && self.c_in.is_multiple_of(self.groups)
            && self.c_out.is_multiple_of(self.groups)
            && self.c_in > 0
            && self.h_in > 0
            && self.w_in > 0
            && self.stride.iter().all(|&s| s > 0)
            && (self.h_in - 1) * self.stride[0] + self.kh > self.pad[0] + self.pad[2]
            && (self.w_in - 1) * self.stride[1] + self.kw > self.pad[1] + self.pad[3];
        if ok {
            Ok(())
        } else {
            Err(format!("invalid transposed convolution {self:?}"))
        }
    }

    /// Panics (naming `who`) unless x, w, b and y have this layer's sizes.
    fn assert_sizes(&self, who: &str, x: &[f32], w: &[f32], b: &[f32], y: &[f32]) {
        assert_eq!(x.len(), self.c_in * self.h_in * self.w_in, "{who}: x size");
        assert_eq!(w.len(), self.weight_len(), "{who}: w size");
        assert_eq!(b.len(), self.c_out, "{who}: b size");
        let out = self.c_out * self.h_out() * self.w_out();
        assert_eq!(y.len(), out, "{who}: y size");
    }
}

/// x: [c_in, h_in, w_in], w: [c_in, c_out / groups, kh, kw], b: `[c_out]`
/// -> y: [c_out, h_out, w_out]. Each output pixel gathers the input pixels
/// whose strided kernel footprint covers it: y[o, oy, ox] = b[o] + sum over
/// the group's input channels i and taps (ky, kx) with
/// iy * stride + ky - pad_top = oy (same across) of x[i, iy, ix] * w[i, o, ky, kx],
/// summed in the order input channel, kernel row, kernel column.
pub fn conv_transpose2d(g: &ConvTranspose2d, x: &[f32], w: &[f32], b: &[f32], y: &mut [f32]) {
    g.assert_sizes("conv_transpose2d", x, w, b, y);
    let (ho, wo) = (g.h_out(), g.w_out());
    let (cig, cog) = (g.c_in / g.groups, g.c_out / g.groups);
    let taps = |o: usize, k: usize, s: usize, pad: usize, n: usize| -> Option<usize> {
        // Input index i with i * s + k = o + pad.
        let t = o + pad;
        if t < k || !(t - k).is_multiple_of(s) {
            return None;
        }
        let i = (t - k) / s;
        (i < n).then_some(i)
    };
    y.par_chunks_mut(ho * wo)
        .enumerate()
        .for_each(|(o, plane)| {
            let group = o / cog;
            let oc = o % cog;
            for oy in 0..ho {
                for ox in 0..wo {
                    let mut acc = 0.0f32;
                    for ic in group * cig..(group + 1) * cig {
                        for ky in 0..g.kh {
                            let Some(iy) = taps(oy, ky, g.stride[0], g.pad[0], g.h_in) else {
                                continue;
                            };
                            for kx in 0..g.kw {
                                let Some(ix) = taps(ox, kx, g.stride[1], g.pad[1], g.w_in) else {
                                    continue;
                                };
                                acc += x[(ic * g.h_in + iy) * g.w_in + ix]
                                    * w[((ic * cog + oc) * g.kh + ky) * g.kw + kx];
                            }
                        }
                    }
                    plane[oy * wo + ox] = acc + b[o];
                }
            }
        });
}

/// [`conv_transpose2d`] for an ungrouped layer as one matrix product and a
/// scatter: t[(o, ky, kx), pixel] = sum over input channels of
/// w[i, o, ky, kx] * x[i, pixel] (fused multiply-adds in channel order,
/// through [`super::matmul_columns`]), then each output pixel sums its taps
/// in the order kernel row, kernel column, bias last. Equal to the
/// reference up to rounding (the reference sums channels innermost). Then
/// `tail(channel, piece)` runs over the output, a piece of a plane at a
/// time.
///
/// A kernel that tiles the output (kernel = stride, no padding: the DB
/// head's 2x2 upsampling) gives each output pixel exactly one tap: then
/// the product runs a band of input rows at a time, each band scattered
/// (with the bias and the tail) while it is in cache, and the whole t is
/// never stored.
pub fn conv_transpose2d_gemm<T>(
    g: &ConvTranspose2d,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    y: &mut [f32],
    tail: T,
) where
    T: Fn(usize, &mut [f32]) + Sync,
{
    assert_eq!(g.groups, 1, "conv_transpose2d_gemm: {g:?} is grouped");
    g.assert_sizes("conv_transpose2d_gemm", x, w, b, y);
    let (ho, wo) = (g.h_out(), g.w_out());
    let (n, taps) = (g.h_in * g.w_in, g.kh * g.kw);
    let rows = g.c_out * taps;
    // wt[(o, tap), i] = w[i, o, tap]
    let mut wt = vec![0.0f32; rows * g.c_in];
    for (i, wi) in w.chunks_exact(rows).enumerate() {
        for (r, &v) in wi.iter().enumerate() {
            wt[r * g.c_in + i] = v;
        }
    }
    if [g.kh, g.kw] == g.stride && g.pad == [0; 4] {
        tiling_transpose(g, x, &wt, b, y, tail);
        return;
    }
    let mut t = vec![0.0f32; rows * n];
    let pack = |c0: usize, cols: usize, panel: &mut [f32]| {
        for (i, dst) in panel.chunks_exact_mut(super::PANEL_WIDTH).enumerate() {
            dst[..cols].copy_from_slice(&x[i * n + c0..i * n + c0 + cols]);
        }
    };
    super::matmul_columns(&wt, rows, g.c_in, n, &mut t, pack, |_, _, _| {});
    let [s_y, s_x] = g.stride;
    y.par_chunks_mut(ho * wo)
        .zip(t.par_chunks(taps * n))
        .zip(b.par_iter())
        .enumerate()
        .for_each(|(o, ((plane, to), &bias))| {
            plane.fill(0.0);
            for ky in 0..g.kh {
                for kx in 0..g.kw {
                    let tap = &to[(ky * g.kw + kx) * n..][..n];
                    for iy in 0..g.h_in {
                        // Output row iy * stride + ky - pad_top, if inside.
                        let Some(oy) = (iy * s_y + ky).checked_sub(g.pad[0]).filter(|&v| v < ho)
                        else {
                            continue;
                        };
                        let row = &mut plane[oy * wo..(oy + 1) * wo];
                        for (ix, &v) in tap[iy * g.w_in..(iy + 1) * g.w_in].iter().enumerate() {
                            if let Some(ox) =
                                (ix * s_x + kx).checked_sub(g.pad[1]).filter(|&v| v < wo)
                            {
                                row[ox] += v;
                            }
                        }
                    }
                }
            }
            for v in plane.iter_mut() {
                *v += bias;
            }
            tail(o, plane);
        });
}

/// Floats of t a band of [`tiling_transpose`] holds at most (1 MiB).
const BAND_FLOATS: usize = 1 << 18;

/// [`conv_transpose2d_gemm`] for a kernel equal to its stride and no
/// padding, a band of input rows at a time; wt is [(o, tap), c_in].
fn tiling_transpose<T>(
    g: &ConvTranspose2d,
    x: &[f32],
    wt: &[f32],
    b: &[f32],
    y: &mut [f32],
    tail: T,
) where
    T: Fn(usize, &mut [f32]) + Sync,
{
    let (ho, wo) = (g.h_out(), g.w_out());
    let (n, taps) = (g.h_in * g.w_in, g.kh * g.kw);
    let rows = g.c_out * taps;
    let band = (BAND_FLOATS / (rows * g.w_in)).clamp(1, g.h_in);
    let mut t = vec![0.0f32; rows * band * g.w_in];
    for iy0 in (0..g.h_in).step_by(band) {
        let iys = band.min(g.h_in - iy0);
        let (p0, cols) = (iy0 * g.w_in, iys * g.w_in);
        let t = &mut t[..rows * cols];
        let pack = |c0: usize, width: usize, panel: &mut [f32]| {
            for (i, dst) in panel.chunks_exact_mut(super::PANEL_WIDTH).enumerate() {
                dst[..width].copy_from_slice(&x[i * n + p0 + c0..][..width]);
            }
        };
        super::matmul_columns(wt, rows, g.c_in, cols, t, pack, |_, _, _| {});
        // The band's output rows, each with its channel and row.
        let mut out: Vec<(usize, usize, &mut [f32])> = Vec::with_capacity(g.c_out * iys * g.kh);
        for (o, plane) in y.chunks_exact_mut(ho * wo).enumerate() {
            let band_rows = &mut plane[iy0 * g.kh * wo..(iy0 + iys) * g.kh * wo];
            for (r, row) in band_rows.chunks_exact_mut(wo).enumerate() {
                out.push((o, r, row));
            }
        }
        let t = &*t;
        out.into_par_iter().for_each(|(o, r, row)| {
            let (iy, ky) = (r / g.kh, r % g.kh);
            for kx in 0..g.kw {
                let tap = &t[(o * taps + ky * g.kw + kx) * cols + iy * g.w_in..][..g.w_in];
                for (ix, &v) in tap.iter().enumerate() {
                    // The reference's zero, its one tap, then the bias.
                    row[ix * g.kw + kx] = (0.0 + v) + b[o];
                }
            }
            tail(o, row);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::rng::Rng;

    #[test]
    fn transposed_gemm_matches_the_reference() {
        let mut rng = Rng::new(7);
        // (c_in, c_out, h, w, k, stride, pad): the DB head's 2x2 stride 2
        // (in bands of input rows: 3 bands for the 250-row one),
        // overlapping taps (3x3 stride 2), cropped borders.
        for (c_in, c_out, h, w, k, stride, pad) in [
            (1, 1, 1, 1, 2, [2, 2], [0; 4]),
            (24, 24, 7, 9, 2, [2, 2], [0; 4]),
            (3, 5, 250, 60, 2, [2, 2], [0; 4]),
            (5, 3, 6, 5, 3, [2, 2], [1, 1, 0, 1]),
            (7, 9, 5, 8, 3, [1, 2], [1; 4]),
            (17, 1, 11, 13, 4, [2, 3], [0, 2, 1, 0]),
        ] {
            let g = ConvTranspose2d {
                c_in,
                h_in: h,
                w_in: w,
                c_out,
                kh: k,
                kw: k,
                stride,
                pad,
                groups: 1,
            };
            g.check().unwrap();
            let x = rng.vec(c_in * h * w, -1.0, 1.0);
            let wt = rng.vec(g.weight_len(), -1.0, 1.0);
            let b = rng.vec(c_out, -1.0, 1.0);
            let len = c_out * g.h_out() * g.w_out();
            let (mut want, mut got) = (vec![0.0; len], vec![f32::NAN; len]);
            conv_transpose2d(&g, &x, &wt, &b, &mut want);
            // The tail sees every piece of each plane once: mark them.
            let tail = |o: usize, piece: &mut [f32]| {
                for v in piece {
                    *v += 10.0 * o as f32;
                }
            };
            conv_transpose2d_gemm(&g, &x, &wt, &b, &mut got, tail);
            let (terms, plane) = ((c_in * k * k) as f32, g.h_out() * g.w_out());
            for (i, (gv, wv)) in got.iter().zip(&want).enumerate() {
                let wv = wv + 10.0 * (i / plane) as f32;
                // Another summation order, |x|, |w| <= 1: ulps of sqrt(terms),
                // plus the marker's magnitude.
                assert!(
                    (gv - wv).abs() <= 1e-5 * terms.sqrt() + 4e-6 * wv.abs(),
                    "{g:?} element {i}: {gv} vs {wv}"
                );
            }
        }
    }

    #[test]
    fn pooling_windows() {
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect(); // [3, 4]
        let p = Pool2d {
            h_in: 3,
            w_in: 4,
            kernel: [3, 2],
            stride: [3, 2],
            pad: [0; 4],
        };
        let mut y = vec![0.0; 2];
        avg_pool2d(&p, &x, false, &mut y);
        assert_eq!(y, [(0.0 + 1.0 + 4.0 + 5.0 + 8.0 + 9.0) / 6.0, 6.5]);
        let p = Pool2d {
            kernel: [2, 2],
            stride: [2, 2],
            ..p
        };
        let mut y = vec![0.0; 2];
        max_pool2d(&p, &x, &mut y);
        assert_eq!(y, [5.0, 7.0]);
    }

    #[test]
    fn transposed_convolution_scatters_each_input_pixel() {
        // One channel, 2x2 input, 2x2 kernel, stride 2: each input pixel
        // becomes a 2x2 block scaled by the kernel.
        let g = ConvTranspose2d {
            c_in: 1,
            h_in: 2,
            w_in: 2,
            c_out: 1,
            kh: 2,
            kw: 2,
            stride: [2, 2],
            pad: [0; 4],
            groups: 1,
        };
        let x = [1.0, 2.0, 3.0, 4.0];
        let w = [1.0, 10.0, 100.0, 1000.0];
        let mut y = vec![0.0; 16];
        conv_transpose2d(&g, &x, &w, &[0.5], &mut y);
        assert_eq!(&y[..4], &[1.5, 10.5, 2.5, 20.5]);
        assert_eq!(&y[4..8], &[100.5, 1000.5, 200.5, 2000.5]);
        assert_eq!(y[15], 4000.5);
    }
}
