//! Q5_1: 32 weights per block, f16 scale `d` and minimum `m`, 5-bit levels
//! `q` meaning `d * q + m`, bits packed as in Q5_0. ggml's
//! `quantize_row_q5_1_ref` spans [min, max] with 32 levels.

use super::util::{dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16};

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 8 + QK / 2);

pub fn quantize(x: &[f32], y: &mut [BlockQ5_1]) {
    assert_eq!(x.len(), y.len() * QK, "q5_1 quantize: length mismatch");
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
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK / 2 + j] - min) * id;
            // C's `(uint8_t)(x + 0.5f)`: truncation, no clamp.
            let q0 = (x0 + 0.5) as i32 as u8;
            let q1 = (x1 + 0.5) as i32 as u8;
            b.qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
            qh |= (((q0 & 0x10) >> 4) as u32) << j;
            qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        b.qh = qh.to_le_bytes();
    }
}

pub fn dequantize_block(b: &BlockQ5_1, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    let m = f16_to_f32(b.m);
    let qh = u32::from_le_bytes(b.qh);
    for j in 0..QK / 2 {
        let h0 = ((qh >> j) << 4) as u8 & 0x10;
        let h1 = (qh >> (j + 12)) as u8 & 0x10;
        y[j] = ((b.qs[j] & 0x0F) | h0) as f32 * d + m;
        y[j + QK / 2] = ((b.qs[j] >> 4) | h1) as f32 * d + m;
    }
}

pub fn dequantize(x: &[BlockQ5_1], y: &mut [f32]) {
    dequantize_blocks::<_, QK>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ5_1], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK>(x, y, dequantize_block)
}
