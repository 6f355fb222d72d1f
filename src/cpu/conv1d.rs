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
/// accumulated in registers over every input channel and tap (24 zmm, or
/// 4 passes of 12 ymm, accumulators).
const OB: usize = 8;
const TB: usize = 48;

/// Where [`conv1d_into`] writes: output (o, t) goes to
/// `y[o * row + offset + t * step]`, for t below `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutLayout {
    pub row: usize,
    pub step: usize,
    pub offset: usize,
    pub count: usize,
}

/// x: [c_in, t_in], w: [c_out, c_in / groups, k], bias: `[c_out]` or none
/// -> y: [c_out, t_out] (stride 1). Work is split over output channels
/// (and, for dense convolutions, time).
pub fn conv1d(
    x: &[f32],
    t_in: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    s: &Conv1dShape,
    y: &mut [f32],
) {
    let t_out = s.t_out(t_in);
    check_shapes(x.len(), t_in, w, bias, s);
    assert_eq!(y.len(), s.c_out * t_out, "conv1d: output shape");
    if t_out == 0 {
        return;
    }
    if s.groups == 1 {
        let layout = OutLayout {
            row: t_out,
            step: 1,
            offset: 0,
            count: t_out,
        };
        conv1d_into(x, t_in, &PackedConv1d::new(w, s), bias, s, None, y, layout);
    } else {
        conv1d_grouped(x, t_in, w, bias, s, y, t_out);
    }
}

fn check_shapes(x_len: usize, t_in: usize, w: &[f32], bias: Option<&[f32]>, s: &Conv1dShape) {
    assert!(
        s.groups > 0 && s.c_in.is_multiple_of(s.groups) && s.c_out.is_multiple_of(s.groups),
        "conv1d: groups"
    );
    assert_eq!(x_len, s.c_in * t_in, "conv1d: input shape");
    assert_eq!(
        w.len(),
        s.c_out * (s.c_in / s.groups) * s.kernel,
        "conv1d: weight shape"
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), s.c_out, "conv1d: bias shape");
    }
}

/// A dense (groups 1) convolution of `leaky_relu(x, act_in)` (x itself
/// when `act_in` is none) written where `layout` says: the first
/// `layout.count` of its `s.t_out(t_in)` outputs per channel. The
/// activation is applied while each task copies its stretch of the input,
/// so it costs no pass of its own (leaky ReLU keeps the zero padding zero).
#[allow(clippy::too_many_arguments)]
pub fn conv1d_into(
    x: &[f32],
    t_in: usize,
    w: &PackedConv1d,
    bias: Option<&[f32]>,
    s: &Conv1dShape,
    act_in: Option<f32>,
    y: &mut [f32],
    layout: OutLayout,
) {
    w.check(x.len(), t_in, bias, s);
    assert!(layout.count <= s.t_out(t_in), "conv1d_into: count");
    if layout.count == 0 || s.c_out == 0 {
        return;
    }
    let last = (s.c_out - 1) * layout.row + layout.offset + (layout.count - 1) * layout.step;
    assert!(last < y.len(), "conv1d_into: output layout out of range");
    let input = Input { x, t_in, act_in };
    // SAFETY: `last` is in range, and `dense` writes each (o, t) once.
    unsafe { dense(&input, w, bias, s, y.as_mut_ptr(), layout, None) };
}

/// HiFi-GAN's residual step: y = x + conv(leaky_relu(x, slope)) + b, for
/// a dense convolution that keeps the channels and the length. Out of
/// place, so the tasks read x while others write y.
pub fn conv1d_residual(
    x: &[f32],
    t: usize,
    w: &PackedConv1d,
    bias: Option<&[f32]>,
    s: &Conv1dShape,
    slope: f32,
    y: &mut [f32],
) {
    w.check(x.len(), t, bias, s);
    assert!(
        s.c_in == s.c_out && s.t_out(t) == t,
        "conv1d_residual: shape {s:?}"
    );
    assert_eq!(y.len(), x.len(), "conv1d_residual: output shape");
    if t == 0 {
        return;
    }
    let layout = OutLayout {
        row: t,
        step: 1,
        offset: 0,
        count: t,
    };
    let input = Input {
        x,
        t_in: t,
        act_in: Some(slope),
    };
    // SAFETY: the layout covers y exactly, each (o, t) written once; x has
    // y's layout.
    unsafe { dense(&input, w, bias, s, y.as_mut_ptr(), layout, Some(x)) };
}

/// A convolution's input as the caller has it: [c_in, t_in], unpadded,
/// with the activation still to apply.
struct Input<'a> {
    x: &'a [f32],
    t_in: usize,
    act_in: Option<f32>,
}

impl Input<'_> {
    /// Copies the input steps `first..first + len` (`first` may be
    /// negative: the zero padding) of every channel through the activation
    /// into xp, rows `stride` apart.
    fn window(&self, isa: Isa, first: isize, len: usize, stride: usize, xp: &mut Vec<f32>) {
        let c_in = self.x.len() / self.t_in.max(1);
        xp.resize(c_in * stride, 0.0);
        let lo = (-first).clamp(0, len as isize) as usize;
        let hi = (self.t_in as isize - first).clamp(lo as isize, len as isize) as usize;
        for (i, row) in xp.chunks_exact_mut(stride).enumerate() {
            row[..lo].fill(0.0);
            row[hi..].fill(0.0);
            if hi == lo {
                continue;
            }
            let src = &self.x[i * self.t_in..][(first + lo as isize) as usize..][..hi - lo];
            let body = &mut row[lo..hi];
            match self.act_in {
                Some(slope) => isa.leaky_copy(body, src, slope),
                None => body.copy_from_slice(src),
            }
        }
    }
}

thread_local! {
    /// A task's stretch of the input, kept per thread between calls.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Taken out, not borrowed, so a nested call (a rayon worker that steals
/// another convolution while it waits) gets a buffer of its own.
fn take_scratch() -> Vec<f32> {
    SCRATCH.with(|c| c.take())
}

fn put_back_scratch(xp: Vec<f32>) {
    SCRATCH.with(|c| c.set(xp));
}

/// A dense (groups 1) convolution's weights in the tile's order,
/// [c_out / OB blocks][c_in][k][OB] with zeros for the missing channels of
/// a last partial block: packed once per layer, not once per call.
#[derive(Clone, Debug)]
pub struct PackedConv1d {
    wp: Vec<f32>,
    c_in: usize,
    c_out: usize,
    kernel: usize,
}

impl PackedConv1d {
    /// w: [c_out, c_in, k] (PyTorch's layout).
    pub fn new(w: &[f32], s: &Conv1dShape) -> PackedConv1d {
        let (c_in, kernel) = (s.c_in, s.kernel);
        assert_eq!(s.groups, 1, "PackedConv1d: groups must be 1");
        assert_eq!(w.len(), s.c_out * c_in * kernel, "conv1d: weight shape");
        let block = c_in * kernel * OB;
        let mut wp = vec![0.0; s.c_out.div_ceil(OB) * block];
        for (o, wo) in w.chunks_exact(c_in * kernel).enumerate() {
            let dst = &mut wp[(o / OB) * block + o % OB..];
            for (ik, &v) in wo.iter().enumerate() {
                dst[ik * OB] = v;
            }
        }
        PackedConv1d {
            wp,
            c_in,
            c_out: s.c_out,
            kernel,
        }
    }

    fn check(&self, x_len: usize, t_in: usize, bias: Option<&[f32]>, s: &Conv1dShape) {
        assert!(
            s.groups == 1 && (s.c_in, s.c_out, s.kernel) == (self.c_in, self.c_out, self.kernel),
            "conv1d: packed weights are for another shape than {s:?}"
        );
        assert_eq!(x_len, s.c_in * t_in, "conv1d: input shape");
        if let Some(b) = bias {
            assert_eq!(b.len(), s.c_out, "conv1d: bias shape");
        }
    }
}

/// A pointer the parallel tasks share; each writes its own outputs.
struct OutPtr(*mut f32);
// SAFETY: the tasks of `dense` write disjoint elements.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// (A method, so closures capture the wrapper and not the raw field.)
    fn at(&self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// The register-blocked convolution, in tasks of a run of TB-step tiles x
/// a group of OB-channel blocks. Each task copies the input its run reads
/// (padded, through the activation) into a scratch of its thread, where
/// it stays in cache for every block of the group. y = sum + bias (+
/// residual at the same position) per output, in the order the tile sums.
///
/// Safety: every `layout` position of the c_out channels is in `y`'s
/// allocation, nothing else reads or writes those positions meanwhile, and
/// `residual` (when given) has y's layout.
unsafe fn dense(
    input: &Input,
    w: &PackedConv1d,
    bias: Option<&[f32]>,
    s: &Conv1dShape,
    y: *mut f32,
    layout: OutLayout,
    residual: Option<&[f32]>,
) {
    let (c_in, c_out, kernel, d) = (s.c_in, s.c_out, s.kernel, s.dilation);
    let isa = Isa::detect();
    let block = c_in * kernel * OB;
    let n_ob = c_out.div_ceil(OB);
    let n_tb = layout.count.div_ceil(TB);
    // Runs short enough that their input stays in L2, and groups of blocks
    // whose weights do too; groups split further only where there are too
    // few runs to keep every thread busy.
    let threads = rayon::current_num_threads();
    let max_tiles = ((1usize << 16) / (c_in * TB).max(1)).max(1);
    let per = n_tb.div_ceil(4 * threads).clamp(1, max_tiles);
    let n_tc = n_tb.div_ceil(per);
    let fit = ((1usize << 16) / block.max(1)).max(1);
    let n_og = (4 * threads)
        .div_ceil(n_tc)
        .max(n_ob.div_ceil(fit))
        .min(n_ob);
    let per_og = n_ob.div_ceil(n_og);
    let n_og = n_ob.div_ceil(per_og);
    let halo = d * (kernel - 1);
    if residual.is_some() {
        assert_eq!(layout.step, 1, "dense: a residual is not strided");
    }
    let out = OutPtr(y);
    (0..n_og * n_tc).into_par_iter().for_each(|task| {
        let (og, tc) = (task / n_tc, task % n_tc);
        let tiles = tc * per..((tc + 1) * per).min(n_tb);
        let run_t0 = tiles.start * TB;
        let len = tiles.len() * TB + halo;
        // Rows a whole number of cache lines apart.
        let stride = len.next_multiple_of(16);
        let mut xp = take_scratch();
        input.window(
            isa,
            run_t0 as isize - s.pad_left as isize,
            len,
            stride,
            &mut xp,
        );
        for tb in tiles {
            let t0 = tb * TB;
            for ob in og * per_og..((og + 1) * per_og).min(n_ob) {
                let o0 = ob * OB;
                let n_o = OB.min(c_out - o0);
                let wb = &w.wp[ob * block..(ob + 1) * block];
                let n = TB.min(layout.count - t0);
                let base = o0 * layout.row + layout.offset + t0 * layout.step;
                let mut bias_o = [0.0; OB];
                if let Some(b) = bias {
                    bias_o[..n_o].copy_from_slice(&b[o0..o0 + n_o]);
                }
                let to = TileOut {
                    y: out.at(base),
                    row: layout.row,
                    step: layout.step,
                    n_o,
                    n,
                    bias: bias_o,
                    residual: residual.map_or(std::ptr::null(), |r| r[base..].as_ptr()),
                };
                // SAFETY: in y by the caller's contract (and the residual,
                // of y's layout, in it); this task owns outputs o0..o0 +
                // n_o at steps t0..t0 + n.
                unsafe { isa.tile_into(&xp, stride, wb, c_in, kernel, d, t0 - run_t0, &to) };
            }
        }
        put_back_scratch(xp);
    });
}

/// Which build of the dense tile runs. The SIMD builds sum each output in
/// the same order with fused multiply-adds, so they give the same bits;
/// the portable one rounds each product (within a few ulps of them).
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
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// One OB x TB output block: xp is the padded input ([c_in, len]), wp
    /// the block's weights ([c_in, k, OB]). (The convolutions write theirs
    /// through [`Isa::tile_into`]; the tests compare the builds' sums.)
    #[cfg(test)]
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
            // features); the reads are in range by the asserts above.
            Isa::Avx512 => unsafe { simd::tile_avx512(xp, len, wp, c_in, kernel, d, t0) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { simd::tile_avx2(xp, len, wp, c_in, kernel, d, t0) },
            _ => dense_tile(xp, len, wp, c_in, kernel, d, t0),
        }
    }
}

impl Isa {
    /// [`Isa::tile`] with its outputs written where `out` says.
    ///
    /// Safety: `out` describes positions in one allocation (and the
    /// residual's, when given, in another) that nothing else touches
    /// meanwhile.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_into(
        self,
        xp: &[f32],
        len: usize,
        wp: &[f32],
        c_in: usize,
        kernel: usize,
        d: usize,
        t0: usize,
        out: &TileOut,
    ) {
        assert!(xp.len() >= c_in * len && t0 + d * (kernel - 1) + TB <= len);
        assert!(wp.len() >= c_in * kernel * OB && out.n_o <= OB && out.n <= TB);
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `tile`, and `out` by the caller's contract.
            Isa::Avx512 => unsafe { simd::tile_into_avx512(xp, len, wp, c_in, kernel, d, t0, out) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { simd::tile_into_avx2(xp, len, wp, c_in, kernel, d, t0, out) },
            // SAFETY: by the caller's contract.
            _ => unsafe { write_tile(&dense_tile(xp, len, wp, c_in, kernel, d, t0), out) },
        }
    }

    /// dst = leaky_relu(src, slope), in the widest vectors the CPU has.
    fn leaky_copy(self, dst: &mut [f32], src: &[f32], slope: f32) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has the features (`available`).
            Isa::Avx512 => unsafe { simd::leaky_copy_avx512(dst, src, slope) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { simd::leaky_copy_avx2(dst, src, slope) },
            _ => leaky_copy(dst, src, slope),
        }
    }
}

/// Where a tile's outputs go: output (o, t) of the tile to `y[o * row + t *
/// step]`, for o < n_o and t < n, as acc + bias[o], added to the residual
/// (of y's layout, step 1) at the same position when there is one.
struct TileOut {
    y: *mut f32,
    row: usize,
    step: usize,
    n_o: usize,
    n: usize,
    bias: [f32; OB],
    /// Null: none.
    residual: *const f32,
}

/// Writes a tile's sums where `out` says (inlined into each build, so it
/// is vectorised as widely as the tile).
///
/// Safety: as [`Isa::tile_into`].
#[inline(always)]
unsafe fn write_tile(acc: &[[f32; TB]; OB], out: &TileOut) {
    for (o, a) in acc.iter().enumerate().take(out.n_o) {
        let b = out.bias[o];
        let a = &a[..out.n];
        // SAFETY: by the caller's contract.
        unsafe {
            let dst = out.y.add(o * out.row);
            if out.step != 1 {
                for (j, &v) in a.iter().enumerate() {
                    *dst.add(j * out.step) = v + b;
                }
                continue;
            }
            let dst = std::slice::from_raw_parts_mut(dst, out.n);
            if out.residual.is_null() {
                dst.iter_mut().zip(a).for_each(|(d, &v)| *d = v + b);
            } else {
                let r = std::slice::from_raw_parts(out.residual.add(o * out.row), out.n);
                for ((d, &v), &r) in dst.iter_mut().zip(a).zip(r) {
                    *d = r + (v + b);
                }
            }
        }
    }
}

/// dst = leaky_relu(src, slope) (inlined into each build).
#[inline(always)]
fn leaky_copy(dst: &mut [f32], src: &[f32], slope: f32) {
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = if v < 0.0 { v * slope } else { v };
    }
}

/// The dense tile written plainly (the portable build; the SIMD builds sum
/// in the same order, fused).
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

/// The dense tile in intrinsics with fused multiply-adds: the
/// autovectoriser left the plain loop scalar, with the accumulators in
/// memory.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{leaky_copy, write_tile, TileOut, OB, TB};
    use std::arch::x86_64::*;

    /// Callers: the CPU has AVX-512F; the ranges of [`tile_avx512`] and
    /// the contract of `Isa::tile_into`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_into_avx512(
        xp: &[f32],
        len: usize,
        wp: &[f32],
        c_in: usize,
        kernel: usize,
        d: usize,
        t0: usize,
        out: &TileOut,
    ) {
        // SAFETY: by the caller's contract.
        unsafe { write_tile(&tile_avx512(xp, len, wp, c_in, kernel, d, t0), out) }
    }

    /// Callers: the CPU has AVX2 and FMA; as [`tile_into_avx512`].
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_into_avx2(
        xp: &[f32],
        len: usize,
        wp: &[f32],
        c_in: usize,
        kernel: usize,
        d: usize,
        t0: usize,
        out: &TileOut,
    ) {
        // SAFETY: by the caller's contract.
        unsafe { write_tile(&tile_avx2(xp, len, wp, c_in, kernel, d, t0), out) }
    }

    /// Callers: the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn leaky_copy_avx512(dst: &mut [f32], src: &[f32], slope: f32) {
        leaky_copy(dst, src, slope)
    }

    /// Callers: the CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn leaky_copy_avx2(dst: &mut [f32], src: &[f32], slope: f32) {
        leaky_copy(dst, src, slope)
    }

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
        const V: usize = TB / 16;
        let mut acc = [[_mm512_setzero_ps(); V]; OB];
        let (xb, wb) = (xp.as_ptr(), wp.as_ptr());
        for i in 0..c_in {
            for k in 0..kernel {
                // SAFETY: in range by the caller's contract.
                unsafe {
                    let xs = xb.add(i * len + t0 + k * d);
                    let mut x = [_mm512_setzero_ps(); V];
                    for (j, xv) in x.iter_mut().enumerate() {
                        *xv = _mm512_loadu_ps(xs.add(16 * j));
                    }
                    let ws = wb.add((i * kernel + k) * OB);
                    for (o, a) in acc.iter_mut().enumerate() {
                        let w = _mm512_set1_ps(*ws.add(o));
                        for (av, &xv) in a.iter_mut().zip(&x) {
                            *av = _mm512_fmadd_ps(w, xv, *av);
                        }
                    }
                }
            }
        }
        let mut out = [[0.0f32; TB]; OB];
        for (row, a) in out.iter_mut().zip(&acc) {
            for (j, &av) in a.iter().enumerate() {
                // SAFETY: row holds TB = V x 16 floats.
                unsafe { _mm512_storeu_ps(row.as_mut_ptr().add(16 * j), av) };
            }
        }
        out
    }

    /// Callers: the CPU has AVX2 and FMA; the same ranges as
    /// [`tile_avx512`]. The block in four passes of 4 channels x 24 steps
    /// (12 accumulators of the 16 ymm registers).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2(
        xp: &[f32],
        len: usize,
        wp: &[f32],
        c_in: usize,
        kernel: usize,
        d: usize,
        t0: usize,
    ) -> [[f32; TB]; OB] {
        const OH: usize = OB / 2;
        const V: usize = TB / 2 / 8;
        let mut out = [[0.0f32; TB]; OB];
        let (xb, wb) = (xp.as_ptr(), wp.as_ptr());
        for oh in 0..2 {
            for th in 0..2 {
                let mut acc = [[_mm256_setzero_ps(); V]; OH];
                for i in 0..c_in {
                    for k in 0..kernel {
                        // SAFETY: in range by the caller's contract.
                        unsafe {
                            let xs = xb.add(i * len + t0 + k * d + th * TB / 2);
                            let mut x = [_mm256_setzero_ps(); V];
                            for (j, xv) in x.iter_mut().enumerate() {
                                *xv = _mm256_loadu_ps(xs.add(8 * j));
                            }
                            let ws = wb.add((i * kernel + k) * OB + oh * OH);
                            for (o, a) in acc.iter_mut().enumerate() {
                                let w = _mm256_set1_ps(*ws.add(o));
                                for (av, &xv) in a.iter_mut().zip(&x) {
                                    *av = _mm256_fmadd_ps(w, xv, *av);
                                }
                            }
                        }
                    }
                }
                for (o, a) in acc.iter().enumerate() {
                    let row = &mut out[oh * OH + o];
                    for (j, &av) in a.iter().enumerate() {
                        // SAFETY: th * TB / 2 + 8 j + 8 <= TB.
                        unsafe { _mm256_storeu_ps(row.as_mut_ptr().add(th * TB / 2 + 8 * j), av) };
                    }
                }
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
            // Many runs of tiles, each through groups of output blocks.
            (16, 40, 5, 3, 6, 2, 1, 3000),
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
    fn simd_tiles_agree_bit_for_bit_and_with_the_plain_one() {
        let mut rng = crate::util::rng::Rng::new(5);
        let (c_in, kernel, d) = (37, 5, 3);
        let len = 3 * TB + d * (kernel - 1);
        let xp = rng.vec(c_in * len, -1.0, 1.0);
        let wp = rng.vec(c_in * kernel * OB, -1.0, 1.0);
        let best = Isa::available();
        for t0 in [0, TB, 2 * TB] {
            let plain = Isa::Portable.tile(&xp, len, &wp, c_in, kernel, d, t0);
            let mut simd = Vec::new();
            for isa in [Isa::Avx2, Isa::Avx512] {
                if isa == Isa::Avx512 && best != Isa::Avx512 || best == Isa::Portable {
                    eprintln!("{isa:?}: not on this CPU");
                    continue;
                }
                let got = isa.tile(&xp, len, &wp, c_in, kernel, d, t0);
                // Fused and unfused sums of 185 products in [-1, 1] differ
                // by roundings only.
                for (a, b) in got.iter().flatten().zip(plain.iter().flatten()) {
                    assert!((a - b).abs() < 1e-4, "{isa:?} t0={t0}: {a} vs {b}");
                }
                simd.push(got);
            }
            // Both SIMD builds give the same bits, so the voice's output
            // does not depend on which x86 CPU runs it.
            if let [a, b] = &simd[..] {
                for (a, b) in a.iter().flatten().zip(b.iter().flatten()) {
                    assert_eq!(a.to_bits(), b.to_bits(), "t0={t0}");
                }
            }
        }
    }

    #[test]
    fn fused_forms_match_the_definition() {
        let mut rng = crate::util::rng::Rng::new(6);
        for (c, k, d, t) in [(16, 3, 1, 130), (9, 5, 3, 7), (24, 7, 12, 200)] {
            let s = Conv1dShape {
                c_in: c,
                c_out: c,
                kernel: k,
                dilation: d,
                pad_left: d * (k - 1) / 2,
                pad_right: d * (k - 1) / 2,
                groups: 1,
            };
            let x = rng.vec(c * t, -1.0, 1.0);
            let w = rng.vec(c * c * k, -1.0, 1.0);
            let b = rng.vec(c, -1.0, 1.0);
            let act: Vec<f32> = x
                .iter()
                .map(|&v| if v < 0.0 { 0.1 * v } else { v })
                .collect();
            let conv = conv1d_naive(&act, t, &w, &b, &s);
            // x + conv(leaky_relu(x)) + b.
            let mut got = vec![f32::NAN; x.len()];
            let packed = PackedConv1d::new(&w, &s);
            conv1d_residual(&x, t, &packed, Some(&b), &s, 0.1, &mut got);
            for ((g, x), c) in got.iter().zip(&x).zip(&conv) {
                assert!(
                    (g - (x + c)).abs() < 1e-4,
                    "residual {s:?}: {g} vs {}",
                    x + c
                );
            }
            // Every third output of the first t - 2, into a strided row.
            let (step, offset, count) = (3, 2, t - 2);
            let row = offset + step * count + 1;
            let mut y = vec![f32::NAN; c * row];
            let layout = OutLayout {
                row,
                step,
                offset,
                count,
            };
            conv1d_into(&x, t, &packed, Some(&b), &s, Some(0.1), &mut y, layout);
            for o in 0..c {
                for (p, v) in y[o * row..(o + 1) * row].iter().enumerate() {
                    let hit =
                        p >= offset && (p - offset) % step == 0 && (p - offset) / step < count;
                    if hit {
                        let want = conv[o * t + (p - offset) / step];
                        assert!((v - want).abs() < 1e-4, "strided {s:?}: {v} vs {want}");
                    } else {
                        assert!(v.is_nan(), "strided {s:?}: wrote position {p}");
                    }
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
