//! Normalisations.

/// x: [rows, n], w: `[n]` -> y: [rows, n]; y = w * x / sqrt(mean(x^2) + eps)
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let n = w.len();
    assert!(
        n > 0 && x.len().is_multiple_of(n) && x.len() == y.len(),
        "rms_norm: shape mismatch"
    );
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let scale = 1.0 / (ms + eps).sqrt();
        for ((y, x), w) in yr.iter_mut().zip(xr).zip(w) {
            *y = w * (x * scale);
        }
    }
}

/// x: [rows, n], w, b: `[n]` -> y: [rows, n]; y = (x - mean) / sqrt(var + eps) * w + b
/// (biased variance, as torch.nn.LayerNorm).
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, y: &mut [f32]) {
    let n = w.len();
    assert!(
        n > 0 && b.len() == n && x.len().is_multiple_of(n) && x.len() == y.len(),
        "layer_norm: shape mismatch"
    );
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let mean = xr.iter().sum::<f32>() / n as f32;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for i in 0..n {
            yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
        }
    }
}
