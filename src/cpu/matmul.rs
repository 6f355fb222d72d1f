//! Dense products in f32. Weights follow the PyTorch `nn.Linear` layout
//! `[out, in]`, so every output element is a dot product of two contiguous rows.

use rayon::prelude::*;

/// Dot product of two equal-length rows, accumulated in f32 in 8 lanes (the
/// compiler vectorises this; the order is fixed so results are reproducible).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

/// [`dot`] of `a` with each of `bs` (all of `a`'s length), every result the
/// same bits as `dot` gives it: the N sums are independent chains, so the
/// CPU overlaps them (attention's scores, N keys at a time).
pub fn dot_many<const N: usize>(a: &[f32], bs: [&[f32]; N]) -> [f32; N] {
    for b in bs {
        assert_eq!(a.len(), b.len(), "dot_many: length mismatch");
    }
    let mut acc = [[0.0f32; 8]; N];
    let whole = a.len() / 8 * 8;
    for c in (0..whole).step_by(8) {
        let x = &a[c..c + 8];
        for (acc, b) in acc.iter_mut().zip(bs) {
            let y = &b[c..c + 8];
            for i in 0..8 {
                acc[i] += x[i] * y[i];
            }
        }
    }
    std::array::from_fn(|n| {
        let mut tail = 0.0;
        for (x, y) in a[whole..].iter().zip(&bs[n][whole..]) {
            tail += x * y;
        }
        acc[n].iter().sum::<f32>() + tail
    })
}

/// x: [m, k], w: [n, k], bias: `[n]` or none -> y: [m, n]; y = x w^T + bias.
/// Rows of `y` are computed in parallel.
pub fn matmul(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
    y: &mut [f32],
) {
    assert_eq!(x.len(), m * k, "matmul: x is not [m, k]");
    assert_eq!(w.len(), n * k, "matmul: w is not [n, k]");
    assert_eq!(y.len(), m * n, "matmul: y is not [m, n]");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "matmul: bias is not [n]");
    }
    if m == 0 || n == 0 {
        return;
    }
    y.par_chunks_mut(n)
        .zip(x.par_chunks(k.max(1)))
        .for_each(|(yr, xr)| {
            // Parallelise over output columns too when there is a single row
            // (decode), so one token still uses every core.
            if m == 1 {
                yr.par_iter_mut()
                    .enumerate()
                    .with_min_len(64)
                    .for_each(|(j, out)| {
                        *out = dot(xr, &w[j * k..(j + 1) * k]) + bias.map_or(0.0, |b| b[j]);
                    });
            } else {
                for (j, out) in yr.iter_mut().enumerate() {
                    *out = dot(xr, &w[j * k..(j + 1) * k]) + bias.map_or(0.0, |b| b[j]);
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::rng::Rng;

    #[test]
    fn dot_many_gives_each_dot_bit_for_bit() {
        let mut rng = Rng::new(7);
        for len in [0, 3, 8, 64, 67] {
            let a = rng.vec(len, -1.0, 1.0);
            let bs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(len, -1.0, 1.0)).collect();
            let many = dot_many(&a, [&bs[0][..], &bs[1], &bs[2], &bs[3]]);
            for (m, b) in many.iter().zip(&bs) {
                assert_eq!(m.to_bits(), dot(&a, b).to_bits(), "length {len}");
            }
        }
    }
}
