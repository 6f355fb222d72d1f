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

    #[inline]
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

/// Applies `steps` in order to every element of x ([channels, plane]
/// planes, repeated over images). `affine` is [scale; channels] then
/// [shift; channels] for a `ChannelAffine` step (empty otherwise).
pub fn pointwise_chain(steps: &[Pointwise], affine: &[f32], plane: usize, x: &mut [f32]) {
    let channels = affine.len() / 2;
    assert!(
        !steps.contains(&Pointwise::ChannelAffine) || channels > 0,
        "pointwise_chain: a ChannelAffine step without its scale and shift"
    );
    for (k, chunk) in x.chunks_mut(plane.max(1)).enumerate() {
        let (scale, shift) = if channels > 0 {
            let ch = k % channels;
            (affine[ch], affine[channels + ch])
        } else {
            (1.0, 0.0)
        };
        for v in chunk {
            let mut t = *v;
            for s in steps {
                t = s.apply(t, scale, shift);
            }
            *v = t;
        }
    }
}
