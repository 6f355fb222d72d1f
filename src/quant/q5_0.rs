//! Q5_0: 32 weights per block, f16 scale `d`, 5-bit levels `q` in [0, 31]
//! meaning `d * (q - 16)`. The low four bits are packed as in Q4_0; bit 4 of
//! element `j` is bit `j` of the little-endian u32 `qh`. ggml's
//! `quantize_row_q5_0_ref` maps the largest-magnitude weight to level 0.

use super::util::{dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16, trunc_i8};

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 6 + QK / 2);

pub fn quantize(x: &[f32], y: &mut [BlockQ5_0]) {
    assert_eq!(x.len(), y.len() * QK, "q5_0 quantize: length mismatch");
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK / 2 + j] * id;
            let q0 = trunc_i8(x0 + 16.5).min(31) as u8;
            let q1 = trunc_i8(x1 + 16.5).min(31) as u8;
            b.qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
            qh |= (((q0 & 0x10) >> 4) as u32) << j;
            qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        b.qh = qh.to_le_bytes();
    }
}

pub fn dequantize_block(b: &BlockQ5_0, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    let qh = u32::from_le_bytes(b.qh);
    for j in 0..QK / 2 {
        let h0 = ((qh >> j) << 4) as u8 & 0x10;
        let h1 = (qh >> (j + 12)) as u8 & 0x10;
        y[j] = (((b.qs[j] & 0x0F) | h0) as i32 - 16) as f32 * d;
        y[j + QK / 2] = (((b.qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

pub fn dequantize(x: &[BlockQ5_0], y: &mut [f32]) {
    dequantize_blocks::<_, QK>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ5_0], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK>(x, y, dequantize_block)
}
