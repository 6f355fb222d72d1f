//! Q3_K: super-blocks of 256 weights in sixteen sub-blocks of 16, each with a
//! signed 6-bit scale (packed into 12 bytes) under one f16 super-scale `d`; a
//! weight is `d * (sc - 32) * (q - 4)` with a 3-bit level `q`: two low bits in
//! `qs` (packed as in Q2_K), the high bit in `hmask` (bit `i / 32` of byte
//! `i % 32` for element `i`). `quantize` is ggml's `quantize_row_q3_K_ref`.

use super::q2_k::pack_2bit;
use super::util::{
    dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16, make_q3_quants, nearest_int,
};
use super::QK_K;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == QK_K / 8 + QK_K / 4 + 12 + 2);

/// The 6-bit scale of sub-block `j` (0..16), minus 32: low four bits in the
/// low (j < 8) or high (j >= 8) nibble of byte `j % 8`, high two bits at bit
/// `2 (j / 4)` of byte `8 + j % 4`.
pub(crate) fn scale(scales: &[u8; 12], j: usize) -> i32 {
    let low = if j < 8 {
        scales[j] & 0xF
    } else {
        scales[j - 8] >> 4
    };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

pub fn quantize(x: &[f32], y: &mut [BlockQ3K]) {
    assert_eq!(x.len(), y.len() * QK_K, "q3_K quantize: length mismatch");
    let mut levels = [0i8; QK_K];
    for (xb, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..QK_K / 16 {
            let r = 16 * j..16 * j + 16;
            scales[j] = make_q3_quants(4, &xb[r.clone()], &mut levels[r]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        b.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..QK_K / 16 {
                let l = nearest_int(iscale * scales[j]) as i8;
                let l = (l.clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    b.scales[j] = l & 0xF;
                } else {
                    b.scales[j - 8] |= (l & 0xF) << 4;
                }
                b.scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
            }
            b.d = f32_to_f16(1.0 / iscale);
        } else {
            b.d = f32_to_f16(0.0);
        }
        for j in 0..QK_K / 16 {
            let d = f16_to_f32(b.d) * scale(&b.scales, j) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let l = nearest_int(xb[16 * j + ii] / d).clamp(-4, 3);
                levels[16 * j + ii] = (l + 4) as i8;
            }
        }
        b.hmask = [0; QK_K / 8];
        let mut low = [0u8; QK_K];
        for (i, (&l, lo)) in levels.iter().zip(low.iter_mut()).enumerate() {
            let mut l = l as u8;
            if l > 3 {
                b.hmask[i % 32] |= 1 << (i / 32);
                l -= 4;
            }
            *lo = l;
        }
        pack_2bit(&low, &mut b.qs);
    }
}

pub fn dequantize_block(b: &BlockQ3K, y: &mut [f32]) {
    let d_all = f16_to_f32(b.d);
    let mut is = 0;
    let mut out = 0;
    let mut m = 1u8;
    for q in b.qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let dl = d_all * scale(&b.scales, is) as f32;
                is += 1;
                for l in 16 * half..16 * half + 16 {
                    let high = if b.hmask[l] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (((q[l] >> shift) & 3) as i32 - high) as f32;
                    out += 1;
                }
            }
            m <<= 1;
        }
    }
}

pub fn dequantize(x: &[BlockQ3K], y: &mut [f32]) {
    dequantize_blocks::<_, QK_K>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ3K], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK_K>(x, y, dequantize_block)
}
