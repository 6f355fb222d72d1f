//! Q1_0: 1-bit sign weights, 128 per block with one f16 scale (1.125 bits
//! per weight). This is upstream ggml's `GGML_TYPE_Q1_0 = 41` (ggml.h;
//! `block_q1_0` in ggml-common.h, `quantize_row_q1_0_ref` and
//! `dequantize_row_q1_0` in ggml-quants.c; gguf-py lists it as
//! `GGMLQuantizationType.Q1_0 = 41`, 128 elements in 18 bytes):
//!
//! - layout: `d` (f16), then `qs[16]`; bit `j % 8` of byte `j / 8` is the sign
//!   of element `j` (1 = positive);
//! - quantiser: `d = sum(|x|) / 128` (the mean magnitude, summed in element
//!   order in f32), bit set when `x >= 0`;
//! - value: `+d` when the bit is set, `-d` otherwise (never zero).

use super::util::{dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16};

pub const QK: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ1_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 8],
}
const _: () = assert!(std::mem::size_of::<BlockQ1_0>() == 2 + QK / 8);

pub fn quantize(x: &[f32], y: &mut [BlockQ1_0]) {
    assert_eq!(x.len(), y.len() * QK, "q1_0 quantize: length mismatch");
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let mut sum_abs = 0.0f32;
        for &v in xb {
            sum_abs += v.abs();
        }
        b.d = f32_to_f16(sum_abs / QK as f32);
        b.qs = [0; QK / 8];
        for (j, &v) in xb.iter().enumerate() {
            if v >= 0.0 {
                b.qs[j / 8] |= 1 << (j % 8);
            }
        }
    }
}

pub fn dequantize_block(b: &BlockQ1_0, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    for (j, o) in y.iter_mut().enumerate() {
        *o = if (b.qs[j / 8] >> (j % 8)) & 1 != 0 {
            d
        } else {
            -d
        };
    }
}

pub fn dequantize(x: &[BlockQ1_0], y: &mut [f32]) {
    dequantize_blocks::<_, QK>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ1_0], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK>(x, y, dequantize_block)
}
