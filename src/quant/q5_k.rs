//! Q5_K: as Q4_K (256 weights, eight sub-blocks of 32 with 6-bit scales and
//! mins under f16 super-scales) with 5-bit levels: the fifth bit of element
//! `l` of sub-block `j` is bit `j` of `qh[l]`. `quantize` is ggml's
//! `quantize_row_q5_K_ref`.

use super::util::{
    dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16, get_scale_min_k4, make_qkx2_quants,
    nearest_int, pack_scale_min_k4, Qkx2,
};
use super::QK_K;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 4 + 12 + QK_K / 8 + QK_K / 2);

pub fn quantize(x: &[f32], y: &mut [BlockQ5K]) {
    assert_eq!(x.len(), y.len() * QK_K, "q5_K quantize: length mismatch");
    let search = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
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
                levels[32 * j + ii] = l.clamp(0, 31) as u8;
            }
        }
        b.qh = [0; QK_K / 8];
        let (mut m1, mut m2) = (1u8, 2u8);
        for (k, ql) in b.qs.chunks_exact_mut(32).enumerate() {
            let n = 64 * k;
            for j in 0..32 {
                let mut l1 = levels[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    b.qh[j] |= m1;
                }
                let mut l2 = levels[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    b.qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

pub fn dequantize_block(b: &BlockQ5K, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    let min = f16_to_f32(b.dmin);
    let (mut u1, mut u2) = (1u8, 2u8);
    for (k, (ql, ys)) in
        b.qs.chunks_exact(32)
            .zip(y.chunks_exact_mut(64))
            .enumerate()
    {
        let (sc, m) = get_scale_min_k4(2 * k, &b.scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = get_scale_min_k4(2 * k + 1, &b.scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        for l in 0..32 {
            let h1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
            ys[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
            ys[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
        u1 <<= 2;
        u2 <<= 2;
    }
}

pub fn dequantize(x: &[BlockQ5K], y: &mut [f32]) {
    dequantize_blocks::<_, QK_K>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ5K], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK_K>(x, y, dequantize_block)
}
