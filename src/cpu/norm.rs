//! Normalisations.

/// x: [rows, n], w: [n] -> y: [rows, n]; y = w * x / sqrt(mean(x^2) + eps)
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let n = w.len();
    assert!(
        n > 0 && x.len() % n == 0 && x.len() == y.len(),
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
