//! Q8_0: 32 weights per block, f16 scale `d = max|x| / 127` and signed 8-bit
//! levels `q` meaning `d * q` (ggml's `quantize_row_q8_0_ref`, which rounds
//! half away from zero).

use super::util::{dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16};

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    /// Signed levels stored as bytes (`as i8`).
    pub qs: [u8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 2 + QK);

pub fn quantize(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK, "q8_0 quantize: length mismatch");
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        for &v in xb {
            // C's MAX(a, b) is `a > b ? a : b`.
            amax = if amax > v.abs() { amax } else { v.abs() };
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

pub fn dequantize_block(b: &BlockQ8_0, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    for (o, &q) in y.iter_mut().zip(&b.qs) {
        *o = (q as i8) as f32 * d;
    }
}

pub fn dequantize(x: &[BlockQ8_0], y: &mut [f32]) {
    dequantize_blocks::<_, QK>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ8_0], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK>(x, y, dequantize_block)
}
