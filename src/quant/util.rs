//! Pieces shared by the block formats: half-precision scales, ggml's integer
//! rounding, and the scale searches of the K-quants. Each search is a line by
//! line port of the ggml function of the same name (`ggml-quants.c`), keeping
//! its order of f32 operations so the blocks come out byte-identical.

use half::f16;

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below this is
/// stored as all zeros.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// A little-endian f16 scale as f32 (`GGML_FP16_TO_FP32`, exact).
#[inline]
pub(crate) fn f16_to_f32(b: [u8; 2]) -> f32 {
    f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// An f32 as a little-endian f16, rounded to nearest even (`GGML_FP32_TO_FP16`).
#[inline]
pub(crate) fn f32_to_f16(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// ggml's `nearest_int`: round half to even by adding 1.5 * 2^23 and reading
/// the mantissa. Only meaningful for |x| <= 2^22, like the original; outside
/// that range it returns the same garbage the C does, which the callers clamp.
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// C's `(int8_t)f` on x86: truncate toward zero to 32 bits, keep the low byte.
#[inline]
pub(crate) fn trunc_i8(x: f32) -> i8 {
    x as i32 as i8
}

/// The reference dot product shared by every block format: dequantise a
/// block into a buffer, then accumulate `cpu::dot` of the buffer with the
/// matching slice of `x`.
pub(crate) fn dot_by_blocks<B, const QK: usize>(
    blocks: &[B],
    x: &[f32],
    dequantize_block: impl Fn(&B, &mut [f32]),
) -> f32 {
    assert_eq!(blocks.len() * QK, x.len(), "dot: length mismatch");
    let mut buf = [0.0f32; QK];
    let mut sum = 0.0f32;
    for (b, xs) in blocks.iter().zip(x.chunks_exact(QK)) {
        dequantize_block(b, &mut buf);
        sum += crate::cpu::dot(&buf, xs);
    }
    sum
}

/// Applies `dequantize_block` to every block of a row.
pub(crate) fn dequantize_blocks<B, const QK: usize>(
    blocks: &[B],
    y: &mut [f32],
    dequantize_block: impl Fn(&B, &mut [f32]),
) {
    assert_eq!(blocks.len() * QK, y.len(), "dequantize: length mismatch");
    for (b, ys) in blocks.iter().zip(y.chunks_exact_mut(QK)) {
        dequantize_block(b, ys);
    }
}

/// ggml's `make_qx_quants` with `rmse_type == 1` and no importance weights
/// (weights x^2), the only form the reference quantisers use (Q6_K). Writes
/// levels `l + nmax` in `[0, 2 nmax)` to `levels` and returns the scale.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels[..n].fill(0);
        return 0.0;
    }
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = clamp(nearest_int(iscale * x[i]));
        levels[i] = (l + nmax) as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = clamp(nearest_int(iscale * v)) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                levels[i] = (nmax + clamp(nearest_int(iscale * x[i]))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse == true` (Q3_K): an x^2-weighted
/// least-squares scale refined by up to five passes of coordinate descent.
/// Writes levels `l + nmax` in `[0, 2 nmax)` and returns the scale.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels[..n].fill(0);
        return 0.0;
    }
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = clamp(nearest_int(iscale * x[i]));
        levels[i] = l as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = levels[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = clamp(nearest_int(x[i] * sl2 / slx));
                if new_l != levels[i] as i32 {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        levels[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in levels[..n].iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Options of ggml's `make_qkx2_quants` search over `nstep + 1` candidate
/// scales `(rmin + rdelta * is + nmax) / (max - min)`.
pub(crate) struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    /// Minimise the weighted absolute error instead of the squared error.
    pub use_mad: bool,
}

/// ggml's `make_qkx2_quants`: fits `x ~ scale * l - the_min` with `l` in
/// `[0, nmax]` and `the_min >= 0`, minimising the weighted error. Writes the
/// levels and returns `(scale, the_min)`.
pub(crate) fn make_qkx2_quants(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    scratch: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let nmax = p.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels[..n].fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        levels[i] = l as u8;
        best_error += weights[i] * err(scale * l as f32 + min - x[i]);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            scratch[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * scratch[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                levels[..n].copy_from_slice(&scratch[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` from
/// the 12 packed bytes of a Q4_K / Q5_K block.
#[inline]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Packs eight 6-bit scales and mins into 12 bytes (the inverse of
/// [`get_scale_min_k4`]), as the Q4_K and Q5_K quantisers do.
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (x, want) in [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
            (-7.6, -8),
        ] {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    #[test]
    fn scale_min_packing_round_trips() {
        let ls = [0, 63, 17, 42, 5, 60, 33, 1];
        let lm = [63, 0, 9, 31, 62, 7, 48, 20];
        let q = pack_scale_min_k4(&ls, &lm);
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &q), (ls[j], lm[j]), "sub-block {j}");
        }
    }
}
