//! Activations and softmax.

/// silu(x) = x * sigmoid(x)
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Exact GELU, 0.5 x (1 + erf(x / sqrt 2)) (PyTorch's default, BERT, Whisper).
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// Exact-form GELU through an f32 erf approximation (the one the GPU kernels
/// use, see `shaders/erf.wgsl`): at most ~2e-7 absolute error in erf, and
/// several times faster than [`gelu`], which stays the oracle.
pub fn gelu_fast(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_fast(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// erf in f32: x P(x^2) below 1 (a least-squares fit), Numerical Recipes'
/// erfc approximation (fractional error < 1.2e-7) above.
pub fn erf_fast(x: f32) -> f32 {
    let z = x.abs();
    if z < 1.0 {
        return x * erf_series(z * z);
    }
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = 1.0 - t * erfc_exponent(z, t).exp();
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// [`erf_fast`] below 1: erf(z) = z P(z^2), P of `u` = z^2 here.
#[inline(always)]
fn erf_series(u: f32) -> f32 {
    std::f32::consts::FRAC_2_SQRT_PI
        + u * (-0.376_126_26
            + u * (0.112_835_97
                + u * (-0.026_854_329
                    + u * (0.005_189_312_6 + u * (-0.000_801_885_9 + u * 0.000_078_825)))))
}

/// [`erf_fast`] from 1 on: erfc(z) = t exp(E) with t = 1 / (1 + z / 2);
/// this is E.
#[inline(always)]
fn erfc_exponent(z: f32, t: f32) -> f32 {
    let poly = 1.000_023_7
        + t * (0.374_091_96
            + t * (0.096_784_18
                + t * (-0.186_288_06
                    + t * (0.278_868_07
                        + t * (-1.135_204
                            + t * (1.488_515_9 + t * (-0.822_152_2 + t * 0.170_872_77)))))));
    -z * z - 1.265_512_2 + t * poly
}

/// [`gelu_fast`] over a whole buffer in place, in vectors: the same erf
/// approximation, with [`exp_poly`] for its exponential and both of its
/// branches computed lane by lane (libm's scalar exp and the branch kept
/// the encoder's GELU out of vector registers). Within a few ulps of
/// [`gelu_fast`].
pub fn gelu_fast_all(x: &mut [f32]) {
    use rayon::prelude::*;
    #[cfg(target_arch = "x86_64")]
    let fma =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    x.par_chunks_mut(1 << 14).for_each(|c| {
        #[cfg(target_arch = "x86_64")]
        if fma {
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            return unsafe { gelu_chunk_fma(c) };
        }
        c.iter_mut().for_each(|v| *v = gelu_lanes::<false>(*v));
    });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_chunk_fma(c: &mut [f32]) {
    c.iter_mut().for_each(|v| *v = gelu_lanes::<true>(*v));
}

/// [`gelu_fast`] without a call or a branch; FMA as in [`exp_poly`].
#[inline(always)]
fn gelu_lanes<const FMA: bool>(x: f32) -> f32 {
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let a = z.abs();
    let u = a * a;
    let near = z * erf_series(u);
    let t = 1.0 / (1.0 + 0.5 * a);
    let far = (1.0 - t * exp_poly::<FMA>(erfc_exponent(a, t))).copysign(z);
    let erf = if a < 1.0 { near } else { far };
    0.5 * x * (1.0 + erf)
}

/// GELU with the tanh approximation (PyTorch `approximate="tanh"`, Gemma).
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

/// erf in f64 internally (Abramowitz-Stegun 7.1.26 is too coarse for parity
/// at 1e-6; this uses the series / continued fraction split instead).
pub fn erf(x: f32) -> f32 {
    erf_f64(x as f64) as f32
}

fn erf_f64(x: f64) -> f64 {
    let ax = x.abs();
    let r = if ax < 2.5 {
        // Maclaurin series: erf(x) = 2/sqrt(pi) sum (-1)^n x^(2n+1) / (n! (2n+1))
        let mut term = ax;
        let mut sum = ax;
        let x2 = ax * ax;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // Continued fraction for erfc, converges fast for large |x|.
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        1.0 - (-ax * ax).exp() / (ax + f) / std::f64::consts::PI.sqrt()
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// relu(x) = max(x, 0)
pub fn relu(x: f32) -> f32 {
    x.max(0.0)
}

/// A pointwise activation as checkpoints name it (`hidden_act`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Exact erf GELU (`gelu`).
    Gelu,
    /// tanh-approximated GELU (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    Relu,
    /// x sigmoid(x) (`silu`, `swish`; NomicBERT's SwiGLU).
    Silu,
}

impl Activation {
    /// The activation a Hugging Face `hidden_act` string names, if supported.
    pub fn from_hf(name: &str) -> Option<Activation> {
        match name {
            "gelu" => Some(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            "silu" | "swish" | "swiglu" => Some(Activation::Silu),
            _ => None,
        }
    }

    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Gelu => gelu(x),
            Activation::GeluTanh => gelu_tanh(x),
            Activation::Relu => relu(x),
            Activation::Silu => silu(x),
        }
    }

    /// Applies the activation to every element of `x` in place.
    pub fn apply_all(self, x: &mut [f32]) {
        use rayon::prelude::*;
        x.par_iter_mut()
            .with_min_len(4096)
            .for_each(|v| *v = self.apply(*v));
    }

    /// As [`Activation::apply_all`], with [`gelu_fast`] for GELU: what the
    /// CPU backend runs (the exact form stays the oracle).
    pub fn apply_all_fast(self, x: &mut [f32]) {
        use rayon::prelude::*;
        let f = match self {
            Activation::Gelu => gelu_fast,
            other => return other.apply_all(x),
        };
        x.par_iter_mut().with_min_len(4096).for_each(|v| *v = f(*v));
    }
}

/// The gated feed-forward of encoders: gu: [n, 2 f] (activated half, then
/// linear half, per row) -> y: [n, f] = act(gu[.., ..f]) * gu[.., f..].
pub fn gated_act(gu: &[f32], f: usize, act: Activation, y: &mut [f32]) {
    assert_eq!(gu.len(), 2 * y.len(), "gated_act: gu is not [n, 2 f]");
    for (r, yr) in gu.chunks_exact(2 * f).zip(y.chunks_exact_mut(f)) {
        for i in 0..f {
            yr[i] = act.apply(r[i]) * r[f + i];
        }
    }
}

/// In-place softmax over each row of `x` ([rows, n]), max-subtracted.
pub fn softmax_rows(x: &mut [f32], n: usize) {
    assert!(
        n > 0 && x.len().is_multiple_of(n),
        "softmax_rows: shape mismatch"
    );
    for row in x.chunks_exact_mut(n) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in row.iter_mut() {
            *v *= inv;
        }
    }
}

/// Lanes of [`softmax_rows_fast`]' vectors: one AVX-512 register.
const SOFTMAX_LANES: usize = 16;

/// [`softmax_rows`] for wide rows (a CTC head's 6,625 classes): rows in
/// parallel, each with 16-lane maxima, sums and a polynomial `exp`
/// ([`exp_poly`], within 2 ulp of `f32::exp` above e^-87, zero below)
/// instead of libm's scalar one. Each row's result depends on that row
/// alone (the same in any batch); it differs from [`softmax_rows`], the
/// oracle, by a few ulps of each value.
pub fn softmax_rows_fast(x: &mut [f32], n: usize) {
    use rayon::prelude::*;
    assert!(
        n > 0 && x.len().is_multiple_of(n),
        "softmax_rows_fast: shape mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    let fma =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    x.par_chunks_mut(n)
        .with_min_len((1 << 14) / n + 1)
        .for_each(|row| {
            #[cfg(target_arch = "x86_64")]
            if fma {
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                return unsafe { softmax_row_fma(row) };
            }
            softmax_row::<false>(row)
        });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_row_fma(row: &mut [f32]) {
    softmax_row::<true>(row)
}

/// One row of [`softmax_rows_fast`]; FMA: whether `mul_add` is one
/// instruction here (else a multiply and an add).
#[inline(always)]
fn softmax_row<const FMA: bool>(row: &mut [f32]) {
    let mut chunks = row.chunks_exact_mut(SOFTMAX_LANES);
    let mut lanes = [f32::NEG_INFINITY; SOFTMAX_LANES];
    for c in chunks.by_ref() {
        for (m, &v) in lanes.iter_mut().zip(c.iter()) {
            *m = m.max(v);
        }
    }
    let rest = chunks.into_remainder();
    let max = rest.iter().copied().fold(
        lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        f32::max,
    );
    let mut sums = [0.0f32; SOFTMAX_LANES];
    let mut chunks = row.chunks_exact_mut(SOFTMAX_LANES);
    for c in chunks.by_ref() {
        for (s, v) in sums.iter_mut().zip(c.iter_mut()) {
            *v = exp_poly::<FMA>(*v - max);
            *s += *v;
        }
    }
    for (s, v) in sums.iter_mut().zip(chunks.into_remainder()) {
        *v = exp_poly::<FMA>(*v - max);
        *s += *v;
    }
    // A fixed tree over the lanes.
    let mut width = SOFTMAX_LANES / 2;
    while width > 0 {
        for i in 0..width {
            sums[i] += sums[i + width];
        }
        width /= 2;
    }
    let inv = 1.0 / sums[0];
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// e^x in f32 without a table or a call, for vector loops: x = n ln 2 + r
/// with |r| <= ln 2 / 2 (n rounded to nearest by the 1.5 * 2^23 trick),
/// Cephes' degree-6 polynomial for e^r, then 2^n put into the exponent
/// bits. Clamped to [-87.3, 88.7] (e^-87.3 is near the smallest normal
/// float; below it this gives that rather than a subnormal or zero).
#[inline(always)]
pub fn exp_poly<const FMA: bool>(x: f32) -> f32 {
    let fma = |a: f32, b: f32, c: f32| if FMA { a.mul_add(b, c) } else { a * b + c };
    const SHIFT: f32 = 12_582_912.0; // 1.5 * 2^23
    let x = x.clamp(-87.336_55, 88.376_26);
    let t = fma(x, std::f32::consts::LOG2_E, SHIFT);
    let n = t - SHIFT;
    let r = fma(n, -0.693_359_4, x);
    let r = fma(n, 2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4;
    p = fma(p, r, 1.398_199_9e-3);
    p = fma(p, r, 8.333_452e-3);
    p = fma(p, r, 4.166_579_6e-2);
    p = fma(p, r, 0.166_666_65);
    p = fma(p, r, 0.5);
    let e = fma(p * r, r, r) + 1.0;
    // The low bits of t hold n (two's complement): 2^n's exponent field.
    let scale = f32::from_bits(t.to_bits().wrapping_add(127) << 23);
    e * scale
}

/// WaveNet's gated activation (`fused_add_tanh_sigmoid_multiply` in VITS):
/// y[c, t] = tanh(x[c, t] + g[c]) * sigmoid(x[h + c, t] + g[h + c]), with
/// x: [2h, t], g: [2h] a per-channel conditioning offset (none: zeros),
/// y: [h, t]. Both through [`exp_poly`] (tanh u = 1 - 2 / (e^2u + 1)), in
/// vectors: libm's scalar tanh and exp were most of the flow's time outside
/// its convolutions.
pub fn wavenet_gate(x: &[f32], g: Option<&[f32]>, h: usize, t: usize, y: &mut [f32]) {
    use rayon::prelude::*;
    assert!(
        x.len() >= 2 * h * t && y.len() >= h * t,
        "wavenet_gate: shapes"
    );
    let off = |c: usize| g.map_or(0.0, |g| g[c]);
    #[cfg(target_arch = "x86_64")]
    let fma =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    y[..h * t]
        .par_chunks_mut(t.max(1))
        .enumerate()
        .for_each(|(c, y)| {
            let (ga, gb) = (off(c), off(h + c));
            let a = &x[c * t..(c + 1) * t];
            let b = &x[(h + c) * t..(h + c + 1) * t];
            #[cfg(target_arch = "x86_64")]
            if fma {
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                return unsafe { gate_row_fma(y, a, b, ga, gb) };
            }
            gate_row::<false>(y, a, b, ga, gb)
        });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gate_row_fma(y: &mut [f32], a: &[f32], b: &[f32], ga: f32, gb: f32) {
    gate_row::<true>(y, a, b, ga, gb)
}

/// One channel of [`wavenet_gate`]; FMA as in [`exp_poly`].
#[inline(always)]
fn gate_row<const FMA: bool>(y: &mut [f32], a: &[f32], b: &[f32], ga: f32, gb: f32) {
    for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
        let tanh = 1.0 - 2.0 / (exp_poly::<FMA>(2.0 * (a + ga)) + 1.0);
        let sigmoid = 1.0 / (1.0 + exp_poly::<FMA>(-(b + gb)));
        *y = tanh * sigmoid;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Values from a 50-digit reference.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (2.0, 0.995_322_3),
            (3.0, 0.999_977_9),
            (-1.5, -0.966_105_15),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-6,
                "erf({x}) = {} want {want}",
                erf(x)
            );
        }
    }

    #[test]
    fn fast_erf_and_gelu_match_the_exact_ones() {
        let mut worst = 0.0f32;
        for i in -200_000..=200_000 {
            let x = i as f32 * 5e-5;
            worst = worst.max((erf_fast(x) - erf(x)).abs());
            let g = (gelu_fast(x) - gelu(x)).abs();
            assert!(g <= 2e-7 * (1.0 + x.abs()), "gelu_fast({x}) off by {g}");
        }
        assert!(worst < 2.5e-7, "erf_fast max error {worst}");
    }

    #[test]
    fn polynomial_exp_is_within_two_ulp() {
        for i in -87_000..=88_000 {
            let x = i as f32 * 1e-3 + 3.1e-4;
            let (want, fast, fused) = (x.exp(), exp_poly::<false>(x), exp_poly::<true>(x));
            for got in [fast, fused] {
                let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
                assert!(ulps <= 2, "exp({x}): {got} vs {want}, {ulps} ulp");
            }
        }
        assert_eq!(exp_poly::<true>(0.0), 1.0);
        assert!(exp_poly::<true>(-1e4) < 1.2e-38);
        assert!(exp_poly::<true>(f32::NEG_INFINITY) < 1.2e-38);
    }

    #[test]
    fn vector_gelu_matches_the_scalar_one() {
        let mut x: Vec<f32> = (-40_000..=40_000)
            .map(|i| i as f32 * 2.5e-4 + 1.3e-5)
            .collect();
        x.extend([30.0, -30.0, 0.0, -0.0, 1.0, -1.0, 1e-30, f32::NAN]);
        let mut y = x.clone();
        gelu_fast_all(&mut y);
        for (&x, &got) in x.iter().zip(&y) {
            if x.is_nan() {
                assert!(got.is_nan(), "a NaN in stays a NaN out");
                continue;
            }
            let (want, exact) = (gelu_fast(x), gelu(x));
            assert!(
                (got - want).abs() <= 4e-7 * (1.0 + x.abs()),
                "gelu({x}): {got} vs {want}"
            );
            assert!(
                (got - exact).abs() <= 1e-6 * (1.0 + x.abs()),
                "gelu({x}): {got} vs {exact}"
            );
        }
    }

    #[test]
    fn wavenet_gate_matches_tanh_times_sigmoid() {
        let (h, t) = (3, 101);
        let mut rng = crate::util::rng::Rng::new(4);
        let mut x = rng.vec(2 * h * t, -6.0, 6.0);
        // Past where exp_poly clamps, both ways.
        x[0] = 60.0;
        x[1] = -60.0;
        x[h * t] = -100.0;
        let g = rng.vec(2 * h, -1.0, 1.0);
        let mut y = vec![0.0; h * t];
        wavenet_gate(&x, Some(&g), h, t, &mut y);
        for c in 0..h {
            for i in 0..t {
                let a = x[c * t + i] + g[c];
                let b = x[(h + c) * t + i] + g[h + c];
                let want = a.tanh() / (1.0 + (-b).exp());
                let got = y[c * t + i];
                assert!((got - want).abs() < 1e-6, "({c}, {i}): {got} vs {want}");
            }
        }
        x[5] = f32::NAN;
        wavenet_gate(&x, None, h, t, &mut y);
        assert!(y[5].is_nan(), "a NaN in stays a NaN out");
    }

    #[test]
    fn fast_softmax_matches_the_oracle() {
        let mut rng = crate::util::rng::Rng::new(9);
        // Widths around the 16-lane vectors and a CTC head's 6,625
        // classes; logits spread like a recogniser's (a few far above).
        for n in [1, 7, 16, 33, 6625] {
            let mut logits = rng.vec(5 * n, -20.0, 8.0);
            logits[n / 2] = 30.0;
            let (mut want, mut got) = (logits.clone(), logits.clone());
            softmax_rows(&mut want, n);
            softmax_rows_fast(&mut got, n);
            for (r, row) in logits.chunks_exact(n).enumerate() {
                // Exact from each logit minus the maximum as both compute
                // it (in f32).
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e = |v: f32| ((v - max) as f64).exp();
                let sum: f64 = row.iter().map(|&v| e(v)).sum();
                for (j, &v) in row.iter().enumerate() {
                    let (i, exact) = (r * n + j, e(v) / sum);
                    // Against the exact value: 2 ulp from exp, a few from
                    // 16-lane sums of ~n/16 terms and from 1/sum.
                    let (g, w) = (got[i] as f64, want[i] as f64);
                    let tol = (8.0 + n as f64 / 256.0) * f32::EPSILON as f64 * exact;
                    assert!(
                        (g - exact).abs() <= tol,
                        "n {n} element {i}: {g} vs {exact}"
                    );
                    // Against the oracle, whose one running sum can be off
                    // by up to n ulp of the sum.
                    let bound = (8.0 + n as f64) * f32::EPSILON as f64 * exact;
                    assert!((g - w).abs() <= bound, "n {n} element {i}: {g} vs {w}");
                }
            }
            // A row alone gives the same bits as in the batch.
            let mut alone = logits[2 * n..3 * n].to_vec();
            softmax_rows_fast(&mut alone, n);
            assert_eq!(alone, got[2 * n..3 * n], "n {n}");
        }
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, -1.0, 0.0, 1000.0];
        softmax_rows(&mut x, 3);
        assert!((x[..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!((x[5] - 1.0).abs() < 1e-6);
    }
}
