//! Fast row dot products for the matrix-vector product.
//!
//! The reference [`super::dot_row`] dequantises each block into a buffer and
//! then dots it. The kernels here compute the same sum with the block scales
//! factored out of the inner loop: per block they accumulate `level * x` into
//! lane accumulators (one per element position, so the compiler vectorises
//! the loop) scaled by the block's scale, and handle the constant part of
//! each level (the `- 8` of Q4_0, the min of Q4_1, ...) once per block through
//! sums of `x` that [`RowDot::new`] precomputes once for all rows. The input
//! stays f32: results differ from the reference only in the order of f32
//! additions and in where the scale multiplies, which the tests bound.
//!
//! Each kernel is one generic function compiled twice, for the baseline
//! target and with AVX2 enabled; the most used types also have a copy written
//! with AVX2 + FMA intrinsics (`avx2.rs`), because the compiler keeps the
//! generic lanes in 128-bit registers. The best copy the CPU runs is chosen
//! at run time. F32 has no kernel here: it uses the reference, which is
//! `cpu::dot` itself.
//!
//! [`int8`] has faster, less exact kernels that round the input to 8-bit
//! levels (llama.cpp's CPU convention) for Q4_0, Q4_1 and Q8_0; callers opt
//! in with [`RowDot::new_int8`]. [`rows8`] repacks Q4_0, Q4_1 and Q8_0
//! matrices eight rows at a time for the same integer products with a SIMD
//! lane per row ([`RowDot::dot_rows8`]): the CPU decoder's int8 layers and
//! its Q8_0 vocabulary projection.

use super::util::get_scale_min_k4;
use super::{
    q1_0::BlockQ1_0, q2_k::BlockQ2K, q3_k, q3_k::BlockQ3K, q4_0::BlockQ4_0, q4_1::BlockQ4_1,
    q4_k::BlockQ4K, q5_0::BlockQ5_0, q5_1::BlockQ5_1, q5_k::BlockQ5K, q6_k::BlockQ6K,
    q8_0::BlockQ8_0, GgmlType, QK_K,
};

/// A row kernel: (row bytes, x, precomputed sums of x) -> dot product.
type Kernel = fn(&[u8], &[f32], &[f32]) -> f32;

#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod gemm8;
pub mod int8;
pub mod rows8;

/// Dot products of rows of one weight type with one input vector.
pub struct RowDot<'a> {
    dtype: GgmlType,
    x: &'a [f32],
    /// The byte size of a row of `x.len()` elements, computed once (the
    /// kernels check every row against it).
    row_bytes: Option<usize>,
    path: Path,
}

/// How [`RowDot`] computes its products.
enum Path {
    /// The reference: dequantise, then dot.
    Reference,
    /// A fast f32 kernel and the sums of `x` it needs (see `sum_group`).
    F32(Kernel, Vec<f32>),
    /// `x` rounded to 8 bits and the integer kernel over it
    /// ([`RowDot::new_int8`]), and the kernel of four inputs where there is
    /// one.
    Int8(int8::Q8Input, int8::Kernel, Option<int8::Kernel4>),
    /// `x` rounded to 16 bits and the integer kernel over it
    /// ([`RowDot::new_int16`]), and its copy for four inputs where there is
    /// one.
    Int16(int8::Q16Input, int8::Kernel16, Option<int8::Kernel16x4>),
}

/// Elements per precomputed sum of `x` for each kernel (0: none needed).
fn sum_group(t: GgmlType) -> usize {
    match t {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => 32,
        GgmlType::Q4_K | GgmlType::Q5_K => 32,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K => 16,
        GgmlType::Q1_0 => 128,
        _ => 0,
    }
}

impl<'a> RowDot<'a> {
    /// Prepares for rows of `dtype` dotted with `x`.
    pub fn new(dtype: GgmlType, x: &'a [f32]) -> Self {
        let path = match kernel(dtype) {
            Some(k) => {
                let g = sum_group(dtype);
                let sums = if g > 0 && x.len().is_multiple_of(g) {
                    x.chunks_exact(g).map(|c| c.iter().sum()).collect()
                } else {
                    Vec::new()
                };
                Path::F32(k, sums)
            }
            None => Path::Reference,
        };
        RowDot {
            dtype,
            x,
            row_bytes: dtype.row_bytes(x.len()),
            path,
        }
    }

    /// As [`RowDot::new`], but with `x` rounded to 8-bit levels in blocks
    /// of 32 for the types that have an integer kernel (Q4_0, Q4_1, Q8_0;
    /// see [`int8`]); other types, and inputs that are not whole blocks,
    /// stay exact.
    pub fn new_int8(dtype: GgmlType, x: &'a [f32]) -> Self {
        match int8::variants(dtype).pop() {
            Some(k) if x.len().is_multiple_of(32) => RowDot {
                dtype,
                x,
                row_bytes: dtype.row_bytes(x.len()),
                path: Path::Int8(int8::Q8Input::new(x), k, int8::variants4(dtype).pop()),
            },
            _ => RowDot::new(dtype, x),
        }
    }

    /// As [`RowDot::new_int8`] with 16-bit levels, for Q8_0 rows (see
    /// [`int8::Q16Input`]); other types, and inputs that are not whole
    /// blocks, stay exact.
    pub fn new_int16(dtype: GgmlType, x: &'a [f32]) -> Self {
        match int8::variants16(dtype).pop() {
            Some((k, k4)) if x.len().is_multiple_of(32) => RowDot {
                dtype,
                x,
                row_bytes: dtype.row_bytes(x.len()),
                path: Path::Int16(int8::Q16Input::new(x), k, k4),
            },
            _ => RowDot::new(dtype, x),
        }
    }

    /// The dot product of `row` (`dtype`, `x.len()` elements) with `x`.
    pub fn dot(&self, row: &[u8]) -> f32 {
        match &self.path {
            Path::Reference => super::dot_row(self.dtype, row, self.x),
            Path::F32(k, sums) => {
                self.check_row(row);
                k(row, self.x, sums)
            }
            Path::Int8(q, k, _) => {
                self.check_row(row);
                let mut out = 0.0;
                k(row, q, std::slice::from_mut(&mut out));
                out
            }
            Path::Int16(q, k, _) => {
                self.check_row(row);
                k(row, q)
            }
        }
    }

    /// [`RowDot::dot`] of consecutive rows (`rows`, `out.len()` of them
    /// back to back) into `out`: each the same bits as `dot` of that row.
    pub fn dot_rows(&self, rows: &[u8], out: &mut [f32]) {
        let rb = self.row_bytes.unwrap_or(0);
        assert_eq!(
            rows.len(),
            rb * out.len(),
            "RowDot: {} bytes are not {} {} rows of {} elements",
            rows.len(),
            out.len(),
            self.dtype,
            self.x.len()
        );
        if rb == 0 {
            return out.iter_mut().for_each(|o| *o = 0.0);
        }
        match &self.path {
            Path::Reference => {
                for (o, r) in out.iter_mut().zip(rows.chunks_exact(rb)) {
                    *o = super::dot_row(self.dtype, r, self.x);
                }
            }
            Path::F32(k, sums) => {
                for (o, r) in out.iter_mut().zip(rows.chunks_exact(rb)) {
                    *o = k(r, self.x, sums);
                }
            }
            Path::Int8(q, k, _) => k(rows, q, out),
            Path::Int16(q, k, _) => {
                for (o, r) in out.iter_mut().zip(rows.chunks_exact(rb)) {
                    *o = k(r, q);
                }
            }
        }
    }

    /// [`RowDot::dot_rows`] of rows repacked by [`rows8::repack`]
    /// (`out.len()` of them, whole groups): 8- and 16-bit inputs through
    /// the repacked kernels, other paths a row at a time, gathered.
    pub fn dot_rows8(&self, packed: &[u8], out: &mut [f32]) {
        static BEST: std::sync::OnceLock<rows8::Kernel> = std::sync::OnceLock::new();
        static BEST16: std::sync::OnceLock<rows8::Kernel16> = std::sync::OnceLock::new();
        match &self.path {
            Path::Int8(q, ..) => BEST.get_or_init(|| *rows8::variants().last().expect("a copy"))(
                self.dtype, packed, q, out,
            ),
            Path::Int16(q, ..) => BEST16
                .get_or_init(|| *rows8::variants16().last().expect("a copy"))(
                self.dtype, packed, q, out,
            ),
            _ => {
                let rb = self.row_bytes.unwrap_or(0);
                let mut row = vec![0u8; rb];
                for (r, o) in out.iter_mut().enumerate() {
                    rows8::gather_row(self.dtype, packed, self.x.len() / 32, r, &mut row);
                    *o = self.dot(&row);
                }
            }
        }
    }

    /// The kernels read whole blocks unchecked: a row of the wrong size is a
    /// caller's bug.
    fn check_row(&self, row: &[u8]) {
        assert_eq!(
            self.row_bytes,
            Some(row.len()),
            "RowDot: a {} row of {} elements has the wrong size",
            self.dtype,
            self.x.len()
        );
    }
}

/// Inputs dotted with the same rows (a batch's decode rows): each row's
/// products with every input, each the same bits as that input's
/// [`RowDot::dot`]. Int8 and int16 inputs go four at a time through one
/// kernel, which unpacks a row's blocks once for the four; their scales
/// (and sums) are interleaved once here for all the rows ([`int8::Four`]).
pub struct ManyDots<'a> {
    dots: Vec<RowDot<'a>>,
    /// Group i's (inputs 4 i .. 4 i + 4) interleaved scales, where the
    /// four share a four-input kernel; the groups after the first without
    /// one, and the inputs past the last group, go one at a time.
    fours: Vec<int8::Four>,
}

/// Four inputs that share a four-input kernel, and that kernel.
enum Group<'r> {
    Int8([&'r int8::Q8Input; 4], int8::Kernel4),
    Int16([&'r int8::Q16Input; 4], int8::Kernel16x4),
}

/// The kernel `four` (four inputs) share, if it has one.
fn group_of<'r>(four: &'r [RowDot]) -> Option<Group<'r>> {
    match [0, 1, 2, 3].map(|j| &four[j].path) {
        [Path::Int8(a, _, Some(k4)), Path::Int8(b, ..), Path::Int8(c, ..), Path::Int8(d, ..)] => {
            Some(Group::Int8([a, b, c, d], *k4))
        }
        [Path::Int16(a, _, Some(k4)), Path::Int16(b, ..), Path::Int16(c, ..), Path::Int16(d, ..)] => {
            Some(Group::Int16([a, b, c, d], *k4))
        }
        _ => None,
    }
}

impl<'a> ManyDots<'a> {
    pub fn new(dots: Vec<RowDot<'a>>) -> Self {
        let fours = dots
            .chunks_exact(4)
            .map_while(group_of)
            .map(|g| match g {
                Group::Int8(xs, _) => int8::Four::of_q8(xs),
                Group::Int16(xs, _) => int8::Four::of_q16(xs),
            })
            .collect();
        ManyDots { dots, fours }
    }

    pub fn len(&self) -> usize {
        self.dots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dots.is_empty()
    }

    /// The products of repacked rows (`rows8`, whole groups) with every
    /// input into `out` ([rows, inputs]), each with the bits a single
    /// input gets from [`RowDot::dot_rows8`]: int8 inputs together through
    /// the many-input kernel (a group's blocks unpacked once for several
    /// inputs), others one at a time.
    pub fn dot_rows8(&self, packed: &[u8], out: &mut [f32]) {
        let m = self.dots.len();
        let n = out.len() / m.max(1);
        assert_eq!(n * m, out.len(), "ManyDots: one output per row and input");
        let int8: Vec<&int8::Q8Input> = self
            .dots
            .iter()
            .filter_map(|d| match &d.path {
                Path::Int8(q, ..) => Some(q),
                _ => None,
            })
            .collect();
        if m > 1 && int8.len() == m {
            static BEST: std::sync::OnceLock<rows8::KernelMany> = std::sync::OnceLock::new();
            let k = BEST.get_or_init(|| *rows8::variants_many().last().expect("a copy"));
            return k(self.dots[0].dtype, packed, &int8, out);
        }
        let mut col = vec![0.0f32; n];
        for (j, d) in self.dots.iter().enumerate() {
            d.dot_rows8(packed, &mut col);
            for (o, &c) in out.iter_mut().skip(j).step_by(m).zip(&col) {
                *o = c;
            }
        }
    }

    /// The products of `row` with every input into `out`.
    pub fn dot_row(&self, row: &[u8], out: &mut [f32]) {
        assert_eq!(self.dots.len(), out.len(), "ManyDots: one output per input");
        for (g, four) in self.fours.iter().enumerate() {
            let dots = &self.dots[4 * g..4 * g + 4];
            dots.iter().for_each(|d| d.check_row(row));
            out[4 * g..4 * g + 4].copy_from_slice(&match group_of(dots) {
                Some(Group::Int8(xs, k4)) => k4(dots[0].dtype, row, xs, four),
                Some(Group::Int16(xs, k4)) => k4(row, xs, four),
                None => unreachable!("ManyDots: a group of four without its kernel"),
            });
        }
        let done = 4 * self.fours.len();
        for (d, o) in self.dots[done..].iter().zip(&mut out[done..]) {
            d.dot_rows(row, std::slice::from_mut(o));
        }
    }
}

/// Compiles a generic kernel body for the baseline target and for AVX2;
/// `variants` returns the copies this CPU can run, best last. A type may also
/// name a hand-written AVX2 + FMA kernel from [`avx2`], which comes last.
macro_rules! kernels {
    ($($t:ident => $body:ident $(+ $explicit:ident)?),* $(,)?) => {
        fn variants(t: GgmlType) -> Vec<Kernel> {
            match t {
                $(GgmlType::$t => {
                    fn portable(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
                        $body(bytemuck::cast_slice(row), x, sums)
                    }
                    #[allow(unused_mut)]
                    let mut v: Vec<Kernel> = vec![portable];
                    #[cfg(target_arch = "x86_64")]
                    {
                        #[target_feature(enable = "avx2")]
                        unsafe fn avx2_inner(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
                            $body(bytemuck::cast_slice(row), x, sums)
                        }
                        fn auto_avx2(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
                            // SAFETY: listed only when the CPU reports AVX2.
                            unsafe { avx2_inner(row, x, sums) }
                        }
                        if std::arch::is_x86_feature_detected!("avx2") {
                            v.push(auto_avx2);
                        }
                        $(
                            fn explicit(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
                                // SAFETY: listed only when the CPU reports AVX2
                                // and FMA; RowDot checked the row size and
                                // computed the sums for this type.
                                unsafe { avx2::$explicit(row, x, sums) }
                            }
                            if std::arch::is_x86_feature_detected!("avx2")
                                && std::arch::is_x86_feature_detected!("fma")
                            {
                                v.push(explicit);
                            }
                        )?
                    }
                    v
                })*
                _ => Vec::new(),
            }
        }
    };
}

/// The best kernel this CPU runs for `t`, if there is one.
fn kernel(t: GgmlType) -> Option<Kernel> {
    variants(t).pop()
}

kernels! {
    F16 => f16,
    BF16 => bf16,
    Q4_0 => q4_0 + q4_0,
    Q4_1 => q4_1 + q4_1,
    Q5_0 => q5_0 + q5_0,
    Q5_1 => q5_1 + q5_1,
    Q8_0 => q8_0 + q8_0,
    Q1_0 => q1_0,
    Q2_K => q2_k,
    Q3_K => q3_k,
    Q4_K => q4_k + q4_k,
    Q5_K => q5_k + q5_k,
    Q6_K => q6_k + q6_k,
}

type TileKernel = fn(&[f32], &[f32], usize, &mut [f32]);

fn tile_variants() -> Vec<TileKernel> {
    fn portable(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
        dot_tile_body(x, w, k, out)
    }
    #[allow(unused_mut)]
    let mut v: Vec<TileKernel> = vec![portable];
    #[cfg(target_arch = "x86_64")]
    {
        fn avx2_fma(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
            // SAFETY: listed only when the CPU reports AVX2 and FMA.
            unsafe { avx2::dot_tile(x, w, k, out) }
        }
        fn avx512vl(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
            // SAFETY: listed only when the CPU reports AVX-512F/VL besides
            // AVX2 and FMA.
            unsafe { avx2::dot_tile_avx512vl(x, w, k, out) }
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            v.push(avx2_fma);
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                v.push(avx512vl);
            }
        }
    }
    v
}

/// Every dot product of a row of `x` (`[m, k]`) with a row of `w`
/// (`[nr, k]`): `out[t * m + i] = x_i . w_t`. Four weight rows share each
/// pass over an input row, each summed in 8 lanes (with fused multiply-adds
/// on CPUs that have them); the matrix product uses it on dequantised tiles
/// of weight rows.
pub fn dot_tile(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    static KERNEL: std::sync::OnceLock<TileKernel> = std::sync::OnceLock::new();
    assert!(
        k > 0 && x.len().is_multiple_of(k) && w.len().is_multiple_of(k),
        "dot_tile: rows of {k}"
    );
    assert_eq!(
        out.len(),
        x.len() / k * (w.len() / k),
        "dot_tile: out is not [nr, m]"
    );
    let kernel = KERNEL.get_or_init(|| tile_variants().pop().expect("portable kernel"));
    kernel(x, w, k, out)
}

#[inline(always)]
fn dot_tile_body(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    let m = x.len() / k;
    let nr = w.len() / k;
    let full = k - k % 8;
    for (i, xr) in x.chunks_exact(k).enumerate() {
        let mut t = 0;
        while t + 4 <= nr {
            let wr = |r: usize| &w[(t + r) * k..(t + r + 1) * k];
            let (w0, w1, w2, w3) = (wr(0), wr(1), wr(2), wr(3));
            let (mut a0, mut a1, mut a2, mut a3) =
                ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
            for ((((xv, v0), v1), v2), v3) in xr
                .chunks_exact(8)
                .zip(w0.chunks_exact(8))
                .zip(w1.chunks_exact(8))
                .zip(w2.chunks_exact(8))
                .zip(w3.chunks_exact(8))
            {
                for l in 0..8 {
                    a0[l] += xv[l] * v0[l];
                    a1[l] += xv[l] * v1[l];
                    a2[l] += xv[l] * v2[l];
                    a3[l] += xv[l] * v3[l];
                }
            }
            for (r, (a, wv)) in [a0, a1, a2, a3].iter().zip([w0, w1, w2, w3]).enumerate() {
                let mut tail = 0.0f32;
                for j in full..k {
                    tail += xr[j] * wv[j];
                }
                out[(t + r) * m + i] = sum_lanes(a) + tail;
            }
            t += 4;
        }
        for t in t..nr {
            let wv = &w[t * k..(t + 1) * k];
            let mut acc = [0.0f32; 8];
            for j in (0..full).step_by(8) {
                for l in 0..8 {
                    acc[l] += xr[j + l] * wv[j + l];
                }
            }
            let mut tail = 0.0f32;
            for j in full..k {
                tail += xr[j] * wv[j];
            }
            out[t * m + i] = sum_lanes(&acc) + tail;
        }
    }
}

/// Weight rows (columns of the product) in a packed panel ([`pack_panel`],
/// [`panel_product`]).
pub const PANEL: usize = 32;

/// Packs `rows` ([nr, k], nr <= [`PANEL`]) into `panel` ([k, PANEL]):
/// element j of row c goes to `panel[j * PANEL + c]`, and the columns past
/// nr are zeros.
pub fn pack_panel(rows: &[f32], k: usize, panel: &mut [f32]) {
    assert!(
        k > 0 && rows.len().is_multiple_of(k) && rows.len() / k <= PANEL,
        "pack_panel: not [<= {PANEL}, {k}]"
    );
    assert_eq!(
        panel.len(),
        k * PANEL,
        "pack_panel: panel is not [{k}, {PANEL}]"
    );
    let nr = rows.len() / k;
    if nr < PANEL {
        panel.fill(0.0);
    }
    // Eight rows at a time, so each pass writes whole 32-byte runs.
    let mut c = 0;
    while c + 8 <= nr {
        let r: [&[f32]; 8] = std::array::from_fn(|q| &rows[(c + q) * k..(c + q + 1) * k]);
        for (j, dst) in panel.chunks_exact_mut(PANEL).enumerate() {
            for q in 0..8 {
                dst[c + q] = r[q][j];
            }
        }
        c += 8;
    }
    for c in c..nr {
        for (j, &v) in rows[c * k..(c + 1) * k].iter().enumerate() {
            panel[j * PANEL + c] = v;
        }
    }
}

type PanelKernel = fn(&[f32], usize, &[f32], &mut [f32]);

fn panel_variants() -> Vec<PanelKernel> {
    #[allow(unused_mut)]
    let mut v: Vec<PanelKernel> = vec![panel_product_body];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") {
            // SAFETY: listed only when the CPU reports AVX2 and FMA.
            v.push(|x, k, p, o| unsafe { avx2::panel_product(x, k, p, o) });
            if has!("avx512f") {
                // SAFETY: and AVX-512F.
                v.push(|x, k, p, o| unsafe { avx2::panel_product_avx512(x, k, p, o) });
            }
        }
    }
    v
}

/// The product of the rows of `x` ([m, k]) with a packed panel
/// ([`pack_panel`], [k, PANEL]) -> out: [m, PANEL]; `out[i * PANEL + c]` is
/// x_i . w_c summed as one chain of fused multiply-adds in order of j, so
/// every copy (portable, AVX2, AVX-512) gives the same bits, and an output
/// does not depend on the other rows or columns computed with it. The SIMD
/// copies hold a block of rows by the whole panel in registers and
/// broadcast one input value a step, so each loaded weight feeds several
/// rows: the matrix product's prefill kernel.
pub fn panel_product(x: &[f32], k: usize, panel: &[f32], out: &mut [f32]) {
    static KERNEL: std::sync::OnceLock<PanelKernel> = std::sync::OnceLock::new();
    assert!(
        k > 0 && x.len().is_multiple_of(k),
        "panel_product: rows of {k}"
    );
    assert_eq!(
        panel.len(),
        k * PANEL,
        "panel_product: panel is not [{k}, {PANEL}]"
    );
    assert_eq!(
        out.len(),
        x.len() / k * PANEL,
        "panel_product: out is not [m, {PANEL}]"
    );
    let kernel = KERNEL.get_or_init(|| panel_variants().pop().expect("portable kernel"));
    kernel(x, k, panel, out)
}

fn panel_product_body(x: &[f32], k: usize, panel: &[f32], out: &mut [f32]) {
    for (xr, o) in x.chunks_exact(k).zip(out.chunks_exact_mut(PANEL)) {
        let mut acc = [0.0f32; PANEL];
        for (&xv, p) in xr.iter().zip(panel.chunks_exact(PANEL)) {
            for (a, &pv) in acc.iter_mut().zip(p) {
                *a = xv.mul_add(pv, *a);
            }
        }
        o.copy_from_slice(&acc);
    }
}

#[inline(always)]
fn sum_lanes<const N: usize>(acc: &[f32; N]) -> f32 {
    acc.iter().sum()
}

/// A block's f16 scale as f32 (see [`f16_bits_to_f32`]).
#[inline(always)]
fn f16_to_f32(b: [u8; 2]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes(b))
}

/// An f16 as f32, exactly, without branches (so that loops over it
/// vectorise): the exponent is rebased by multiplying by 2^112, which is
/// exact for normals and subnormals; infinities and NaNs keep all ones.
#[inline(always)]
fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let em = h & 0x7fff;
    let finite = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000); // 2^112
    let v = if em >= 0x7c00 {
        f32::from_bits((em << 13) | 0x7f80_0000)
    } else {
        finite
    };
    f32::from_bits(v.to_bits() | ((h & 0x8000) << 16))
}

#[inline(always)]
fn f16(row: &[[u8; 2]], x: &[f32], _sums: &[f32]) -> f32 {
    lanes16(row, x, |b| f16_bits_to_f32(u16::from_le_bytes(b)))
}

#[inline(always)]
fn bf16(row: &[[u8; 2]], x: &[f32], _sums: &[f32]) -> f32 {
    lanes16(row, x, |b| {
        f32::from_bits((u16::from_le_bytes(b) as u32) << 16)
    })
}

/// sum w x over 16 lanes, for element types converted one by one.
#[inline(always)]
fn lanes16(row: &[[u8; 2]], x: &[f32], to_f32: impl Fn([u8; 2]) -> f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let (rc, xc) = (row.chunks_exact(16), x.chunks_exact(16));
    let (rr, xr) = (rc.remainder(), xc.remainder());
    for (r, xs) in rc.zip(xc) {
        for j in 0..16 {
            acc[j] += to_f32(r[j]) * xs[j];
        }
    }
    let mut tail = 0.0f32;
    for (&r, &v) in rr.iter().zip(xr) {
        tail += to_f32(r) * v;
    }
    sum_lanes(&acc) + tail
}

#[inline(always)]
fn block32(x: &[f32]) -> &[f32; 32] {
    x.try_into().expect("32 values")
}

/// sum d * (q - 8) x = sum d q x - 8 sum d (sum x).
#[inline(always)]
fn q4_0(blocks: &[BlockQ4_0], x: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    let mut offset = 0.0f32;
    for ((b, xs), &s) in blocks.iter().zip(x.chunks_exact(32)).zip(sums) {
        let d = f16_to_f32(b.d);
        let xs = block32(xs);
        for j in 0..16 {
            acc[j] += d * ((b.qs[j] & 0x0F) as f32 * xs[j]);
            acc[j + 16] += d * ((b.qs[j] >> 4) as f32 * xs[j + 16]);
        }
        offset += d * s;
    }
    sum_lanes(&acc) - 8.0 * offset
}

/// sum (d q + m) x = sum d q x + sum m (sum x).
#[inline(always)]
fn q4_1(blocks: &[BlockQ4_1], x: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    let mut offset = 0.0f32;
    for ((b, xs), &s) in blocks.iter().zip(x.chunks_exact(32)).zip(sums) {
        let d = f16_to_f32(b.d);
        let xs = block32(xs);
        for j in 0..16 {
            acc[j] += d * ((b.qs[j] & 0x0F) as f32 * xs[j]);
            acc[j + 16] += d * ((b.qs[j] >> 4) as f32 * xs[j + 16]);
        }
        offset += f16_to_f32(b.m) * s;
    }
    sum_lanes(&acc) + offset
}

/// The 5-bit levels of a Q5 block: low nibbles from `qs`, bit 4 from `qh`.
#[inline(always)]
fn q5_levels(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) << 4) as u8);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) << 4) as u8);
    }
    q
}

#[inline(always)]
fn q5_0(blocks: &[BlockQ5_0], x: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    let mut offset = 0.0f32;
    for ((b, xs), &s) in blocks.iter().zip(x.chunks_exact(32)).zip(sums) {
        let d = f16_to_f32(b.d);
        let q = q5_levels(&b.qs, b.qh);
        let xs = block32(xs);
        for j in 0..32 {
            acc[j] += d * (q[j] as f32 * xs[j]);
        }
        offset += d * s;
    }
    sum_lanes(&acc) - 16.0 * offset
}

#[inline(always)]
fn q5_1(blocks: &[BlockQ5_1], x: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    let mut offset = 0.0f32;
    for ((b, xs), &s) in blocks.iter().zip(x.chunks_exact(32)).zip(sums) {
        let d = f16_to_f32(b.d);
        let q = q5_levels(&b.qs, b.qh);
        let xs = block32(xs);
        for j in 0..32 {
            acc[j] += d * (q[j] as f32 * xs[j]);
        }
        offset += f16_to_f32(b.m) * s;
    }
    sum_lanes(&acc) + offset
}

#[inline(always)]
fn q8_0(blocks: &[BlockQ8_0], x: &[f32], _sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    for (b, xs) in blocks.iter().zip(x.chunks_exact(32)) {
        let d = f16_to_f32(b.d);
        let xs = block32(xs);
        for j in 0..32 {
            acc[j] += d * ((b.qs[j] as i8) as f32 * xs[j]);
        }
    }
    sum_lanes(&acc)
}

/// Bit `i` of byte `b` as 0.0 or 1.0, for every byte: expanding a Q1_0
/// sign byte is one table load.
static BITS: [[f32; 8]; 256] = {
    let mut t = [[0.0f32; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            t[b][i] = ((b >> i) & 1) as f32;
            i += 1;
        }
        b += 1;
    }
    t
};

/// sum d (2 bit - 1) x = 2 sum d (bit x) - sum d (sum x).
#[inline(always)]
fn q1_0(blocks: &[BlockQ1_0], x: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    let mut offset = 0.0f32;
    for ((b, xs), &s) in blocks.iter().zip(x.chunks_exact(128)).zip(sums) {
        let d = f16_to_f32(b.d);
        for (c, xc) in xs.chunks_exact(32).enumerate() {
            let xc = block32(xc);
            for byte in 0..4 {
                let bits = &BITS[b.qs[4 * c + byte] as usize];
                for i in 0..8 {
                    acc[8 * byte + i] += d * (bits[i] * xc[8 * byte + i]);
                }
            }
        }
        offset += d * s;
    }
    2.0 * sum_lanes(&acc) - offset
}

/// Per 16-element group g (scale byte `sc`): sum (d (sc & 15) q - dmin (sc >> 4)) x,
/// with 2-bit levels laid out as in `q2_k::dequantize_block`.
#[inline(always)]
fn q2_k(blocks: &[BlockQ2K], x: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut offset = 0.0f32;
    for ((b, xs), ss) in blocks
        .iter()
        .zip(x.chunks_exact(QK_K))
        .zip(sums.chunks_exact(16))
    {
        let d = f16_to_f32(b.d);
        let dmin = f16_to_f32(b.dmin);
        for g in 0..16 {
            offset += dmin * (b.scales[g] >> 4) as f32 * ss[g];
        }
        for n in 0..2 {
            let q = &b.qs[32 * n..32 * n + 32];
            for j in 0..4 {
                for half in 0..2 {
                    let g = 8 * n + 2 * j + half;
                    let dl = d * (b.scales[g] & 0xF) as f32;
                    let xg = &xs[16 * g..16 * g + 16];
                    for l in 0..16 {
                        acc[l] += dl * (((q[16 * half + l] >> (2 * j)) & 3) as f32 * xg[l]);
                    }
                }
            }
        }
    }
    sum_lanes(&acc) - offset
}

/// Per 16-element group g: sum d (sc_g - 32) (q - 4) x with 3-bit levels q
/// (two bits in `qs`, the third in `hmask`, as in `q3_k::dequantize_block`).
#[inline(always)]
fn q3_k(blocks: &[BlockQ3K], x: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut offset = 0.0f32;
    for ((b, xs), ss) in blocks
        .iter()
        .zip(x.chunks_exact(QK_K))
        .zip(sums.chunks_exact(16))
    {
        let d = f16_to_f32(b.d);
        let mut dl = [0.0f32; 16];
        for g in 0..16 {
            dl[g] = d * q3_k::scale(&b.scales, g) as f32;
            offset += dl[g] * ss[g];
        }
        for n in 0..2 {
            let q = &b.qs[32 * n..32 * n + 32];
            for j in 0..4 {
                let m = 1u8 << (4 * n + j);
                for half in 0..2 {
                    let g = 8 * n + 2 * j + half;
                    let xg = &xs[16 * g..16 * g + 16];
                    for l in 0..16 {
                        let i = 16 * half + l;
                        let high = if b.hmask[i] & m != 0 { 4 } else { 0 };
                        let level = ((q[i] >> (2 * j)) & 3) + high;
                        acc[l] += dl[g] * (level as f32 * xg[l]);
                    }
                }
            }
        }
    }
    sum_lanes(&acc) - 4.0 * offset
}

/// The fields of a Q4_K or Q5_K super-block: sub-blocks `2k` and `2k + 1`
/// are the low and high nibbles of `qs[32k..32k + 32]`, plus (Q5_K) bits `2k`
/// and `2k + 1` of `qh` as bit 4.
struct KBlock<'a> {
    d: f32,
    dmin: f32,
    scales: &'a [u8; 12],
    qs: &'a [u8; QK_K / 2],
    qh: Option<&'a [u8; QK_K / 8]>,
}

impl<'a> KBlock<'a> {
    #[inline(always)]
    fn q4_k(b: &'a BlockQ4K) -> Self {
        KBlock {
            d: f16_to_f32(b.d),
            dmin: f16_to_f32(b.dmin),
            scales: &b.scales,
            qs: &b.qs,
            qh: None,
        }
    }

    #[inline(always)]
    fn q5_k(b: &'a BlockQ5K) -> Self {
        KBlock {
            d: f16_to_f32(b.d),
            dmin: f16_to_f32(b.dmin),
            scales: &b.scales,
            qs: &b.qs,
            qh: Some(&b.qh),
        }
    }
}

/// Per 32-element sub-block j: sum (d sc_j q - dmin m_j) x, over the
/// super-blocks `blocks` yields.
#[inline(always)]
fn k_quant<'a>(blocks: impl Iterator<Item = KBlock<'a>>, x: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    let mut offset = 0.0f32;
    for ((b, xs), ss) in blocks.zip(x.chunks_exact(QK_K)).zip(sums.chunks_exact(8)) {
        for k in 0..4 {
            let (sc1, m1) = get_scale_min_k4(2 * k, b.scales);
            let (sc2, m2) = get_scale_min_k4(2 * k + 1, b.scales);
            let (d1, d2) = (b.d * sc1 as f32, b.d * sc2 as f32);
            let q = &b.qs[32 * k..32 * k + 32];
            let high = |l: usize, bit: usize| b.qh.map_or(0, |h| ((h[l] >> bit) & 1) << 4);
            let lo = block32(&xs[64 * k..64 * k + 32]);
            let hi = block32(&xs[64 * k + 32..64 * k + 64]);
            for l in 0..32 {
                acc[l] += d1 * (((q[l] & 0x0F) | high(l, 2 * k)) as f32 * lo[l]);
            }
            for l in 0..32 {
                acc[l] += d2 * (((q[l] >> 4) | high(l, 2 * k + 1)) as f32 * hi[l]);
            }
            offset += b.dmin * (m1 as f32 * ss[2 * k] + m2 as f32 * ss[2 * k + 1]);
        }
    }
    sum_lanes(&acc) - offset
}

#[inline(always)]
fn q4_k(blocks: &[BlockQ4K], x: &[f32], sums: &[f32]) -> f32 {
    k_quant(blocks.iter().map(KBlock::q4_k), x, sums)
}

#[inline(always)]
fn q5_k(blocks: &[BlockQ5K], x: &[f32], sums: &[f32]) -> f32 {
    k_quant(blocks.iter().map(KBlock::q5_k), x, sums)
}

/// Per 16-element group g: sum d sc_g (q - 32) x.
#[inline(always)]
fn q6_k(blocks: &[BlockQ6K], x: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
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
            let ql = &b.ql[64 * h..64 * h + 64];
            let qh = &b.qh[32 * h..32 * h + 32];
            let xh = &xs[128 * h..128 * h + 128];
            let g = 8 * h;
            for l in 0..32 {
                let is = l / 16;
                let q1 = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                let q2 = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                let q3 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                let q4 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                acc[l] += ds[g + is] * (q1 as f32 * xh[l])
                    + ds[g + is + 2] * (q2 as f32 * xh[l + 32])
                    + ds[g + is + 4] * (q3 as f32 * xh[l + 64])
                    + ds[g + is + 6] * (q4 as f32 * xh[l + 96]);
            }
        }
    }
    sum_lanes(&acc) - 32.0 * offset
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_row, quantize_row};
    use crate::util::rng::Rng;

    /// Every type, on quantised data and on random blocks, against the
    /// reference dot product, with rows of one super-block and of sixteen.
    /// Only the order of f32 operations differs: measured gaps are at most
    /// 1.4e-7 of sum |w x| (Q4_0; ~1e-7 for the others), the bound is 2e-6,
    /// while one wrong level in a 4096-element row moves the sum by more
    /// than 5e-6 of it even for Q8_0.
    #[test]
    fn f16_conversion_is_exact_for_every_value() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_bits_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn fast_kernels_match_the_reference() {
        let mut rng = Rng::new(17);
        for t in GgmlType::ALL {
            for k in [256, 4096] {
                for case in 0..4 {
                    let x = rng.vec(k, -1.0, 1.0);
                    let row: Vec<u8> = if case < 3 {
                        let scale = [1.0, 1e-3, 30.0][case];
                        let w: Vec<f32> = (0..k).map(|_| rng.normal() * scale).collect();
                        let mut q = vec![0u8; t.row_bytes(k).unwrap()];
                        quantize_row(t, &w, &mut q);
                        q
                    } else {
                        random_row(t, k, &mut rng)
                    };
                    let mut w = vec![0.0f32; k];
                    dequantize_row(t, &row, &mut w);
                    let want = super::super::dot_row(t, &row, &x);
                    let mag: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
                    let mut dot = RowDot::new(t, &x);
                    // Every compiled copy (portable, AVX2), not just the one
                    // this CPU would pick.
                    for (v, kern) in variants(t).into_iter().enumerate() {
                        match &mut dot.path {
                            Path::F32(k, _) => *k = kern,
                            _ => panic!("{t}: RowDot did not pick an f32 kernel"),
                        }
                        let got = dot.dot(&row);
                        assert!(
                            (got - want).abs() <= 2e-6 * mag,
                            "{t} k {k} case {case} variant {v}: fast {got} vs reference \
                             {want} (sum |wx| {mag})"
                        );
                    }
                }
            }
        }
    }

    /// The SIMD copies of the tile kernel differ only in how many rows
    /// share a step; each sum is the same chain of operations, so their
    /// results are bit-equal (row counts that leave remainders at both
    /// edges included).
    /// Every copy of the panel product (portable, AVX2, AVX-512) gives the
    /// same bits, row by row as for all rows at once; each output is within
    /// f32 rounding of the f64 dot product, and packed columns past the
    /// rows given are zeros.
    #[test]
    fn panel_product_copies_agree_bit_for_bit() {
        let mut rng = Rng::new(10);
        for (m, nr, k) in [
            (1, 1, 1),
            (7, 32, 33),
            (13, 5, 260),
            (6, 32, 576),
            (2, 31, 1025),
        ] {
            let x = rng.vec(m * k, -1.0, 1.0);
            let rows = rng.vec(nr * k, -1.0, 1.0);
            let mut panel = vec![f32::NAN; k * PANEL];
            pack_panel(&rows, k, &mut panel);
            let run = |kern: PanelKernel, x: &[f32]| {
                let mut out = vec![f32::NAN; x.len() / k * PANEL];
                kern(x, k, &panel, &mut out);
                out
            };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let want = run(panel_product_body, &x);
            for (i, o) in want.chunks_exact(PANEL).enumerate() {
                for (c, &got) in o.iter().enumerate() {
                    if c >= nr {
                        assert_eq!(got.to_bits(), 0, "{m}x{nr}x{k}: padding column {c}");
                        continue;
                    }
                    let (xr, wr) = (&x[i * k..(i + 1) * k], &rows[c * k..(c + 1) * k]);
                    let dot: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mag: f64 = xr.iter().zip(wr).map(|(a, b)| (*a * *b).abs() as f64).sum();
                    assert!(
                        (got as f64 - dot).abs() <= 1e-6 * mag * (k as f64).sqrt() + 1e-30,
                        "{m}x{nr}x{k} [{i}, {c}]: {got} vs {dot}"
                    );
                }
            }
            for (v, kern) in panel_variants().into_iter().enumerate() {
                assert_eq!(
                    bits(&run(kern, &x)),
                    bits(&want),
                    "{m}x{nr}x{k} variant {v}"
                );
                for (i, xr) in x.chunks_exact(k).enumerate() {
                    let alone = run(kern, xr);
                    assert_eq!(
                        bits(&alone),
                        bits(&want[i * PANEL..(i + 1) * PANEL]),
                        "{m}x{nr}x{k} variant {v} row {i} alone"
                    );
                }
            }
        }
    }

    #[test]
    fn dot_tile_simd_copies_are_bit_equal() {
        let mut rng = Rng::new(9);
        for (m, nr, k) in [(4, 4, 8), (7, 13, 576), (9, 16, 100), (128, 16, 64)] {
            let x = rng.vec(m * k, -1.0, 1.0);
            let w = rng.vec(nr * k, -1.0, 1.0);
            let outs: Vec<Vec<u32>> = tile_variants()
                .into_iter()
                .skip(1)
                .map(|kern| {
                    let mut out = vec![f32::NAN; m * nr];
                    kern(&x, &w, k, &mut out);
                    out.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            for o in &outs {
                assert_eq!(o, &outs[0], "{m}x{nr}x{k}");
            }
        }
    }

    #[test]
    fn dot_tile_matches_cpu_dot() {
        let mut rng = Rng::new(8);
        for (m, nr, k) in [
            (1, 1, 1),
            (3, 4, 8),
            (5, 7, 37),
            (2, 9, 576),
            (4, 16, 100),
            (9, 18, 64),
        ] {
            let x = rng.vec(m * k, -1.0, 1.0);
            let w = rng.vec(nr * k, -1.0, 1.0);
            for kern in tile_variants() {
                let mut out = vec![f32::NAN; m * nr];
                kern(&x, &w, k, &mut out);
                for i in 0..m {
                    for t in 0..nr {
                        let want = crate::cpu::dot(&x[i * k..(i + 1) * k], &w[t * k..(t + 1) * k]);
                        let got = out[t * m + i];
                        // Same 8-lane sums except the tail: a few ulps of k.
                        assert!(
                            (got - want).abs() <= 1e-6 * k as f32,
                            "{m}x{nr}x{k}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// Float rows whose length is not a multiple of the 16 lanes.
    #[test]
    fn float_kernels_handle_a_tail() {
        let mut rng = Rng::new(4);
        for t in [GgmlType::F16, GgmlType::BF16] {
            let k = 37;
            let (w, x) = (rng.vec(k, -2.0, 2.0), rng.vec(k, -1.0, 1.0));
            let mut row = vec![0u8; 2 * k];
            quantize_row(t, &w, &mut row);
            let want = super::super::dot_row(t, &row, &x);
            let mut dot = RowDot::new(t, &x);
            for kern in variants(t) {
                match &mut dot.path {
                    Path::F32(k, _) => *k = kern,
                    _ => panic!("{t}: RowDot did not pick an f32 kernel"),
                }
                assert!((dot.dot(&row) - want).abs() <= 1e-5, "{t}");
            }
        }
    }

    /// Random bytes with every f16 scale replaced by a sane value.
    fn random_row(t: GgmlType, k: usize, rng: &mut Rng) -> Vec<u8> {
        let mut row: Vec<u8> = (0..t.row_bytes(k).unwrap())
            .map(|_| rng.next_u64() as u8)
            .collect();
        let scale_offsets: &[usize] = match t {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                let w = rng.vec(k, -2.0, 2.0);
                quantize_row(t, &w, &mut row);
                return row;
            }
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q1_0 => &[0],
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
            GgmlType::Q6_K => &[208],
        };
        for block in row.chunks_exact_mut(t.block_bytes()) {
            for &o in scale_offsets {
                let d = half::f16::from_f32(rng.uniform(-0.1, 0.1));
                block[o..o + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
        row
    }
}
