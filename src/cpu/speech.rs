//! The pieces of VITS's prior (text encoder, stochastic duration predictor,
//! length regulation) that are not plain convolutions, over `[channels,
//! time]` activations: layer norm across channels, relative-position
//! attention, the rational-quadratic spline's inverse, the expansion of
//! the prior to frames with its noise, and the embedding lookup. Twins of
//! the kernels in `gpu::speech`; the VITS CPU reference calls them.

use super::{dot, gelu_fast, softmax_rows};
use rayon::prelude::*;

/// Rational-quadratic spline settings of VITS's `ConvFlow` (`transforms.py`).
pub const SPLINE_TAIL_BOUND: f32 = 5.0;
pub const SPLINE_MIN_BIN: f32 = 1e-3;
pub const SPLINE_MIN_DERIVATIVE: f32 = 1e-3;

/// x: [c, t] -> y: [c, t]: at every time step, layer norm over the c
/// channels (biased variance, two passes), `* gamma + beta`, then GELU when
/// `gelu`, then `+ res` when given (VITS's `modules.LayerNorm`, with what
/// follows it in `DDSConv`). GELU is [`gelu_fast`], the GPU kernel's erf:
/// the f64 series of the exact one was 7% of `speak --cpu`'s time.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_channels(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    t: usize,
    gelu_after: bool,
    res: Option<&[f32]>,
    y: &mut [f32],
) {
    let c = gamma.len();
    assert!(
        c > 0 && beta.len() == c && x.len() == c * t && y.len() == c * t,
        "layer_norm_channels: shape mismatch"
    );
    if let Some(r) = res {
        assert_eq!(r.len(), c * t, "layer_norm_channels: residual shape");
    }
    // Channel by channel into per-step sums: each step's sums in the order
    // of a loop over its channels, with the steps in the vector lanes.
    let mut mean = vec![0.0f32; t];
    for row in x.chunks_exact(t) {
        mean.iter_mut().zip(row).for_each(|(m, &v)| *m += v);
    }
    mean.iter_mut().for_each(|m| *m /= c as f32);
    let mut inv = vec![0.0f32; t];
    for row in x.chunks_exact(t) {
        for ((s, &v), &m) in inv.iter_mut().zip(row).zip(&mean) {
            *s += (v - m) * (v - m);
        }
    }
    inv.iter_mut()
        .for_each(|s| *s = 1.0 / (*s / c as f32 + eps).sqrt());
    for (ch, (yr, xr)) in y.chunks_exact_mut(t).zip(x.chunks_exact(t)).enumerate() {
        let (g, b) = (gamma[ch], beta[ch]);
        for (ti, (yv, &xv)) in yr.iter_mut().zip(xr).enumerate() {
            let mut v = (xv - mean[ti]) * inv[ti] * g + b;
            if gelu_after {
                v = gelu_fast(v);
            }
            if let Some(r) = res {
                v += r[ch * t + ti];
            }
            *yv = v;
        }
    }
}

/// Multi-head self-attention with relative-position keys and values shared
/// by all heads (VITS's `attentions.MultiHeadAttention` with `window_size`):
/// q, k, v: [t, heads * dk] -> [t, heads * dk]. rel_k, rel_v: [2 window + 1,
/// dk], entry `r + window` for the key `r` steps after the query.
pub fn rel_position_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    rel_k: &[f32],
    rel_v: &[f32],
    heads: usize,
    t: usize,
) -> Vec<f32> {
    let c = q.len() / t.max(1);
    let dk = c / heads;
    assert!(
        heads > 0 && dk * heads == c && k.len() == c * t && v.len() == c * t,
        "rel_position_attention: shape mismatch"
    );
    assert!(
        rel_k.len() == rel_v.len() && rel_k.len().is_multiple_of(dk) && (rel_k.len() / dk) % 2 == 1,
        "rel_position_attention: relative embeddings"
    );
    let w = (rel_k.len() / dk / 2) as isize;
    let scale = 1.0 / (dk as f32).sqrt();
    let mut out = vec![0.0f32; t * c];
    // A query step per task, its heads in turn.
    out.par_chunks_mut(c.max(1)).enumerate().for_each_init(
        || (vec![0.0f32; t], vec![0.0f32; dk]),
        |(p, qs), (i, out_i)| {
            for h in 0..heads {
                let hd = h * dk..(h + 1) * dk;
                for (d, qv) in qs.iter_mut().enumerate() {
                    *qv = q[i * c + h * dk + d] * scale;
                }
                for (j, pj) in p.iter_mut().enumerate() {
                    let mut s = dot(qs, &k[j * c..][hd.clone()]);
                    let r = j as isize - i as isize;
                    if r.abs() <= w {
                        let e = (r + w) as usize;
                        s += dot(qs, &rel_k[e * dk..(e + 1) * dk]);
                    }
                    *pj = s;
                }
                softmax_rows(p, t);
                let o = &mut out_i[hd.clone()];
                for (j, &pj) in p.iter().enumerate() {
                    for (ov, vv) in o.iter_mut().zip(&v[j * c..][hd.clone()]) {
                        *ov += pj * vv;
                    }
                }
                for r in -w..=w {
                    let j = i as isize + r;
                    if j < 0 || j >= t as isize {
                        continue;
                    }
                    let pj = p[j as usize];
                    let e = (r + w) as usize;
                    for (ov, rv) in o.iter_mut().zip(&rel_v[e * dk..(e + 1) * dk]) {
                        *ov += pj * rv;
                    }
                }
            }
        },
    );
    out
}

/// Inverse of the rational-quadratic spline with linear tails outside
/// [-B, B] (`unconstrained_rational_quadratic_spline`, inverse=True).
/// `derivatives_u` holds the inner knots' unnormalised derivatives (bins - 1).
pub fn spline_inverse(x: f32, widths_u: &[f32], heights_u: &[f32], derivatives_u: &[f32]) -> f32 {
    let b = SPLINE_TAIL_BOUND;
    if !(-b..=b).contains(&x) {
        return x;
    }
    let bins = widths_u.len();
    let knots = |u: &[f32]| -> Vec<f32> {
        let mut s = u.to_vec();
        softmax_rows(&mut s, bins);
        let mut cum = Vec::with_capacity(bins + 1);
        cum.push(0.0f32);
        let mut acc = 0.0f32;
        for v in &s {
            acc += SPLINE_MIN_BIN + (1.0 - SPLINE_MIN_BIN * bins as f32) * v;
            cum.push(acc);
        }
        for c in cum.iter_mut() {
            *c = 2.0 * b * *c - b;
        }
        cum[0] = -b;
        cum[bins] = b;
        cum
    };
    let cw = knots(widths_u);
    let ch = knots(heights_u);
    let edge = spline_edge_derivative();
    let deriv = |i: usize| -> f32 {
        let u = if i == 0 || i == bins {
            edge
        } else {
            derivatives_u[i - 1]
        };
        SPLINE_MIN_DERIVATIVE + softplus(u)
    };
    // searchsorted over the height knots, the last one nudged up by 1e-6.
    let mut bin = 0;
    for (i, &k) in ch.iter().enumerate() {
        let k = if i == bins { k + 1e-6 } else { k };
        if x >= k {
            bin = i;
        }
    }
    let bin = bin.min(bins - 1);
    let (in_cw, in_w) = (cw[bin], cw[bin + 1] - cw[bin]);
    let (in_ch, in_h) = (ch[bin], ch[bin + 1] - ch[bin]);
    let delta = in_h / in_w;
    let (d0, d1) = (deriv(bin), deriv(bin + 1));
    let dx = x - in_ch;
    let s = d0 + d1 - 2.0 * delta;
    let qa = dx * s + in_h * (delta - d0);
    let qb = in_h * d0 - dx * s;
    let qc = -delta * dx;
    let disc = (qb * qb - 4.0 * qa * qc).max(0.0);
    let root = (2.0 * qc) / (-qb - disc.sqrt());
    root * in_w + in_cw
}

/// The unnormalised derivative pinned at the outer knots, so the slope
/// there is 1 and meets the linear tails.
pub fn spline_edge_derivative() -> f32 {
    ((1.0 - SPLINE_MIN_DERIVATIVE).exp() - 1.0).ln()
}

fn softplus(v: f32) -> f32 {
    if v > 20.0 {
        v
    } else {
        v.exp().ln_1p()
    }
}

/// The spline's inverse at every time step: x: [t], h: [3 bins - 1, t] the
/// projection's output (widths, heights, derivatives; widths and heights
/// scaled by `norm` = 1 / sqrt(filter channels)) -> y: [t].
pub fn spline_inverse_rows(x: &[f32], h: &[f32], norm: f32, y: &mut [f32]) {
    let t = x.len();
    assert!(
        y.len() == t && t > 0 && h.len().is_multiple_of(t) && (h.len() / t + 1).is_multiple_of(3),
        "spline_inverse_rows: shape mismatch"
    );
    let n_params = h.len() / t;
    let bins = (n_params + 1) / 3;
    let mut params = vec![0.0f32; n_params];
    for (ti, (xv, yv)) in x.iter().zip(y.iter_mut()).enumerate() {
        for (p, v) in params.iter_mut().enumerate() {
            *v = h[p * t + ti];
        }
        let widths: Vec<f32> = params[..bins].iter().map(|v| v * norm).collect();
        let heights: Vec<f32> = params[bins..2 * bins].iter().map(|v| v * norm).collect();
        *yv = spline_inverse(*xv, &widths, &heights, &params[2 * bins..]);
    }
}

/// The most frames one phoneme may last: a longer duration (a broken
/// voice's) counts as this many, so that sums of them stay far from
/// overflowing (the GPU kernel's are u32).
pub const MAX_PHONEME_FRAMES: u32 = 1 << 20;

/// Frames per phoneme from the log-durations: ceil(exp(logw) *
/// length_scale) (VITS's `w_ceil`), 0 where that is not a positive finite
/// number, at most [`MAX_PHONEME_FRAMES`].
pub fn durations(logw: &[f32], length_scale: f32) -> Vec<u32> {
    logw.iter()
        .map(|&l| {
            let w = (l.exp() * length_scale).ceil();
            if w.is_finite() && w > 0.0 {
                w.min(MAX_PHONEME_FRAMES as f32) as u32
            } else {
                0
            }
        })
        .collect()
}

/// The durations' running sums: ends[j] = durations[0] + ... +
/// durations[j] (saturating at u32::MAX), the last one the sentence's frames.
pub fn frame_ends(durations: &[u32]) -> Vec<u32> {
    let mut total = 0u32;
    durations
        .iter()
        .map(|&d| {
            total = total.saturating_add(d);
            total
        })
        .collect()
}

/// Which phoneme each frame repeats, for frames per phoneme `durations`.
pub fn frame_phonemes(durations: &[u32]) -> Vec<u32> {
    let mut idx = Vec::with_capacity(durations.iter().map(|&d| d as usize).sum());
    for (j, &d) in durations.iter().enumerate() {
        idx.extend(std::iter::repeat_n(j as u32, d as usize));
    }
    idx
}

/// The text encoder's embedding lookup, channel-major: table: [vocab,
/// hidden], ids: [t] (each below vocab) -> [hidden, t], each value times
/// `scale`.
pub fn embed_channels(table: &[f32], hidden: usize, ids: &[u32], scale: f32) -> Vec<f32> {
    let t = ids.len();
    let mut y = vec![0.0f32; hidden * t];
    for (i, &id) in ids.iter().enumerate() {
        let row = &table[id as usize * hidden..(id as usize + 1) * hidden];
        for (c, &e) in row.iter().enumerate() {
            y[c * t + i] = e * scale;
        }
    }
    y
}

/// Length regulation and sampling of the prior: stats: [2 c, t] (the mean
/// m, then the log-std logs), idx: [frames] the phoneme of each frame,
/// noise: [c, frames] standard normal -> z: [c, frames] with
/// `z = m + noise * exp(logs) * noise_scale` at each frame's phoneme.
pub fn expand_prior(
    stats: &[f32],
    t: usize,
    idx: &[u32],
    noise: &[f32],
    noise_scale: f32,
) -> Vec<f32> {
    let frames = idx.len();
    let c = stats.len() / (2 * t.max(1));
    assert!(
        stats.len() == 2 * c * t && noise.len() == c * frames,
        "expand_prior: shape mismatch"
    );
    let mut z = vec![0.0f32; c * frames];
    for ch in 0..c {
        let (m, logs) = (&stats[ch * t..], &stats[(c + ch) * t..]);
        for (f, &j) in idx.iter().enumerate() {
            let j = j as usize;
            assert!(j < t, "expand_prior: frame {f} reads phoneme {j} of {t}");
            let mut v = m[j];
            v += noise[ch * frames + f] * logs[j].exp() * noise_scale;
            z[ch * frames + f] = v;
        }
    }
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spline_is_identity_outside_the_tails_and_monotone_inside() {
        let w = [0.3, -0.2, 0.1, 0.0, 0.5, -0.4, 0.2, 0.1, 0.0, -0.1];
        let h = [0.1, 0.2, -0.3, 0.0, 0.4, -0.1, 0.3, -0.2, 0.0, 0.1];
        let d = [0.2, -0.1, 0.0, 0.3, -0.2, 0.1, 0.0, 0.2, -0.3];
        assert_eq!(spline_inverse(6.0, &w, &h, &d), 6.0);
        assert_eq!(spline_inverse(-7.5, &w, &h, &d), -7.5);
        let mut prev = f32::NEG_INFINITY;
        for i in -49..=49 {
            let y = spline_inverse(i as f32 * 0.1, &w, &h, &d);
            assert!(y > prev && y.abs() <= 5.0, "not monotone at {i}");
            prev = y;
        }
    }
}
