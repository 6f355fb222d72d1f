//! Convolutional-network ops on one image in NCHW order (`[c, h, w]`,
//! row-major): 2-D convolution with a fused activation, global average
//! pooling, per-channel scaling, nearest-neighbour resize and channel
//! concatenation.
//!
//! [`conv2d`] is the plain reference for every convolution. The faster
//! versions the models run are tested against it: [`conv2d_gemm`] for
//! ungrouped layers (fused multiply-adds: equal up to rounding),
//! [`conv2d_depthwise`] and [`conv2d_rows`] for grouped ones (the same
//! sums in the same order: equal).

use super::gemm::PANEL_WIDTH;
use rayon::prelude::*;

/// An activation applied to a convolution's output, as ONNX defines it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ConvActivation {
    None,
    Relu,
    /// x * clip(x + 3, 0, 6) / 6
    HardSwish,
    /// clip(alpha * x + beta, 0, 1)
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    Sigmoid,
}

impl ConvActivation {
    /// xs[i] = apply(xs[i] + bias), the activation chosen once for the
    /// whole slice so the loop vectorises.
    #[inline(always)]
    pub fn apply_biased(self, bias: f32, xs: &mut [f32]) {
        match self {
            ConvActivation::None => xs.iter_mut().for_each(|x| *x += bias),
            ConvActivation::Relu => xs.iter_mut().for_each(|x| *x = (*x + bias).max(0.0)),
            ConvActivation::HardSwish => xs.iter_mut().for_each(|x| {
                let v = *x + bias;
                *x = v * (v + 3.0).clamp(0.0, 6.0) / 6.0
            }),
            _ => xs.iter_mut().for_each(|x| *x = self.apply(*x + bias)),
        }
    }

    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            ConvActivation::None => x,
            ConvActivation::Relu => x.max(0.0),
            // Same operation order as the ONNX graphs that spell it out
            // (Add, Clip, Mul, Div).
            ConvActivation::HardSwish => x * (x + 3.0).clamp(0.0, 6.0) / 6.0,
            ConvActivation::HardSigmoid { alpha, beta } => (alpha * x + beta).clamp(0.0, 1.0),
            ConvActivation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        }
    }
}

/// The geometry of a 2-D convolution over one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2d {
    pub c_in: usize,
    pub h_in: usize,
    pub w_in: usize,
    pub c_out: usize,
    pub kh: usize,
    pub kw: usize,
    /// [vertical, horizontal]
    pub stride: [usize; 2],
    /// [top, left, bottom, right], as ONNX orders `pads` for 2-D.
    pub pad: [usize; 4],
    /// [vertical, horizontal]
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Conv2d {
    pub fn h_out(&self) -> usize {
        (self.h_in + self.pad[0] + self.pad[2] - self.dilation[0] * (self.kh - 1) - 1)
            / self.stride[0]
            + 1
    }

    pub fn w_out(&self) -> usize {
        (self.w_in + self.pad[1] + self.pad[3] - self.dilation[1] * (self.kw - 1) - 1)
            / self.stride[1]
            + 1
    }

    /// Elements of the weight tensor `[c_out, c_in / groups, kh, kw]`.
    pub fn weight_len(&self) -> usize {
        self.c_out * (self.c_in / self.groups) * self.kh * self.kw
    }

    /// A 1x1 convolution without stride, padding or groups: a matrix product.
    pub fn is_pointwise(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.stride == [1, 1]
            && self.pad == [0; 4]
            && self.groups == 1
    }

    /// One filter per channel.
    pub fn is_depthwise(&self) -> bool {
        self.groups == self.c_in && self.c_out == self.c_in && self.groups > 1
    }

    /// Checks that the sizes describe a convolution with a non-empty output.
    pub fn check(&self) -> Result<(), String> {
        let ok = self.groups > 0
            && self.c_in.is_multiple_of(self.groups)
            && self.c_out.is_multiple_of(self.groups)
            && self.kh > 0
            && self.kw > 0
            && self.stride.iter().all(|&s| s > 0)
            && self.dilation.iter().all(|&d| d > 0)
            && self.c_in > 0
            && self.c_out > 0
            && self.h_in + self.pad[0] + self.pad[2] > self.dilation[0] * (self.kh - 1)
            && self.w_in + self.pad[1] + self.pad[3] > self.dilation[1] * (self.kw - 1);
        if ok {
            Ok(())
        } else {
            Err(format!("invalid convolution {self:?}"))
        }
    }

    fn assert_buffers(&self, what: &str, x: &[f32], w: &[f32], b: &[f32], y: &[f32]) {
        assert_eq!(
            x.len(),
            self.c_in * self.h_in * self.w_in,
            "{what}: x is not [c_in, h, w]"
        );
        assert_eq!(
            w.len(),
            self.weight_len(),
            "{what}: w is not [c_out, c_in/groups, kh, kw]"
        );
        assert_eq!(b.len(), self.c_out, "{what}: b is not [c_out]");
        assert_eq!(
            y.len(),
            self.c_out * self.h_out() * self.w_out(),
            "{what}: y is not [c_out, h_out, w_out]"
        );
    }
}

/// x: [c_in, h_in, w_in], w: [c_out, c_in / groups, kh, kw], b: `[c_out]`
/// -> y: [c_out, h_out, w_out]; y = act(b + sum over the group's input
/// channels and the kernel window of w * x), zero padding.
///
/// The reference: one plain loop nest per output element, in the order
/// input channel, kernel row, kernel column.
pub fn conv2d(g: &Conv2d, x: &[f32], w: &[f32], b: &[f32], act: ConvActivation, y: &mut [f32]) {
    g.assert_buffers("conv2d", x, w, b, y);
    let (h_out, w_out) = (g.h_out(), g.w_out());
    let cin_g = g.c_in / g.groups;
    let cout_g = g.c_out / g.groups;
    y.par_chunks_mut(h_out * w_out)
        .enumerate()
        .for_each(|(o, plane)| {
            let group = o / cout_g;
            let wo = &w[o * cin_g * g.kh * g.kw..(o + 1) * cin_g * g.kh * g.kw];
            for oy in 0..h_out {
                for ox in 0..w_out {
                    let mut acc = 0.0f32;
                    for ci in 0..cin_g {
                        let xc = &x[(group * cin_g + ci) * g.h_in * g.w_in..];
                        for ky in 0..g.kh {
                            let iy = (oy * g.stride[0] + ky * g.dilation[0]) as isize
                                - g.pad[0] as isize;
                            if iy < 0 || iy >= g.h_in as isize {
                                continue;
                            }
                            for kx in 0..g.kw {
                                let ix = (ox * g.stride[1] + kx * g.dilation[1]) as isize
                                    - g.pad[1] as isize;
                                if ix < 0 || ix >= g.w_in as isize {
                                    continue;
                                }
                                acc += wo[(ci * g.kh + ky) * g.kw + kx]
                                    * xc[iy as usize * g.w_in + ix as usize];
                            }
                        }
                    }
                    plane[oy * w_out + ox] = act.apply(acc + b[o]);
                }
            }
        });
}

/// An ungrouped convolution (1x1 or k x k) as a matrix product over
/// NCHW planes, for `images` images at once (x: [images, c_in, h_in,
/// w_in] -> y: [images, c_out, h_out, w_out]): y[c_out, pixels] =
/// w[c_out, c_in * kh * kw] · columns, with the columns (the input channels
/// for a 1x1 layer, im2col's taps otherwise, from a zero-padded copy)
/// packed a few output pixels at a time by
/// [`super::matmul_columns_batched`], never stored whole. Then y =
/// act(sum + b) and `tail(channel, piece)` over each finished piece of an
/// output plane. The sums are fused multiply-adds in the order input
/// channel, kernel row, kernel column: equal to [`conv2d`] up to rounding,
/// and the same for an image whatever the batch.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_gemm<T>(
    g: &Conv2d,
    images: usize,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    act: ConvActivation,
    y: &mut [f32],
    tail: T,
) where
    T: Fn(usize, &mut [f32]) + Sync,
{
    assert_eq!(g.groups, 1, "conv2d_gemm: {g:?} is grouped");
    let (h_out, w_out) = (g.h_out(), g.w_out());
    let (n, plane_in) = (h_out * w_out, g.h_in * g.w_in);
    assert_eq!(x.len(), images * g.c_in * plane_in, "conv2d_gemm: x");
    assert_eq!(y.len(), images * g.c_out * n, "conv2d_gemm: y");
    assert_eq!(w.len(), g.weight_len(), "conv2d_gemm: w");
    assert_eq!(b.len(), g.c_out, "conv2d_gemm: b");
    let k = g.c_in * g.kh * g.kw;
    let epilogue = |_image: usize, o: usize, _c0: usize, piece: &mut [f32]| {
        act.apply_biased(b[o], piece);
        tail(o, piece);
    };
    if g.is_pointwise() {
        let pack = |image: usize, c0: usize, cols: usize, panel: &mut [f32]| {
            let x = &x[image * k * n..][..k * n];
            if cols == PANEL_WIDTH {
                for (ci, dst) in panel.chunks_exact_mut(PANEL_WIDTH).enumerate() {
                    // Each channel's row is a page or more from the last, out
                    // of the hardware prefetchers' reach: ask for this panel
                    // 8 channels ahead and for this channel 2 panels ahead.
                    prefetch(x, (ci + 8) * n + c0);
                    prefetch(x, ci * n + c0 + 2 * PANEL_WIDTH);
                    let src: &[f32; PANEL_WIDTH] = x[ci * n + c0..][..PANEL_WIDTH]
                        .try_into()
                        .expect("a whole panel row");
                    let dst: &mut [f32; PANEL_WIDTH] = dst.try_into().expect("a panel row");
                    *dst = *src;
                }
                return;
            }
            for (ci, dst) in panel.chunks_exact_mut(PANEL_WIDTH).enumerate() {
                dst[..cols].copy_from_slice(&x[ci * n + c0..ci * n + c0 + cols]);
            }
        };
        super::matmul_columns_batched(w, [g.c_out, k, n], images, y, pack, epilogue);
        return;
    }
    let (hp, wp) = (g.h_in + g.pad[0] + g.pad[2], g.w_in + g.pad[1] + g.pad[3]);
    let padded;
    let xp: &[f32] = if g.pad == [0; 4] {
        x
    } else {
        padded = pad_planes(g, x);
        &padded
    };
    let [sy, sx] = g.stride;
    let [dy, dx] = g.dilation;
    let pack = |image: usize, c0: usize, cols: usize, panel: &mut [f32]| {
        let xp = &xp[image * g.c_in * hp * wp..][..g.c_in * hp * wp];
        // Where each pixel's window starts in a padded plane.
        let mut base = [0usize; PANEL_WIDTH];
        for (j, bj) in base.iter_mut().enumerate().take(cols) {
            let (oy, ox) = ((c0 + j) / w_out, (c0 + j) % w_out);
            *bj = oy * sy * wp + ox * sx;
        }
        // Without a horizontal stride, the pixels of one output row read
        // contiguous taps: a whole panel in one row is one 16-float copy.
        let one_row = sx == 1 && cols == PANEL_WIDTH && c0 % w_out + PANEL_WIDTH <= w_out;
        let mut rows = panel.chunks_exact_mut(PANEL_WIDTH);
        for ci in 0..g.c_in {
            let plane = &xp[ci * hp * wp..(ci + 1) * hp * wp];
            if one_row {
                // The rows this channel gives the panel after next: a
                // plane's rows are far apart, beyond the prefetchers.
                for ky in 0..g.kh {
                    prefetch(plane, ky * dy * wp + base[0] + 2 * PANEL_WIDTH);
                }
            }
            for ky in 0..g.kh {
                for kx in 0..g.kw {
                    let tap = &plane[ky * dy * wp + kx * dx..];
                    let dst = rows.next().expect("k rows in a panel");
                    if one_row {
                        let src: &[f32; PANEL_WIDTH] = tap[base[0]..][..PANEL_WIDTH]
                            .try_into()
                            .expect("a whole panel row");
                        let dst: &mut [f32; PANEL_WIDTH] = dst.try_into().expect("a panel row");
                        *dst = *src;
                        continue;
                    }
                    for (d, &bj) in dst.iter_mut().zip(&base[..cols]) {
                        *d = tap[bj];
                    }
                }
            }
        }
    };
    super::matmul_columns_batched(w, [g.c_out, k, n], images, y, pack, epilogue);
}

/// Asks for the cache line holding xs[i], if there is one: a hint, no
/// effect on any value.
#[inline(always)]
fn prefetch(xs: &[f32], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(v) = xs.get(i) {
        // SAFETY: a prefetch of a valid address (SSE is part of x86_64).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (v as *const f32).cast(),
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (xs, i);
}

/// The input planes (of one image or several) with the convolution's zero
/// padding around each.
fn pad_planes(g: &Conv2d, x: &[f32]) -> Vec<f32> {
    let (hp, wp) = (g.h_in + g.pad[0] + g.pad[2], g.w_in + g.pad[1] + g.pad[3]);
    let planes = x.len() / (g.h_in * g.w_in);
    let mut xp = vec![0.0f32; planes * hp * wp];
    xp.par_chunks_mut(hp * wp)
        .zip(x.par_chunks(g.h_in * g.w_in))
        .for_each(|(dst, src)| {
            for (r, row) in src.chunks_exact(g.w_in).enumerate() {
                let at = (r + g.pad[0]) * wp + g.pad[1];
                dst[at..at + g.w_in].copy_from_slice(row);
            }
        });
    xp
}

/// Output pixels per register tile in [`conv2d_rows`].
const ROW_TILE: usize = 16;

/// Any convolution, by tiles of 16 output pixels along a row whose sums
/// stay in registers over every input channel of the group and kernel tap,
/// reading a zero-padded copy of the input so no tap needs a bounds test.
/// Same sums as [`conv2d`] in the same order (input channel, kernel row,
/// kernel column; padded taps add zero), bias added last. Used for
/// grouped convolutions (depthwise ones go to [`conv2d_depthwise`]).
pub fn conv2d_rows(
    g: &Conv2d,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    act: ConvActivation,
    y: &mut [f32],
) {
    g.assert_buffers("conv2d_rows", x, w, b, y);
    if g.is_depthwise() {
        conv2d_depthwise(g, 1, x, w, b, act, y, |_, _| {});
        return;
    }
    let xp = pad_planes(g, x);
    let avx2 = has_avx2();
    let avx512 = has_avx512();
    y.par_chunks_mut(g.h_out() * g.w_out())
        .enumerate()
        .for_each(|(o, plane)| {
            if avx512 {
                // SAFETY: the CPU has AVX-512F (checked above).
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    rows_plane_avx512(g, &xp, w, b[o], act, o, plane)
                }
            } else if avx2 {
                // SAFETY: the CPU has AVX2 (checked above).
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    rows_plane_avx2(g, &xp, w, b[o], act, o, plane)
                }
            } else {
                rows_plane(g, &xp, w, b[o], act, o, plane)
            }
        });
}

/// Whether the AVX2 builds of the hot loops can run here. The sums are the
/// same either way: wider vectors only, no fused multiply-add.
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the AVX-512 build of [`conv2d_rows`]' loop can run here: one
/// 16-wide register per tile, same sums (no fused multiply-add).
fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows_plane_avx512(
    g: &Conv2d,
    xp: &[f32],
    w: &[f32],
    bias: f32,
    act: ConvActivation,
    o: usize,
    plane: &mut [f32],
) {
    rows_plane(g, xp, w, bias, act, o, plane)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_plane_avx2(
    g: &Conv2d,
    xp: &[f32],
    w: &[f32],
    bias: f32,
    act: ConvActivation,
    o: usize,
    plane: &mut [f32],
) {
    rows_plane(g, xp, w, bias, act, o, plane)
}

/// Output channel `o` of [`conv2d_rows`] from the padded input `xp`.
#[inline(always)]
fn rows_plane(
    g: &Conv2d,
    xp: &[f32],
    w: &[f32],
    bias: f32,
    act: ConvActivation,
    o: usize,
    plane: &mut [f32],
) {
    let (h_out, w_out) = (g.h_out(), g.w_out());
    let (hp, wp) = (g.h_in + g.pad[0] + g.pad[2], g.w_in + g.pad[1] + g.pad[3]);
    let [sy, sx] = g.stride;
    let [dy, dx] = g.dilation;
    let cin_g = g.c_in / g.groups;
    let group = o / (g.c_out / g.groups);
    let taps = g.kh * g.kw;
    for oy in 0..h_out {
        for ox0 in (0..w_out).step_by(ROW_TILE) {
            let len = ROW_TILE.min(w_out - ox0);
            let mut acc = [0.0f32; ROW_TILE];
            for ci in 0..cin_g {
                let xc = &xp[(group * cin_g + ci) * hp * wp..][..hp * wp];
                let wc = &w[(o * cin_g + ci) * taps..][..taps];
                for ky in 0..g.kh {
                    let row = &xc[(oy * sy + ky * dy) * wp..][..wp];
                    for kx in 0..g.kw {
                        let wv = wc[ky * g.kw + kx];
                        let base = ox0 * sx + kx * dx;
                        match (len, sx) {
                            (ROW_TILE, 1) => tap::<1>(&mut acc, row, base, wv),
                            (ROW_TILE, 2) => tap::<2>(&mut acc, row, base, wv),
                            _ => {
                                for (k, a) in acc[..len].iter_mut().enumerate() {
                                    *a += wv * row[base + k * sx];
                                }
                            }
                        }
                    }
                }
            }
            for (yv, &a) in plane[oy * w_out + ox0..][..len].iter_mut().zip(&acc) {
                *yv = act.apply(a + bias);
            }
        }
    }
}

/// Output pixels a depthwise tile keeps in registers over every tap.
const DW_TILE: usize = 32;

/// A depthwise convolution ([`Conv2d::is_depthwise`]) over `images`
/// images at once: x: [images, c, h_in, w_in] -> y: [images, c, h_out,
/// w_out], one task per output plane. Each task copies its input plane,
/// zero-padded, into a buffer of its own, split by column phase (column p
/// goes to phase p % stride at p / stride), so that every tap of a tile of
/// outputs reads contiguous values, whatever the stride. Same sums as
/// [`conv2d`] in the same order (kernel row, kernel column; padded taps
/// add zero), bias added last. Then `tail(channel, plane)` runs over each
/// finished output plane while it is still in cache.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_depthwise<T>(
    g: &Conv2d,
    images: usize,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    act: ConvActivation,
    y: &mut [f32],
    tail: T,
) where
    T: Fn(usize, &mut [f32]) + Sync,
{
    assert!(g.is_depthwise(), "conv2d_depthwise: {g:?} is not depthwise");
    let (plane_in, plane_out) = (g.h_in * g.w_in, g.h_out() * g.w_out());
    assert_eq!(x.len(), images * g.c_in * plane_in, "conv2d_depthwise: x");
    assert_eq!(y.len(), images * g.c_out * plane_out, "conv2d_depthwise: y");
    assert_eq!(w.len(), g.weight_len(), "conv2d_depthwise: w");
    assert_eq!(b.len(), g.c_out, "conv2d_depthwise: b");
    #[cfg(target_arch = "x86_64")]
    let build = if has_avx512() && DepthwiseBuild::blocks_fit(g) {
        DepthwiseBuild::BlocksAvx512
    } else if has_avx512() {
        DepthwiseBuild::Tiles(depthwise_tile_avx512)
    } else if has_avx2() {
        DepthwiseBuild::Tiles(depthwise_tile_avx2)
    } else {
        DepthwiseBuild::Tiles(depthwise_tile)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let build = DepthwiseBuild::Tiles(depthwise_tile);
    depthwise_with(build, g, x, w, b, act, y, tail)
}

/// How [`conv2d_depthwise`] computes a plane: tiles of [`depthwise_plane`]
/// with one of their builds, or the blocks of [`depthwise_blocks_avx512`].
#[derive(Clone, Copy)]
enum DepthwiseBuild {
    Tiles(DepthwiseTile),
    #[cfg(target_arch = "x86_64")]
    BlocksAvx512,
}

#[cfg(target_arch = "x86_64")]
impl DepthwiseBuild {
    /// The geometries the blocks take: square 3x3 or 5x5 kernels, strides
    /// of 1 or 2, no dilation.
    fn blocks_fit(g: &Conv2d) -> bool {
        g.kh == g.kw
            && matches!(g.kh, 3 | 5)
            && g.stride.iter().all(|s| matches!(s, 1 | 2))
            && g.dilation == [1, 1]
    }
}

/// [`conv2d_depthwise`] with the given build.
#[allow(clippy::too_many_arguments)]
fn depthwise_with<T>(
    build: DepthwiseBuild,
    g: &Conv2d,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    act: ConvActivation,
    y: &mut [f32],
    tail: T,
) where
    T: Fn(usize, &mut [f32]) + Sync,
{
    let (plane_in, plane_out) = (g.h_in * g.w_in, g.h_out() * g.w_out());
    y.par_chunks_mut(plane_out)
        .zip(x.par_chunks(plane_in))
        .enumerate()
        .for_each_init(
            || (Vec::new(), Vec::new()),
            |(phases, offsets), (i, (out, src))| {
                let c = i % g.c_out;
                let taps = &w[c * g.kh * g.kw..(c + 1) * g.kh * g.kw];
                match build {
                    DepthwiseBuild::Tiles(tile) => {
                        depthwise_plane(g, src, taps, b[c], act, tile, phases, offsets, out)
                    }
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: chosen only where the CPU has AVX-512F and
                    // the geometry fits (conv2d_depthwise, the tests).
                    DepthwiseBuild::BlocksAvx512 => unsafe {
                        depthwise_blocks_avx512(g, src, taps, b[c], act, phases, out)
                    },
                }
                tail(c, out);
            },
        );
}

/// Where one tile of [`conv2d_depthwise`] reads and writes: `rows` output
/// rows (at most [`DW_ROWS`]) of `len` pixels (at most [`DW_TILE`]); tap t
/// of row r reads xs[offsets[t] + r * row_step..][..DW_TILE]; row r goes to
/// out[r * out_stride..][..len].
struct DepthwiseTileAt<'a> {
    xs: &'a [f32],
    offsets: &'a [usize],
    row_step: usize,
    /// The largest of `offsets` (the x86 builds' bounds check).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    reach: usize,
    rows: usize,
    len: usize,
    out_stride: usize,
}

/// Output rows a depthwise tile computes at once (independent sums, so
/// the additions of one tap do not wait on each other).
const DW_ROWS: usize = 4;

/// One tile: out = act(bias + the sum over the taps, in order, of
/// taps[t] * x). Unsafe only for the target features of its builds.
type DepthwiseTile = unsafe fn(&DepthwiseTileAt, &[f32], f32, ConvActivation, &mut [f32]);

/// Writes the input plane `src` into `phases` split by column phase: the
/// padded plane's column p = q * sx + phase goes to column q of row
/// (r + top padding) of phase plane `phase` (`phase_len` apart, rows
/// `stride_row` apart); cells without an input stay as they were (zero).
/// `strided(from, dst)` sets dst[j] = from[j * sx].
fn split_phases(
    g: &Conv2d,
    src: &[f32],
    stride_row: usize,
    phase_len: usize,
    phases: &mut [f32],
    strided: impl Fn(&[f32], &mut [f32]),
) {
    let sx = g.stride[1];
    for (r, row) in src.chunks_exact(g.w_in).enumerate() {
        let at = (r + g.pad[0]) * stride_row;
        if sx == 1 {
            phases[at + g.pad[1]..][..g.w_in].copy_from_slice(row);
            continue;
        }
        for phase in 0..sx {
            let first = g.pad[1].saturating_sub(phase).div_ceil(sx);
            let col = first * sx + phase - g.pad[1];
            let count = (g.w_in - col.min(g.w_in)).div_ceil(sx);
            strided(
                &row[col.min(g.w_in)..],
                &mut phases[phase * phase_len + at + first..][..count],
            );
        }
    }
}

/// One output plane of [`conv2d_depthwise`] from its input plane `src`;
/// `phases` and `offsets` are the task's scratch buffers.
#[allow(clippy::too_many_arguments)]
fn depthwise_plane(
    g: &Conv2d,
    src: &[f32],
    taps: &[f32],
    bias: f32,
    act: ConvActivation,
    tile: DepthwiseTile,
    phases: &mut Vec<f32>,
    offsets: &mut Vec<usize>,
    out: &mut [f32],
) {
    let (h_out, w_out) = (g.h_out(), g.w_out());
    let hp = g.h_in + g.pad[0] + g.pad[2];
    let wp = g.w_in + g.pad[1] + g.pad[3];
    let [sy, sx] = g.stride;
    let [dy, dx] = g.dilation;
    // A phase row holds every column of its phase, then room for a whole
    // last tile (read, never written out).
    let stride_row = wp.div_ceil(sx) + DW_TILE;
    let phase_len = hp * stride_row;
    phases.clear();
    phases.resize(sx * phase_len, 0.0);
    split_phases(g, src, stride_row, phase_len, phases, |from, dst| {
        for (d, v) in dst.iter_mut().zip(from.iter().step_by(sx)) {
            *d = *v;
        }
    });
    offsets.clear();
    for ky in 0..g.kh {
        for kx in 0..g.kw {
            let col = kx * dx;
            offsets.push((col % sx) * phase_len + ky * dy * stride_row + col / sx);
        }
    }
    let reach = offsets.iter().max().copied().unwrap_or(0);
    for oy in (0..h_out).step_by(DW_ROWS) {
        let rows = DW_ROWS.min(h_out - oy);
        for ox in (0..w_out).step_by(DW_TILE) {
            let at = DepthwiseTileAt {
                xs: &phases[oy * sy * stride_row + ox..],
                offsets,
                row_step: sy * stride_row,
                reach,
                rows,
                len: DW_TILE.min(w_out - ox),
                out_stride: w_out,
            };
            // SAFETY: `tile` is the build the CPU supports (chosen by
            // conv2d_depthwise).
            unsafe { tile(&at, taps, bias, act, &mut out[oy * w_out + ox..]) }
        }
    }
}

/// The portable [`DepthwiseTile`].
unsafe fn depthwise_tile(
    at: &DepthwiseTileAt,
    taps: &[f32],
    bias: f32,
    act: ConvActivation,
    out: &mut [f32],
) {
    for r in 0..at.rows {
        let mut acc = [0.0f32; DW_TILE];
        for (&o, &wv) in at.offsets.iter().zip(taps) {
            let xs = &at.xs[o + r * at.row_step..][..DW_TILE];
            for (a, &v) in acc.iter_mut().zip(xs) {
                *a += wv * v;
            }
        }
        act.apply_biased(bias, &mut acc);
        out[r * at.out_stride..][..at.len].copy_from_slice(&acc[..at.len]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn depthwise_tile_avx512(
    at: &DepthwiseTileAt,
    taps: &[f32],
    bias: f32,
    act: ConvActivation,
    out: &mut [f32],
) {
    match at.rows {
        4 => depthwise_rows_avx512::<4>(at, taps, bias, act, out),
        3 => depthwise_rows_avx512::<3>(at, taps, bias, act, out),
        2 => depthwise_rows_avx512::<2>(at, taps, bias, act, out),
        _ => depthwise_rows_avx512::<1>(at, taps, bias, act, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn depthwise_rows_avx512<const R: usize>(
    at: &DepthwiseTileAt,
    taps: &[f32],
    bias: f32,
    act: ConvActivation,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let last = at.reach + (R - 1) * at.row_step;
    let xs = &at.xs[..last + DW_TILE];
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for (&o, &wv) in at.offsets.iter().zip(taps) {
        let w = _mm512_set1_ps(wv);
        for (r, a) in acc.iter_mut().enumerate() {
            // In bounds: o + r * row_step + DW_TILE <= xs.len().
            let v = xs.as_ptr().add(o + r * at.row_step);
            // Multiply, then add: the reference's rounding, no fused step.
            a[0] = _mm512_add_ps(a[0], _mm512_mul_ps(w, _mm512_loadu_ps(v)));
            a[1] = _mm512_add_ps(a[1], _mm512_mul_ps(w, _mm512_loadu_ps(v.add(16))));
        }
    }
    for (r, a) in acc.iter().enumerate() {
        let mut row = [0.0f32; DW_TILE];
        _mm512_storeu_ps(row.as_mut_ptr(), a[0]);
        _mm512_storeu_ps(row.as_mut_ptr().add(16), a[1]);
        act.apply_biased(bias, &mut row);
        out[r * at.out_stride..][..at.len].copy_from_slice(&row[..at.len]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn depthwise_tile_avx2(
    at: &DepthwiseTileAt,
    taps: &[f32],
    bias: f32,
    act: ConvActivation,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    // Two rows at a time: 8 sums of 8 lanes in 8 of the 16 registers.
    for r0 in (0..at.rows).step_by(2) {
        let rows = 2.min(at.rows - r0);
        let last = at.reach + (r0 + rows - 1) * at.row_step;
        let xs = &at.xs[..last + DW_TILE];
        let mut acc = [[_mm256_setzero_ps(); DW_TILE / 8]; 2];
        for (&o, &wv) in at.offsets.iter().zip(taps) {
            let w = _mm256_set1_ps(wv);
            for (r, a) in acc.iter_mut().enumerate().take(rows) {
                // In bounds: o + (r0 + r) * row_step + DW_TILE <= xs.len().
                let v = xs.as_ptr().add(o + (r0 + r) * at.row_step);
                for (j, aj) in a.iter_mut().enumerate() {
                    *aj = _mm256_add_ps(*aj, _mm256_mul_ps(w, _mm256_loadu_ps(v.add(8 * j))));
                }
            }
        }
        for (r, a) in acc.iter().enumerate().take(rows) {
            let mut row = [0.0f32; DW_TILE];
            for (j, aj) in a.iter().enumerate() {
                _mm256_storeu_ps(row.as_mut_ptr().add(8 * j), *aj);
            }
            act.apply_biased(bias, &mut row);
            out[(r0 + r) * at.out_stride..][..at.len].copy_from_slice(&row[..at.len]);
        }
    }
}

/// Output rows a block of [`depthwise_blocks_avx512`] computes at once.
#[cfg(target_arch = "x86_64")]
const DB_ROWS: usize = 4;
/// 16-pixel vectors a block spans at most: with [`DB_ROWS`], 16 sums in
/// registers.
#[cfg(target_arch = "x86_64")]
const DB_VECTORS: usize = 4;

/// One output plane of a depthwise convolution whose geometry
/// [`DepthwiseBuild::blocks_fit`], from its input plane `src`, in blocks
/// of [`DB_ROWS`] rows x up to [`DB_VECTORS`] vectors of 16 pixels (the
/// plane's width split evenly, a masked store for its last pixels). The
/// zero-padded input is split by column phase into `phases` as in
/// [`depthwise_plane`]. Each output gets the taps in the reference's order
/// (kernel row, kernel column), each a multiply then an add, bias added
/// last: the same bits as [`conv2d`].
///
/// # Safety
/// Needs AVX-512F; `g` must fit the blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn depthwise_blocks_avx512(
    g: &Conv2d,
    src: &[f32],
    taps: &[f32],
    bias: f32,
    act: ConvActivation,
    phases: &mut Vec<f32>,
    out: &mut [f32],
) {
    match g.kh {
        3 => depthwise_blocks_k::<3>(g, src, taps, bias, act, phases, out),
        _ => depthwise_blocks_k::<5>(g, src, taps, bias, act, phases, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn depthwise_blocks_k<const K: usize>(
    g: &Conv2d,
    src: &[f32],
    taps: &[f32],
    bias: f32,
    act: ConvActivation,
    phases: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (h_out, w_out) = (g.h_out(), g.w_out());
    let [sy, sx] = g.stride;
    let wp = g.w_in + g.pad[1] + g.pad[3];
    // Every block reads DB_ROWS rows' worth of input, past the last output
    // row too (zeros); a phase row holds its columns, then a vector's worth
    // of slack for a block's last, masked, vector.
    let rows = ((h_out.next_multiple_of(DB_ROWS) - 1) * sy + K).max(g.h_in + g.pad[0]);
    let stride_row = wp.div_ceil(sx) + 16;
    let phase_len = rows * stride_row;
    if phases.len() != sx * phase_len {
        // The same geometry for every plane of a call: the padding written
        // now stays zero, and each plane writes the same input cells.
        phases.clear();
        phases.resize(sx * phase_len, 0.0);
    }
    // Strides are 1 or 2 here (`blocks_fit`).
    split_phases(g, src, stride_row, phase_len, phases, |from, dst| {
        // SAFETY: this build runs only where the CPU has AVX-512.
        unsafe { every_other_avx512(from, dst) }
    });
    let cols: [usize; K] = std::array::from_fn(|kx| (kx % sx) * phase_len + kx / sx);
    let taps: [[f32; K]; K] = std::array::from_fn(|ky| std::array::from_fn(|kx| taps[ky * K + kx]));
    let vectors = w_out.div_ceil(16);
    let blocks = vectors.div_ceil(DB_VECTORS);
    for oy in (0..h_out).step_by(DB_ROWS) {
        let mut ox = 0;
        for k in 0..blocks {
            // The plane's vectors split evenly over its blocks.
            let v = (vectors * (k + 1)) / blocks - (vectors * k) / blocks;
            let len = (16 * v).min(w_out - ox);
            let at = DepthwiseBlock {
                base: oy * sy * stride_row + ox,
                stride_row,
                rows: DB_ROWS.min(h_out - oy),
                len,
                out_stride: w_out,
            };
            let dst = &mut out[oy * w_out + ox..];
            macro_rules! block {
                ($sy:literal) => {
                    match v {
                        1 => {
                            depthwise_block::<K, $sy, 1>(phases, &cols, &taps, &at, bias, act, dst)
                        }
                        2 => {
                            depthwise_block::<K, $sy, 2>(phases, &cols, &taps, &at, bias, act, dst)
                        }
                        3 => {
                            depthwise_block::<K, $sy, 3>(phases, &cols, &taps, &at, bias, act, dst)
                        }
                        _ => {
                            depthwise_block::<K, $sy, 4>(phases, &cols, &taps, &at, bias, act, dst)
                        }
                    }
                };
            }
            if sy == 1 {
                block!(1)
            } else {
                block!(2)
            }
            ox += len;
        }
    }
}

/// dst[j] = src[2 j] (src holds at least 2 dst.len() - 1 values).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn every_other_avx512(src: &[f32], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let mut j = 0;
    while j + 16 <= dst.len() && 2 * j + 32 <= src.len() {
        let a = _mm512_loadu_ps(src.as_ptr().add(2 * j));
        let b = _mm512_loadu_ps(src.as_ptr().add(2 * j + 16));
        _mm512_storeu_ps(dst.as_mut_ptr().add(j), _mm512_permutex2var_ps(a, even, b));
        j += 16;
    }
    for (j, d) in dst.iter_mut().enumerate().skip(j) {
        *d = src[2 * j];
    }
}

/// Where a block of [`depthwise_blocks_avx512`] reads (its input row i at
/// phases[base + i * stride_row..], tap column kx `cols[kx]` further) and
/// writes (`rows` rows of `len` pixels, `out_stride` apart).
#[cfg(target_arch = "x86_64")]
struct DepthwiseBlock {
    base: usize,
    stride_row: usize,
    rows: usize,
    len: usize,
    out_stride: usize,
}

/// One block: [`DB_ROWS`] rows of V vectors, stride SY between rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn depthwise_block<const K: usize, const SY: usize, const V: usize>(
    phases: &[f32],
    cols: &[usize; K],
    taps: &[[f32; K]; K],
    at: &DepthwiseBlock,
    bias: f32,
    act: ConvActivation,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let reach = at.base
        + ((DB_ROWS - 1) * SY + K - 1) * at.stride_row
        + cols.iter().max().copied().unwrap_or(0)
        + 16 * V;
    assert!(reach <= phases.len(), "depthwise block outside its buffer");
    let p = phases.as_ptr().add(at.base);
    let mut acc = [[_mm512_setzero_ps(); V]; DB_ROWS];
    for (ky, row_taps) in taps.iter().enumerate() {
        for (&wv, &col) in row_taps.iter().zip(cols) {
            let w = _mm512_set1_ps(wv);
            for (r, a) in acc.iter_mut().enumerate() {
                // In bounds: below `reach`.
                let x = p.add((r * SY + ky) * at.stride_row + col);
                for (j, aj) in a.iter_mut().enumerate() {
                    // Multiply, then add: the reference's rounding.
                    *aj = _mm512_add_ps(*aj, _mm512_mul_ps(w, _mm512_loadu_ps(x.add(16 * j))));
                }
            }
        }
    }
    let b = _mm512_set1_ps(bias);
    for (r, a) in acc.iter().enumerate().take(at.rows) {
        let dst = &mut out[r * at.out_stride..][..at.len];
        for (j, &aj) in a.iter().enumerate() {
            let n = (at.len - 16 * j).min(16);
            let mask: __mmask16 = if n == 16 { u16::MAX } else { (1u16 << n) - 1 };
            let v = match act {
                ConvActivation::None => _mm512_add_ps(aj, b),
                ConvActivation::Relu => _mm512_max_ps(_mm512_add_ps(aj, b), _mm512_setzero_ps()),
                _ => {
                    let mut lanes = [0.0f32; 16];
                    _mm512_storeu_ps(lanes.as_mut_ptr(), aj);
                    act.apply_biased(bias, &mut lanes);
                    _mm512_loadu_ps(lanes.as_ptr())
                }
            };
            // In bounds: n <= dst.len() - 16 j lanes written.
            _mm512_mask_storeu_ps(dst.as_mut_ptr().add(16 * j), mask, v);
        }
    }
}

/// acc[k] += wv * row[base + k * S] for a full tile, S known at compile time.
#[inline(always)]
fn tap<const S: usize>(acc: &mut [f32; ROW_TILE], row: &[f32], base: usize, wv: f32) {
    let xs = &row[base..base + (ROW_TILE - 1) * S + 1];
    for (k, a) in acc.iter_mut().enumerate() {
        *a += wv * xs[k * S];
    }
}

/// x: [c, n] -> y: `[c]`; the mean of each channel's `n` values, each
/// summed in order (as `iter().sum()` does). Eight channels are summed
/// side by side, so the additions of one do not wait on each other.
pub fn global_avg_pool(x: &[f32], c: usize, n: usize, y: &mut [f32]) {
    assert_eq!(x.len(), c * n, "global_avg_pool: x is not [c, n]");
    assert_eq!(y.len(), c, "global_avg_pool: y is not [c]");
    const SIDE: usize = 8;
    for (ys, xs) in y.chunks_mut(SIDE).zip(x.chunks(SIDE * n.max(1))) {
        if ys.len() < SIDE {
            for (yc, xc) in ys.iter_mut().zip(xs.chunks_exact(n.max(1))) {
                *yc = xc.iter().sum::<f32>() / n as f32;
            }
            continue;
        }
        let planes: [&[f32]; SIDE] = std::array::from_fn(|j| &xs[j * n..(j + 1) * n]);
        let mut acc = [0.0f32; SIDE];
        for i in 0..n {
            for (a, p) in acc.iter_mut().zip(&planes) {
                *a += p[i];
            }
        }
        for (yc, a) in ys.iter_mut().zip(acc) {
            *yc = a / n as f32;
        }
    }
}

/// x: [c, n], s: `[c]` -> y: [c, n]; y = x * s per channel (squeeze-and-
/// excitation).
pub fn scale_channels(x: &[f32], s: &[f32], n: usize, y: &mut [f32]) {
    assert_eq!(x.len(), s.len() * n, "scale_channels: x is not [c, n]");
    assert_eq!(y.len(), x.len(), "scale_channels: y is not [c, n]");
    if n == 0 {
        return;
    }
    y.par_chunks_mut(n)
        .zip(x.par_chunks(n))
        .zip(s.par_iter())
        .for_each(|((yc, xc), &sc)| {
            for (yv, &xv) in yc.iter_mut().zip(xc) {
                *yv = xv * sc;
            }
        });
}

/// x: [c, h_in, w_in] -> y: [c, h_out, w_out], nearest neighbour with
/// ONNX Resize's `asymmetric` coordinates and `floor` rounding: output pixel
/// (oy, ox) reads input (floor(oy / scale_h), floor(ox / scale_w)), clamped
/// to the image.
pub fn resize_nearest(
    x: &[f32],
    c: usize,
    [h_in, w_in]: [usize; 2],
    [h_out, w_out]: [usize; 2],
    [scale_h, scale_w]: [f32; 2],
    y: &mut [f32],
) {
    assert_eq!(
        x.len(),
        c * h_in * w_in,
        "resize_nearest: x is not [c, h_in, w_in]"
    );
    assert_eq!(
        y.len(),
        c * h_out * w_out,
        "resize_nearest: y is not [c, h_out, w_out]"
    );
    let src = |o: usize, scale: f32, n: usize| ((o as f32 / scale).floor() as usize).min(n - 1);
    let cols: Vec<usize> = (0..w_out).map(|ox| src(ox, scale_w, w_in)).collect();
    for (yc, xc) in y
        .chunks_exact_mut(h_out * w_out)
        .zip(x.chunks_exact(h_in * w_in))
    {
        for oy in 0..h_out {
            let xr = &xc[src(oy, scale_h, h_in) * w_in..];
            for (yv, &ix) in yc[oy * w_out..(oy + 1) * w_out].iter_mut().zip(&cols) {
                *yv = xr[ix];
            }
        }
    }
}

/// Concatenation along channels of one image: the parts one after another.
pub fn concat(parts: &[&[f32]], y: &mut [f32]) {
    assert_eq!(
        parts.iter().map(|p| p.len()).sum::<usize>(),
        y.len(),
        "concat: output length"
    );
    let mut at = 0;
    for p in parts {
        y[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::rng::Rng;

    #[test]
    fn conv2d_known_values() {
        // 1 channel 3x3 input, 2x2 kernel of ones, stride 1, pad 0:
        // every output is the sum of a 2x2 window, plus the bias.
        let g = Conv2d {
            c_in: 1,
            h_in: 3,
            w_in: 3,
            c_out: 1,
            kh: 2,
            kw: 2,
            stride: [1, 1],
            pad: [0; 4],
            dilation: [1, 1],
            groups: 1,
        };
        let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        let mut y = vec![0.0; 4];
        conv2d(&g, &x, &[1.0; 4], &[0.5], ConvActivation::None, &mut y);
        assert_eq!(y, [12.5, 16.5, 24.5, 28.5]);
        // Padding 1 on every side, stride 2: corners see one 2x2 quarter.
        let g = Conv2d {
            pad: [1; 4],
            stride: [2, 2],
            ..g
        };
        assert_eq!((g.h_out(), g.w_out()), (2, 2));
        conv2d(&g, &x, &[1.0; 4], &[0.0], ConvActivation::None, &mut y);
        assert_eq!(y, [1.0, 5.0, 11.0, 28.0]);
    }

    #[test]
    fn activations() {
        assert_eq!(ConvActivation::HardSwish.apply(-4.0), 0.0);
        assert_eq!(ConvActivation::HardSwish.apply(4.0), 4.0);
        assert_eq!(ConvActivation::HardSwish.apply(1.0), 4.0 / 6.0);
        let hs = ConvActivation::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        };
        assert_eq!(hs.apply(10.0), 1.0);
        assert_eq!(hs.apply(0.0), 0.5);
        assert_eq!(ConvActivation::Relu.apply(-1.0), 0.0);
        assert!((ConvActivation::Sigmoid.apply(0.0) - 0.5).abs() < 1e-7);
    }

    #[test]
    fn rows_match_the_reference() {
        let mut rng = Rng::new(4);
        let mut shapes = Vec::new();
        // Depthwise: (channels, h, w, kernel, stride, pad, dilation).
        for (c, h, w, k, s, pad, d) in [
            (2, 1, 1, 3, 1, 1, 1),
            (3, 7, 9, 3, 1, 1, 1),
            (5, 8, 11, 3, 2, 1, 1),
            (4, 13, 10, 5, 1, 2, 1),
            (6, 13, 10, 5, 2, 2, 1),
            (2, 9, 9, 3, 1, 2, 2),
            (3, 6, 7, 3, 2, 0, 1),
            (2, 3, 2, 5, 1, 4, 2),
        ] {
            shapes.push(Conv2d {
                c_in: c,
                h_in: h,
                w_in: w,
                c_out: c,
                kh: k,
                kw: k,
                stride: [s, s],
                pad: [pad; 4],
                dilation: [d, d],
                groups: c,
            });
        }
        // Full and grouped, uneven pads and strides.
        for (c_in, c_out, groups, stride, pad) in [
            (3, 4, 1, [2, 2], [1; 4]),
            (4, 6, 2, [1, 2], [1, 0, 2, 1]),
            (3, 5, 1, [1, 1], [0; 4]),
        ] {
            shapes.push(Conv2d {
                c_in,
                h_in: 11,
                w_in: 13,
                c_out,
                kh: 3,
                kw: 3,
                stride,
                pad,
                dilation: [1, 1],
                groups,
            });
        }
        for g in shapes {
            g.check().unwrap();
            let x = rng.vec(g.c_in * g.h_in * g.w_in, -1.0, 1.0);
            let wt = rng.vec(g.weight_len(), -1.0, 1.0);
            let b = rng.vec(g.c_out, -1.0, 1.0);
            let n = g.c_out * g.h_out() * g.w_out();
            let (mut want, mut got) = (vec![0.0; n], vec![f32::NAN; n]);
            conv2d(&g, &x, &wt, &b, ConvActivation::Relu, &mut want);
            conv2d_rows(&g, &x, &wt, &b, ConvActivation::Relu, &mut got);
            // Same taps in the same order, bias added last: exact.
            assert_eq!(got, want, "{g:?}");
        }
    }

    #[test]
    fn depthwise_batches_and_builds_match_the_reference() {
        let mut rng = Rng::new(7);
        #[allow(unused_mut)]
        let mut builds = vec![DepthwiseBuild::Tiles(depthwise_tile)];
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx2() {
                builds.push(DepthwiseBuild::Tiles(depthwise_tile_avx2));
            }
            if has_avx512() {
                builds.push(DepthwiseBuild::Tiles(depthwise_tile_avx512));
                builds.push(DepthwiseBuild::BlocksAvx512);
            }
        }
        // (channels, h, w, kernel, stride, pad, dilation): rows past a
        // tile of 32 and of 4 rows, strides 1 to 3, and for the blocks
        // widths of 1 to 4 vectors a block (2 and 8 blocks for 70 and 500
        // pixels), vertical and horizontal strides alone, odd paddings.
        for (c, h, w, k, s, pad, d) in [
            (3, 12, 80, 5, [1, 1], 2, 1),
            (2, 13, 70, 3, [2, 2], 1, 1),
            (2, 9, 41, 5, [3, 3], 2, 1),
            (3, 7, 35, 3, [1, 1], 2, 2),
            (2, 1, 1, 3, [1, 1], 1, 1),
            (2, 6, 500, 5, [2, 1], 2, 1),
            (3, 11, 63, 3, [1, 2], 1, 1),
            (2, 5, 16, 5, [1, 2], 2, 1),
            (2, 10, 33, 3, [2, 2], 0, 1),
            (2, 3, 130, 5, [1, 1], 1, 1),
        ] {
            let g = Conv2d {
                c_in: c,
                h_in: h,
                w_in: w,
                c_out: c,
                kh: k,
                kw: k,
                stride: s,
                pad: [pad; 4],
                dilation: [d, d],
                groups: c,
            };
            g.check().unwrap();
            let images = 3;
            let x = rng.vec(images * c * h * w, -1.0, 1.0);
            let wt = rng.vec(g.weight_len(), -1.0, 1.0);
            let b = rng.vec(c, -1.0, 1.0);
            let per_out = c * g.h_out() * g.w_out();
            // The acts the blocks apply in registers, and one they do not.
            for act in [
                ConvActivation::HardSwish,
                ConvActivation::None,
                ConvActivation::Relu,
            ] {
                let mut want = vec![0.0; images * per_out];
                for (img, out) in x
                    .chunks_exact(c * h * w)
                    .zip(want.chunks_exact_mut(per_out))
                {
                    conv2d(&g, img, &wt, &b, act, out);
                }
                for (i, &build) in builds.iter().enumerate() {
                    #[cfg(target_arch = "x86_64")]
                    if matches!(build, DepthwiseBuild::BlocksAvx512)
                        && !DepthwiseBuild::blocks_fit(&g)
                    {
                        continue;
                    }
                    let mut got = vec![f32::NAN; images * per_out];
                    depthwise_with(build, &g, &x, &wt, &b, act, &mut got, |_, _| {});
                    // Same taps in the same order, bias added last: exact.
                    assert_eq!(got, want, "build {i}, {act:?}, {g:?}");
                }
            }
            // The tail sees each finished plane with its channel.
            let mut marked = vec![f32::NAN; images * per_out];
            let act = ConvActivation::None;
            conv2d_depthwise(&g, images, &x, &wt, &b, act, &mut marked, |o, plane| {
                plane.iter_mut().for_each(|v| *v = *v * 0.5 + o as f32)
            });
            let mut want = vec![0.0; images * per_out];
            for (img, out) in x
                .chunks_exact(c * h * w)
                .zip(want.chunks_exact_mut(per_out))
            {
                conv2d(&g, img, &wt, &b, act, out);
            }
            let plane = g.h_out() * g.w_out();
            for (k, (m, v)) in marked.iter().zip(&want).enumerate() {
                assert_eq!(*m, v * 0.5 + ((k / plane) % c) as f32, "{g:?} element {k}");
            }
        }
    }

    #[test]
    fn gemm_matches_the_reference() {
        let mut rng = Rng::new(5);
        // (c_in, c_out, h, w, kernel, stride, pad, dilation): 1x1 layers,
        // a stem (3 channels, stride 2), odd sizes around the 16-pixel
        // panels and the 6-row register blocks, uneven pads, rows wider
        // than a panel (panels in one row and across two).
        for (c_in, c_out, h, w, k, stride, pad, d) in [
            (6, 7, 9, 40, 3, [1, 1], [1; 4], 1),
            (3, 5, 6, 37, 3, [2, 1], [1, 2, 0, 1], 1),
            (1, 1, 1, 1, 1, [1, 1], [0; 4], 1),
            (17, 9, 13, 21, 1, [1, 1], [0; 4], 1),
            (33, 20, 16, 17, 1, [1, 1], [0; 4], 1),
            (3, 16, 19, 23, 3, [2, 2], [1; 4], 1),
            (5, 7, 11, 13, 3, [1, 1], [1, 0, 2, 1], 1),
            (4, 13, 9, 10, 5, [1, 2], [2; 4], 1),
            (2, 6, 9, 9, 3, [1, 1], [2; 4], 2),
            (6, 5, 7, 8, 3, [2, 1], [0; 4], 1),
        ] {
            let g = Conv2d {
                c_in,
                h_in: h,
                w_in: w,
                c_out,
                kh: k,
                kw: k,
                stride,
                pad,
                dilation: [d, d],
                groups: 1,
            };
            g.check().unwrap();
            let x = rng.vec(c_in * h * w, -1.0, 1.0);
            let wt = rng.vec(g.weight_len(), -1.0, 1.0);
            let b = rng.vec(c_out, -1.0, 1.0);
            let n = c_out * g.h_out() * g.w_out();
            let (mut want, mut got) = (vec![0.0; n], vec![f32::NAN; n]);
            conv2d(&g, &x, &wt, &b, ConvActivation::None, &mut want);
            // The tail sees each output channel's pieces: mark them.
            let tail = |o: usize, piece: &mut [f32]| {
                for v in piece {
                    *v += 10.0 * o as f32;
                }
            };
            conv2d_gemm(&g, 1, &x, &wt, &b, ConvActivation::None, &mut got, tail);
            let plane = g.h_out() * g.w_out();
            let taps = (c_in * k * k) as f32;
            for (i, (gv, wv)) in got.iter().zip(&want).enumerate() {
                let wv = wv + 10.0 * (i / plane) as f32;
                // Fused multiply-adds against separate ones, |x|, |w| <= 1:
                // a few ulps of sqrt(taps), plus the marker's magnitude.
                let tol = 1e-5 * taps.sqrt() + 4e-6 * wv.abs();
                assert!((gv - wv).abs() <= tol, "{g:?} element {i}: {gv} vs {wv}");
            }
            // In a batch of three, each image's output is the same as
            // alone, bit for bit.
            let others = rng.vec(2 * c_in * h * w, -1.0, 1.0);
            let batch_x = [x.as_slice(), &others].concat();
            let mut batch = vec![f32::NAN; 3 * n];
            conv2d_gemm(
                &g,
                3,
                &batch_x,
                &wt,
                &b,
                ConvActivation::None,
                &mut batch,
                tail,
            );
            assert_eq!(&batch[..n], &got[..], "{g:?} first of a batch");
            let mut last = vec![f32::NAN; n];
            let last_x = &others[c_in * h * w..];
            conv2d_gemm(
                &g,
                1,
                last_x,
                &wt,
                &b,
                ConvActivation::None,
                &mut last,
                tail,
            );
            assert_eq!(&batch[2 * n..], &last[..], "{g:?} last of a batch");
        }
    }

    #[test]
    fn pooling_sums_each_channel_in_order() {
        let mut rng = Rng::new(6);
        for (c, n) in [(1, 5), (8, 33), (21, 100), (16, 1)] {
            let x = rng.vec(c * n, -1.0, 1.0);
            let mut got = vec![f32::NAN; c];
            global_avg_pool(&x, c, n, &mut got);
            let want: Vec<f32> = x
                .chunks_exact(n)
                .map(|p| p.iter().sum::<f32>() / n as f32)
                .collect();
            assert_eq!(got, want, "{c} x {n}");
        }
    }

    #[test]
    fn pooling_scaling_resize_concat() {
        let x = [1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0];
        let mut m = [0.0; 2];
        global_avg_pool(&x, 2, 4, &mut m);
        assert_eq!(m, [2.5, 25.0]);
        let mut s = [0.0; 8];
        scale_channels(&x, &[2.0, 0.5], 4, &mut s);
        assert_eq!(s, [2.0, 4.0, 6.0, 8.0, 5.0, 10.0, 15.0, 20.0]);
        // 2x2 -> 4x4 nearest: each pixel becomes a 2x2 block.
        let mut r = [0.0; 16];
        resize_nearest(&x[..4], 1, [2, 2], [4, 4], [2.0, 2.0], &mut r);
        assert_eq!(
            r,
            [1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0]
        );
        let mut c = [0.0; 5];
        concat(&[&[1.0, 2.0], &[3.0, 4.0, 5.0]], &mut c);
        assert_eq!(c, [1.0, 2.0, 3.0, 4.0, 5.0]);
    }
}
