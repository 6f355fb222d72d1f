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
