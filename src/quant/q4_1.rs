//! Q4_1: 32 weights per block, f16 scale `d` and minimum `m`, 4-bit levels
//! `q` meaning `d * q + m`; nibble order as in Q4_0. ggml's
//! `quantize_row_q4_1_ref` spans [min, max] with 16 levels.

use super::util::{dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16, trunc_i8};

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 4 + QK / 2);

pub fn quantize(x: &[f32], y: &mut [BlockQ4_1]) {
    assert_eq!(x.len(), y.len() * QK, "q4_1 quantize: length mismatch");
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in xb {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        for j in 0..QK / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK / 2 + j] - min) * id;
            let q0 = trunc_i8(x0 + 0.5).min(15) as u8;
            let q1 = trunc_i8(x1 + 0.5).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

pub fn dequantize_block(b: &BlockQ4_1, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    let m = f16_to_f32(b.m);
    for j in 0..QK / 2 {
        y[j] = (b.qs[j] & 0x0F) as f32 * d + m;
        y[j + QK / 2] = (b.qs[j] >> 4) as f32 * d + m;
    }
}

pub fn dequantize(x: &[BlockQ4_1], y: &mut [f32]) {
    dequantize_blocks::<_, QK>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ4_1], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK>(x, y, dequantize_block)
}
