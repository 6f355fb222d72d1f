//! 1-D convolutions and the activations around them (speech models: VITS /
//! HiFi-GAN). Activations are `[channels, time]`, row-major, batch 1;
//! weights use PyTorch's layouts (`Conv1d`: `[out, in / groups, k]`,
//! `ConvTranspose1d`: `[in, out, k]`).

use rayon::prelude::*;

/// Shape and hyper-parameters of a `Conv1d` with stride 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dShape {
    pub c_in: usize,
    pub c_out: usize,
    pub kernel: usize,
    pub dilation: usize,
    /// Zero padding before and after the input.
    pub pad_left: usize,
    pub pad_right: usize,
    pub groups: usize,
}

impl Conv1dShape {
    /// Output length for an input of `t_in` steps.
    pub fn t_out(&self, t_in: usize) -> usize {
        (t_in + self.pad_left + self.pad_right + 1)
            .saturating_sub(self.dilation * (self.kernel - 1) + 1)
    }
}

/// Grouped convolutions (depthwise in VITS's duration predictor): one output
/// row at a time, in tiles of this many steps that stay in L1.
const TILE: usize = 512;
/// Dense convolutions: a block of OB output channels x TB time steps is
/// accumulated in registers over every input channel and tap (16 zmm or
/// 4 x 8 ymm accumulators).
const OB: usize = 8;
const TB: usize = 32;

/// x: [c_in, t_in], w: [c_out, c_in / groups, k], bias: `[c_out]` or none
/// -> y: [c_out, t_out] (stride 1). Work is split over output channels.
pub fn conv1d(
    x: &[f32],
    t_in: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    s: &Conv1dShape,
    y: &mut [f32],
) {
    let t_out = s.t_out(t_in);
    assert!(
        s.groups > 0 && s.c_in.is_multiple_of(s.groups) && s.c_out.is_multiple_of(s.groups),
        "conv1d: groups"
    );
    let cin_g = s.c_in / s.groups;
    assert_eq!(x.len(), s.c_in * t_in, "conv1d: input shape");
    assert_eq!(w.len(), s.c_out * cin_g * s.kernel, "conv1d: weight shape");
    assert_eq!(y.len(), s.c_out * t_out, "conv1d: output shape");
    if let Some(b) = bias {
        assert_eq!(b.len(), s.c_out, "conv1d: bias shape");
    }
    if t_out == 0 {
        return;
    }
    if s.groups == 1 {
        conv1d_dense(x, t_in, w, bias, s, y, t_out);
    } else {
        conv1d_grouped(x, t_in, w, bias, s, y, t_out);
    }
}

fn conv1d_dense(
    x: &[f32],
    t_in: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    s: &Conv1dShape,
    y: &mut [f32],
    t_out: usize,
) {
    let (c_in, kernel, d) = (s.c_in, s.kernel, s.dilation);
    // The input with its zero padding made explicit (and room for a whole
    // last tile), so every tap of every tile reads in range.
    let len = t_out.div_ceil(TB) * TB + d * (kernel - 1);
    let mut xp = vec![0.0f32; c_in * len];
    for i in 0..c_in {
        let n = t_in.min(len.saturating_sub(s.pad_left));
        xp[i * len + s.pad_left..][..n].copy_from_slice(&x[i * t_in..][..n]);
    }
    let isa = Isa::detect();
    y.par_chunks_mut(OB * t_out)
        .enumerate()
        .for_each(|(ob, rows)| {
            let o0 = ob * OB;
            let n_o = rows.len() / t_out;
            // This block's weights as [c_in, k, OB], zeros for missing channels.
            let mut wp = vec![0.0f32; c_in * kernel * OB];
            for oo in 0..n_o {
                for i in 0..c_in {
                    for k in 0..kernel {
                        wp[(i * kernel + k) * OB + oo] = w[((o0 + oo) * c_in + i) * kernel + k];
                    }
                }
            }
            for t0 in (0..t_out).step_by(TB) {
                let acc = isa.tile(&xp, len, &wp, c_in, kernel, d, t0);
                let n = TB.min(t_out - t0);
                for (oo, a) in acc.iter().enumerate().take(n_o) {
                    let b = bias.map_or(0.0, |b| b[o0 + oo]);
                    for (yv, av) in rows[oo * t_out + t0..][..n].iter_mut().zip(a) {
                        *yv = av + b;
                    }
                }
            }
        });
}

/// Which build of the dense tile runs. Every build does the same
/// operations per output (a product rounded, then added, over input
/// channels then taps, no fused multiply-add), so all give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Only x86-64 builds construct the SIMD variants.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Isa {
    Portable,
    Avx2,
    Avx512,
}

impl Isa {
    /// The widest the CPU has; `LFM_CONV1D=portable|avx2` asks for a
    /// narrower one (to time them against each other).
    fn detect() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            let want = std::env::var("LFM_CONV1D").unwrap_or_default();
            let best = Isa::available();
            match want.as_str() {
                "portable" => Isa::Portable,
                "avx2" if best != Isa::Portable => Isa::Avx2,
                _ => best,
            }
        })
    }

    fn available() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// One OB x TB output block: xp is the padded input ([c_in, len]), wp
    /// the block's weights ([c_in, k, OB]).
    #[allow(clippy::too_many_arguments)]
    fn tile(
        self,
        xp: &[f32],
        len: usize,
        wp: &[f32],
        c_in: usize,
        kernel: usize,
        d: usize,
        t0: usize,
    ) -> [[f32; TB]; OB] {
        // What the SIMD builds read without bounds checks.
        assert!(xp.len() >= c_in * len && t0 + d * (kernel - 1) + TB <= len);
        assert!(wp.len() >= c_in * kernel * OB);
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Avx512 / Avx2 come from `available` (the CPU has the
            // feature); the reads are in range by the asserts above.
            Isa::Avx512 => unsafe { simd::tile_avx512(xp, len, wp, c_in, kernel, d, t0) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { simd::tile_avx2(xp, len, wp, c_in, kernel, d, t0) },
            _ => dense_tile(xp, len, wp, c_in, kernel, d, t0),
        }
    }
}

/// The dense tile written plainly (the portable build, and the definition
/// the SIMD builds match bit for bit).
fn dense_tile(
    xp: &[f32],
    len: usize,
    wp: &[f32],
    c_in: usize,
    kernel: usize,
    d: usize,
    t0: usize,
) -> [[f32; TB]; OB] {
    let mut acc = [[0.0f32; TB]; OB];
    for i in 0..c_in {
        let xrow = &xp[i * len..(i + 1) * len];
        for k in 0..kernel {
            let xs: &[f32; TB] = xrow[t0 + k * d..][..TB].try_into().expect("tile");
            let ws = &wp[(i * kernel + k) * OB..][..OB];
            for (a, &wv) in acc.iter_mut().zip(ws) {
                for (av, xv) in a.iter_mut().zip(xs) {
                    *av += wv * xv;
                }
            }
        }
    }
    acc
}

/// The dense tile in intrinsics: the autovectoriser left the plain loop
/// scalar, with the accumulators in memory.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{OB, TB};
    use std::arch::x86_64::*;

    /// Callers: the CPU has AVX-512F; xp[i * len + t0 + k * d..][..TB] and
    /// wp[..c_in * kernel * OB] are in range.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_avx512(
        xp: &[f32],
        len: usize,
        wp: &[f32],
        c_in: usize,
        kernel: usize,
        d: usize,
        t0: usize,
    ) -> [[f32; TB]; OB] {
        let mut acc = [[_mm512_setzero_ps(); TB / 16]; OB];
        let (xb, wb) = (xp.as_ptr(), wp.as_ptr());
        for i in 0..c_in {
            for k in 0..kernel {
                // SAFETY: in range by the caller's contract.
                unsafe {
                    let xs = xb.add(i * len + t0 + k * d);
                    let x = [_mm512_loadu_ps(xs), _mm512_loadu_ps(xs.add(16))];
                    let ws = wb.add((i * kernel + k) * OB);
                    for (o, a) in acc.iter_mut().enumerate() {
                        let w = _mm512_set1_ps(*ws.add(o));
                        for (av, &xv) in a.iter_mut().zip(&x) {
                            *av = _mm512_add_ps(*av, _mm512_mul_ps(w, xv));
                        }
                    }
                }
            }
        }
        let mut out = [[0.0f32; TB]; OB];
        for (row, a) in out.iter_mut().zip(&acc) {
            for (j, &av) in a.iter().enumerate() {
                // SAFETY: row holds TB = 2 x 16 floats.
                unsafe { _mm512_storeu_ps(row.as_mut_ptr().add(16 * j), av) };
            }
        }
        out
    }

    /// Callers: the CPU has AVX2; the same ranges as [`tile_avx512`]. The
    /// block in four 8 x 8 passes (8 accumulators of 16 ymm registers).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn tile_avx2(
        xp: &[f32],
        len: usize,
        wp: &[f32],
        c_in: usize,
        kernel: usize,
        d: usize,
        t0: usize,
    ) -> [[f32; TB]; OB] {
        let mut out = [[0.0f32; TB]; OB];
        let (xb, wb) = (xp.as_ptr(), wp.as_ptr());
        for j in 0..TB / 8 {
            let mut acc = [_mm256_setzero_ps(); OB];
            for i in 0..c_in {
                for k in 0..kernel {
                    // SAFETY: in range by the caller's contract.
                    unsafe {
                        let x = _mm256_loadu_ps(xb.add(i * len + t0 + k * d + 8 * j));
                        let ws = wb.add((i * kernel + k) * OB);
                        for (o, av) in acc.iter_mut().enumerate() {
                            let w = _mm256_set1_ps(*ws.add(o));
                            *av = _mm256_add_ps(*av, _mm256_mul_ps(w, x));
                        }
                    }
                }
            }
            for (row, &av) in out.iter_mut().zip(&acc) {
                // SAFETY: row holds TB floats, 8 j + 8 <= TB.
                unsafe { _mm256_storeu_ps(row.as_mut_ptr().add(8 * j), av) };
            }
        }
        out
    }
}

fn conv1d_grouped(
    x: &[f32],
    t_in: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    s: &Conv1dShape,
    y: &mut [f32],
    t_out: usize,
) {
    let cin_g = s.c_in / s.groups;
    let cout_g = s.c_out / s.groups;
    y.par_chunks_mut(t_out).enumerate().for_each(|(o, row)| {
        let g = o / cout_g;
        let b = bias.map_or(0.0, |b| b[o]);
        for (tile_i, tile) in row.chunks_mut(TILE).enumerate() {
            let t0 = tile_i * TILE;
            tile.fill(b);
            for ic in 0..cin_g {
                let i = g * cin_g + ic;
                let xrow = &x[i * t_in..(i + 1) * t_in];
                let wrow = &w[(o * cin_g + ic) * s.kernel..(o * cin_g + ic + 1) * s.kernel];
                for (k, &wk) in wrow.iter().enumerate() {
                    // Input index of output step t: t + k * dilation - pad_left.
                    let off = (k * s.dilation) as isize - s.pad_left as isize;
                    let lo = (-off - t0 as isize).clamp(0, tile.len() as isize) as usize;
                    let hi =
                        (t_in as isize - off - t0 as isize).clamp(0, tile.len() as isize) as usize;
                    if lo >= hi {
                        continue;
                    }
                    let src = (t0 as isize + lo as isize + off) as usize;
                    for (yv, xv) in tile[lo..hi].iter_mut().zip(&xrow[src..src + (hi - lo)]) {
                        *yv += wk * xv;
                    }
                }
            }
        }
    });
}

/// Shape and hyper-parameters of a `ConvTranspose1d` (groups 1, dilation 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose1dShape {
    pub c_in: usize,
    pub c_out: usize,
    pub kernel: usize,
    pub stride: usize,
    /// Steps cut from both ends of the full output.
    pub pad: usize,
}

impl ConvTranspose1dShape {
    pub fn t_out(&self, t_in: usize) -> usize {
        ((t_in.max(1) - 1) * self.stride + self.kernel).saturating_sub(2 * self.pad)
    }
}

/// x: [c_in, t_in], w: [c_in, c_out, k], bias: `[c_out]` or none
/// -> y: [c_out, t_out]; y[o, t*stride + k - pad] += x[i, t] w[i, o, k].
/// Written as a gather (each output step sums the taps that reach it) so
/// output rows are independent and computed in parallel.
pub fn conv_transpose1d(
    x: &[f32],
    t_in: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    s: &ConvTranspose1dShape,
    y: &mut [f32],
) {
    let t_out = s.t_out(t_in);
    assert_eq!(x.len(), s.c_in * t_in, "conv_transpose1d: input shape");
    assert_eq!(
        w.len(),
        s.c_in * s.c_out * s.kernel,
        "conv_transpose1d: weight shape"
    );
    assert_eq!(y.len(), s.c_out * t_out, "conv_transpose1d: output shape");
    if t_in == 0 {
        return;
    }
    y.par_chunks_mut(t_out).enumerate().for_each(|(o, row)| {
        row.fill(bias.map_or(0.0, |b| b[o]));
        for i in 0..s.c_in {
            let xrow = &x[i * t_in..(i + 1) * t_in];
            let wrow = &w[(i * s.c_out + o) * s.kernel..(i * s.c_out + o + 1) * s.kernel];
            for (k, &wk) in wrow.iter().enumerate() {
                // Output p = t * stride + k - pad, for every t whose p is in range.
                let first_t = s.pad.saturating_sub(k).div_ceil(s.stride);
                let mut t = first_t;
                while t < t_in {
                    let p = t * s.stride + k - s.pad;
                    if p >= t_out {
                        break;
                    }
                    row[p] += wk * xrow[t];
                    t += 1;
                }
            }
        }
    });
}

/// leaky_relu(x) = x for x >= 0, slope * x otherwise (in place).
pub fn leaky_relu(x: &mut [f32], slope: f32) {
    for v in x {
        if *v < 0.0 {
            *v *= slope;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, written the obvious way, as the oracle.
    fn conv1d_naive(x: &[f32], t_in: usize, w: &[f32], b: &[f32], s: &Conv1dShape) -> Vec<f32> {
        let t_out = s.t_out(t_in);
        let (cin_g, cout_g) = (s.c_in / s.groups, s.c_out / s.groups);
        let mut y = vec![0.0; s.c_out * t_out];
        for o in 0..s.c_out {
            for t in 0..t_out {
                let mut acc = b[o];
                for ic in 0..cin_g {
                    let i = (o / cout_g) * cin_g + ic;
                    for k in 0..s.kernel {
                        let src = t as isize + (k * s.dilation) as isize - s.pad_left as isize;
                        if src >= 0 && (src as usize) < t_in {
                            acc += w[(o * cin_g + ic) * s.kernel + k] * x[i * t_in + src as usize];
                        }
                    }
                }
                y[o * t_out + t] = acc;
            }
        }
        y
    }

    #[test]
    fn conv1d_matches_the_definition() {
        let mut rng = crate::util::rng::Rng::new(3);
        for (c_in, c_out, k, d, pl, pr, g, t) in [
            (3, 4, 3, 1, 1, 1, 1, 7),
            (4, 4, 3, 3, 3, 3, 4, 600),
            (2, 5, 7, 12, 36, 36, 1, 50),
            (3, 2, 5, 1, 0, 0, 1, 9),
            (2, 2, 3, 1, 2, 0, 1, 1),
            (7, 9, 5, 2, 4, 4, 1, 37),
            (6, 6, 3, 9, 9, 9, 3, 20),
        ] {
            let s = Conv1dShape {
                c_in,
                c_out,
                kernel: k,
                dilation: d,
                pad_left: pl,
                pad_right: pr,
                groups: g,
            };
            let x = rng.vec(c_in * t, -1.0, 1.0);
            let w = rng.vec(c_out * (c_in / g) * k, -1.0, 1.0);
            let b = rng.vec(c_out, -1.0, 1.0);
            let mut y = vec![f32::NAN; c_out * s.t_out(t)];
            conv1d(&x, t, &w, Some(&b), &s, &mut y);
            let want = conv1d_naive(&x, t, &w, &b, &s);
            for (a, b) in y.iter().zip(&want) {
                assert!((a - b).abs() < 1e-4, "{s:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn simd_tiles_are_bit_equal_to_the_plain_one() {
        let mut rng = crate::util::rng::Rng::new(5);
        let (c_in, kernel, d) = (37, 5, 3);
        let len = 3 * TB + d * (kernel - 1);
        let xp = rng.vec(c_in * len, -1.0, 1.0);
        let wp = rng.vec(c_in * kernel * OB, -1.0, 1.0);
        let best = Isa::available();
        for isa in [Isa::Avx2, Isa::Avx512] {
            if isa == Isa::Avx512 && best != Isa::Avx512 || best == Isa::Portable {
                eprintln!("{isa:?}: not on this CPU");
                continue;
            }
            for t0 in [0, TB, 2 * TB] {
                let want = dense_tile(&xp, len, &wp, c_in, kernel, d, t0);
                let got = isa.tile(&xp, len, &wp, c_in, kernel, d, t0);
                for (a, b) in got.iter().flatten().zip(want.iter().flatten()) {
                    assert_eq!(a.to_bits(), b.to_bits(), "{isa:?} t0={t0}");
                }
            }
        }
    }

    #[test]
    fn conv_transpose1d_matches_the_scatter_definition() {
        let mut rng = crate::util::rng::Rng::new(4);
        for (c_in, c_out, k, stride, pad, t) in
            [(3, 2, 16, 8, 4, 5), (2, 3, 8, 4, 2, 1), (1, 1, 3, 2, 0, 4)]
        {
            let s = ConvTranspose1dShape {
                c_in,
                c_out,
                kernel: k,
                stride,
                pad,
            };
            let x = rng.vec(c_in * t, -1.0, 1.0);
            let w = rng.vec(c_in * c_out * k, -1.0, 1.0);
            let b = rng.vec(c_out, -1.0, 1.0);
            let t_out = s.t_out(t);
            let mut y = vec![f32::NAN; c_out * t_out];
            conv_transpose1d(&x, t, &w, Some(&b), &s, &mut y);
            let mut want = vec![0.0f32; c_out * t_out];
            for o in 0..c_out {
                want[o * t_out..(o + 1) * t_out].fill(b[o]);
            }
            for i in 0..c_in {
                for o in 0..c_out {
                    for ti in 0..t {
                        for kk in 0..k {
                            let p = (ti * stride + kk) as isize - pad as isize;
                            if p >= 0 && (p as usize) < t_out {
                                want[o * t_out + p as usize] +=
                                    x[i * t + ti] * w[(i * c_out + o) * k + kk];
                            }
                        }
                    }
                }
            }
            for (a, b) in y.iter().zip(&want) {
                assert!((a - b).abs() < 1e-4, "{s:?}: {a} vs {b}");
            }
        }
    }
}
