//! Elementwise ops.

/// y = a + b
pub fn add(a: &[f32], b: &[f32], y: &mut [f32]) {
    assert!(
        a.len() == b.len() && a.len() == y.len(),
        "add: length mismatch"
    );
    for ((y, a), b) in y.iter_mut().zip(a).zip(b) {
        *y = a + b;
    }
}

/// x += b (residual add in place)
pub fn add_assign(x: &mut [f32], b: &[f32]) {
    assert_eq!(x.len(), b.len(), "add_assign: length mismatch");
    for (x, b) in x.iter_mut().zip(b) {
        *x += b;
    }
}

/// y: [rows, cols] = `bias[cols]` broadcast + residual[rows, cols] (each
/// optional; zeros without either).
pub fn bias_rows(bias: Option<&[f32]>, residual: Option<&[f32]>, cols: usize, y: &mut [f32]) {
    for (t, row) in y.chunks_exact_mut(cols).enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            *v = bias.map_or(0.0, |b| b[j]) + residual.map_or(0.0, |r| r[t * cols + j]);
        }
    }
}

/// One step of a fused elementwise chain: the ONNX ops exported networks
/// spell out one by one (PP-LCNet's learnable affine and hard-swish are
/// eight nodes), each as ONNX computes it, so a fused chain gives the
/// same bits as the nodes run one at a time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pointwise {
    /// x * c
    Mul(f32),
    /// x + c
    Add(f32),
    /// x - c
    Sub(f32),
    /// x / c
    Div(f32),
    /// max(x, min) then min(., max), as `Clip`
    Clip {
        min: f32,
        max: f32,
    },
    Relu,
    Sigmoid,
    /// clip(alpha * x + beta, 0, 1)
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    /// x * clip(x + 3, 0, 6) / 6
    HardSwish,
    /// x * scale[ch] + shift[ch] per channel (a batch norm): the
    /// chain's `affine` holds scale then shift.
    ChannelAffine,
}

impl Pointwise {
    /// Steps a chain holds at most (the GPU kernel's uniform array).
    pub const MAX_STEPS: usize = 12;

    #[inline(always)]
    fn apply(self, x: f32, scale: f32, shift: f32) -> f32 {
        match self {
            Pointwise::Mul(c) => x * c,
            Pointwise::Add(c) => x + c,
            Pointwise::Sub(c) => x - c,
            Pointwise::Div(c) => x / c,
            Pointwise::Clip { min, max } => x.max(min).min(max),
            Pointwise::Relu => x.max(0.0),
            Pointwise::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Pointwise::HardSigmoid { alpha, beta } => (alpha * x + beta).clamp(0.0, 1.0),
            Pointwise::HardSwish => x * (x + 3.0).clamp(0.0, 6.0) / 6.0,
            Pointwise::ChannelAffine => x * scale + shift,
        }
    }
}

/// Elements a chain takes through all its steps at once, loaded and
/// stored once: four AVX-512 registers, so each step is four independent
/// operations (a division's latency overlaps).
const CHAIN_LANES: usize = 64;

/// Applies `steps` in order to every element of x ([channels, plane]
/// planes, repeated over images). `affine` is [scale; channels] then
/// [shift; channels] for a `ChannelAffine` step (empty otherwise).
///
/// Each element gets the same operations in the same order as one node at
/// a time would give it (so the same bits); 64 elements at a time go
/// through every step in registers, each step a few vector operations
/// rather than a dispatch per element.
pub fn pointwise_chain(steps: &[Pointwise], affine: &[f32], plane: usize, x: &mut [f32]) {
    let channels = affine.len() / 2;
    assert!(
        !steps.contains(&Pointwise::ChannelAffine) || channels > 0,
        "pointwise_chain: a ChannelAffine step without its scale and shift"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked above).
        return unsafe { chain_avx512(steps, affine, plane, x) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { chain_avx2(steps, affine, plane, x) };
    }
    chain_planes(steps, affine, plane, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chain_avx512(steps: &[Pointwise], affine: &[f32], plane: usize, x: &mut [f32]) {
    chain_planes(steps, affine, plane, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn chain_avx2(steps: &[Pointwise], affine: &[f32], plane: usize, x: &mut [f32]) {
    chain_planes(steps, affine, plane, x)
}

#[inline(always)]
fn chain_planes(steps: &[Pointwise], affine: &[f32], plane: usize, x: &mut [f32]) {
    let channels = affine.len() / 2;
    for (k, chunk) in x.chunks_mut(plane.max(1)).enumerate() {
        let (scale, shift) = if channels > 0 {
            let ch = k % channels;
            (affine[ch], affine[channels + ch])
        } else {
            (1.0, 0.0)
        };
        let mut lanes = chunk.chunks_exact_mut(CHAIN_LANES);
        for v in lanes.by_ref() {
            let v: &mut [f32; CHAIN_LANES] = v.try_into().expect("a whole vector");
            let mut r = *v;
            for &s in steps {
                step(s, scale, shift, &mut r);
            }
            *v = r;
        }
        let rest = lanes.into_remainder();
        for &s in steps {
            step(s, scale, shift, rest);
        }
    }
}

/// One step over a block. Each arm calls [`Pointwise::apply`] on a value
/// whose variant is known there, so the match folds away and the loop
/// vectorises (Sigmoid's `exp` aside).
#[inline(always)]
fn step(s: Pointwise, scale: f32, shift: f32, xs: &mut [f32]) {
    macro_rules! each {
        ($op:expr) => {{
            let op = $op;
            for v in xs.iter_mut() {
                *v = op.apply(*v, scale, shift);
            }
        }};
    }
    match s {
        Pointwise::Mul(c) => each!(Pointwise::Mul(c)),
        Pointwise::Add(c) => each!(Pointwise::Add(c)),
        Pointwise::Sub(c) => each!(Pointwise::Sub(c)),
        Pointwise::Div(c) => each!(Pointwise::Div(c)),
        Pointwise::Clip { min, max } => each!(Pointwise::Clip { min, max }),
        Pointwise::Relu => each!(Pointwise::Relu),
        Pointwise::Sigmoid => each!(Pointwise::Sigmoid),
        Pointwise::HardSigmoid { alpha, beta } => each!(Pointwise::HardSigmoid { alpha, beta }),
        Pointwise::HardSwish => each!(Pointwise::HardSwish),
        Pointwise::ChannelAffine => each!(Pointwise::ChannelAffine),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::rng::Rng;

    #[test]
    fn chain_by_blocks_equals_node_by_node() {
        let steps = [
            Pointwise::ChannelAffine,
            Pointwise::Add(3.0),
            Pointwise::Clip { min: 0.0, max: 6.0 },
            Pointwise::Div(6.0),
            Pointwise::Mul(1.5),
            Pointwise::Sub(0.25),
            Pointwise::HardSwish,
            Pointwise::HardSigmoid {
                alpha: 0.2,
                beta: 0.5,
            },
            Pointwise::Relu,
            Pointwise::Sigmoid,
        ];
        let mut rng = Rng::new(6);
        // Planes shorter and longer than a vector, and not a multiple of it.
        for (channels, plane) in [
            (1, 1),
            (3, 7),
            (2, CHAIN_LANES + 3),
            (4, 2 * CHAIN_LANES),
            (2, 100),
        ] {
            let affine = rng.vec(2 * channels, -2.0, 2.0);
            let x = rng.vec(2 * channels * plane, -8.0, 8.0);
            let mut want = x.clone();
            for (i, v) in want.iter_mut().enumerate() {
                let ch = (i / plane) % channels;
                *v = steps
                    .iter()
                    .fold(*v, |t, s| s.apply(t, affine[ch], affine[channels + ch]));
            }
            let mut got = x;
            pointwise_chain(&steps, &affine, plane, &mut got);
            assert_eq!(got, want, "channels {channels}, plane {plane}");
        }
    }
}
