//! Q4_K: super-blocks of 256 weights in eight sub-blocks of 32. Each
//! sub-block has a 6-bit scale `sc` and min `m` (packed into 12 bytes, see
//! `util::get_scale_min_k4`) that multiply the f16 super-scales `d` and
//! `dmin`; a weight is `d * sc * q - dmin * m` with a 4-bit level `q`. Levels
//! of sub-blocks `2i` and `2i + 1` share 32 bytes: low nibbles, then high.
//! `quantize` is ggml's `quantize_row_q4_K_ref`.

use super::util::{
    dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16, get_scale_min_k4, make_qkx2_quants,
    nearest_int, pack_scale_min_k4, Qkx2,
};
use super::QK_K;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 4 + 12 + QK_K / 2);

pub fn quantize(x: &[f32], y: &mut [BlockQ4K]) {
    assert_eq!(x.len(), y.len() * QK_K, "q4_K quantize: length mismatch");
    let search = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    let mut levels = [0u8; QK_K];
    let mut scratch = [0u8; 32];
    let mut weights = [0.0f32; 32];
    for (xb, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut scales = [0.0f32; 8];
        let mut mins = [0.0f32; 8];
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..8 {
            let xs = &xb[32 * j..32 * j + 32];
            let mut sum_x2 = 0.0f32;
            for &v in xs {
                sum_x2 += v * v;
            }
            let av_x = (sum_x2 / 32.0).sqrt();
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = av_x + v.abs();
            }
            let lv = &mut levels[32 * j..32 * j + 32];
            (scales[j], mins[j]) = make_qkx2_quants(&search, xs, &weights, lv, &mut scratch);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let inv_scale = if max_scale > 0.0 {
            63.0 / max_scale
        } else {
            0.0
        };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        let mut ls = [0u8; 8];
        let mut lm = [0u8; 8];
        for j in 0..8 {
            ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
        }
        b.scales = pack_scale_min_k4(&ls, &lm);
        b.d = f32_to_f16(max_scale / 63.0);
        b.dmin = f32_to_f16(max_min / 63.0);
        for j in 0..8 {
            let (sc, m) = get_scale_min_k4(j, &b.scales);
            let d = f16_to_f32(b.d) * sc as f32;
            if d == 0.0 {
                continue;
            }
            let dm = f16_to_f32(b.dmin) * m as f32;
            for ii in 0..32 {
                let l = nearest_int((xb[32 * j + ii] + dm) / d);
                levels[32 * j + ii] = l.clamp(0, 15) as u8;
            }
        }
        for (k, q) in b.qs.chunks_exact_mut(32).enumerate() {
            let j = 64 * k;
            for l in 0..32 {
                q[l] = levels[j + l] | (levels[j + l + 32] << 4);
            }
        }
    }
}

pub fn dequantize_block(b: &BlockQ4K, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    let min = f16_to_f32(b.dmin);
    for (k, (q, ys)) in
        b.qs.chunks_exact(32)
            .zip(y.chunks_exact_mut(64))
            .enumerate()
    {
        let (sc, m) = get_scale_min_k4(2 * k, &b.scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = get_scale_min_k4(2 * k + 1, &b.scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        for l in 0..32 {
            ys[l] = d1 * (q[l] & 0xF) as f32 - m1;
            ys[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

pub fn dequantize(x: &[BlockQ4K], y: &mut [f32]) {
    dequantize_blocks::<_, QK_K>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ4K], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK_K>(x, y, dequantize_block)
}
