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
