//! Q6_K: super-blocks of 256 weights in sixteen sub-blocks of 16, each with a
//! signed 8-bit scale under one f16 super-scale `d`; a weight is
//! `d * scale * (q - 32)` with a 6-bit level `q` whose low four bits are in
//! `ql` and high two in `qh` (layout in `dequantize_block`). `quantize` is
//! ggml's `quantize_row_q6_K_ref`.

use super::util::{
    dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16, make_qx_quants, nearest_int,
    GROUP_MAX_EPS,
};
use super::QK_K;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    /// Signed sub-block scales stored as bytes (`as i8`).
    pub scales: [u8; QK_K / 16],
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == QK_K / 2 + QK_K / 4 + QK_K / 16 + 2);

pub fn quantize(x: &[f32], y: &mut [BlockQ6K]) {
    assert_eq!(x.len(), y.len() * QK_K, "q6_K quantize: length mismatch");
    let mut levels = [0i8; QK_K];
    for (xb, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let r = 16 * ib..16 * ib + 16;
            let scale = make_qx_quants(32, &xb[r.clone()], &mut levels[r]);
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *b = bytemuck::Zeroable::zeroed();
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = f32_to_f16(1.0 / iscale);
        for ib in 0..QK_K / 16 {
            b.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
        }
        for j in 0..QK_K / 16 {
            let d = f16_to_f32(b.d) * (b.scales[j] as i8) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let l = nearest_int(xb[16 * j + ii] / d).clamp(-32, 31);
                levels[16 * j + ii] = (l + 32) as i8;
            }
        }
        let lv = |i: usize| levels[i] as u8;
        for half in 0..2 {
            let (j, ql, qh) = (128 * half, &mut b.ql[64 * half..], &mut b.qh[32 * half..]);
            for l in 0..32 {
                let q1 = lv(j + l) & 0xF;
                let q2 = lv(j + l + 32) & 0xF;
                let q3 = lv(j + l + 64) & 0xF;
                let q4 = lv(j + l + 96) & 0xF;
                ql[l] = q1 | (q3 << 4);
                ql[l + 32] = q2 | (q4 << 4);
                qh[l] = (lv(j + l) >> 4)
                    | ((lv(j + l + 32) >> 4) << 2)
                    | ((lv(j + l + 64) >> 4) << 4)
                    | ((lv(j + l + 96) >> 4) << 6);
            }
        }
    }
}

pub fn dequantize_block(b: &BlockQ6K, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    for half in 0..2 {
        let ql = &b.ql[64 * half..];
        let qh = &b.qh[32 * half..];
        let sc = &b.scales[8 * half..];
        let ys = &mut y[128 * half..];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |i: usize| (sc[i] as i8) as f32;
            ys[l] = d * s(is) * q1 as f32;
            ys[l + 32] = d * s(is + 2) * q2 as f32;
            ys[l + 64] = d * s(is + 4) * q3 as f32;
            ys[l + 96] = d * s(is + 6) * q4 as f32;
        }
    }
}

pub fn dequantize(x: &[BlockQ6K], y: &mut [f32]) {
    dequantize_blocks::<_, QK_K>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ6K], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK_K>(x, y, dequantize_block)
}
