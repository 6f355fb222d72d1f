//! Q4_0: 32 weights per block, one f16 scale `d`, 4-bit levels `q` in
//! [0, 15] meaning `d * (q - 8)`. Element `j` of the block is the low nibble
//! of byte `j` for `j < 16` and the high nibble of byte `j - 16` otherwise.
//! The scale is chosen so the largest-magnitude weight maps to level 0
//! (`d = max / -8`), as in ggml's `quantize_row_q4_0_ref`.

use super::util::{dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16, trunc_i8};

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 2 + QK / 2);

pub fn quantize(x: &[f32], y: &mut [BlockQ4_0]) {
    assert_eq!(x.len(), y.len() * QK, "q4_0 quantize: length mismatch");
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        for j in 0..QK / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK / 2 + j] * id;
            let q0 = trunc_i8(x0 + 8.5).min(15) as u8;
            let q1 = trunc_i8(x1 + 8.5).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

pub fn dequantize_block(b: &BlockQ4_0, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    for j in 0..QK / 2 {
        y[j] = ((b.qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + QK / 2] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

pub fn dequantize(x: &[BlockQ4_0], y: &mut [f32]) {
    dequantize_blocks::<_, QK>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ4_0], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK>(x, y, dequantize_block)
}
