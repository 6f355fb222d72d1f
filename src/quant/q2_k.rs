//! Q2_K: super-blocks of 256 weights in sixteen sub-blocks of 16, each with
//! a 4-bit scale and 4-bit min (one byte) under f16 super-scales `d` and
//! `dmin`; a weight is `d * sc * q - dmin * m` with a 2-bit level `q`.
//! Levels are packed four to a byte across 32-element strides (see
//! `dequantize_block`). `quantize` is ggml's `quantize_row_q2_K_ref`.

use super::util::{
    dequantize_blocks, dot_by_blocks, f16_to_f32, f32_to_f16, make_qkx2_quants, nearest_int, Qkx2,
};
use super::QK_K;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ2K {
    /// Low nibble: scale, high nibble: min, per sub-block of 16.
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == QK_K / 16 + QK_K / 4 + 4);

pub fn quantize(x: &[f32], y: &mut [BlockQ2K]) {
    assert_eq!(x.len(), y.len() * QK_K, "q2_K quantize: length mismatch");
    let search = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    const Q4SCALE: f32 = 15.0;
    let mut levels = [0u8; QK_K];
    let mut scratch = [0u8; 16];
    let mut weights = [0.0f32; 16];
    for (xb, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut scales = [0.0f32; QK_K / 16];
        let mut mins = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..QK_K / 16 {
            let xs = &xb[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let lv = &mut levels[16 * j..16 * j + 16];
            (scales[j], mins[j]) = make_qkx2_quants(&search, xs, &weights, lv, &mut scratch);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..QK_K / 16 {
                b.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = f32_to_f16(max_scale / Q4SCALE);
        } else {
            b.scales = [0; QK_K / 16];
            b.d = f32_to_f16(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..QK_K / 16 {
                b.scales[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            b.dmin = f32_to_f16(max_min / Q4SCALE);
        } else {
            b.dmin = f32_to_f16(0.0);
        }
        for j in 0..QK_K / 16 {
            let d = f16_to_f32(b.d) * (b.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = f16_to_f32(b.dmin) * (b.scales[j] >> 4) as f32;
            for ii in 0..16 {
                let l = nearest_int((xb[16 * j + ii] + dm) / d);
                levels[16 * j + ii] = l.clamp(0, 3) as u8;
            }
        }
        pack_2bit(&levels, &mut b.qs);
    }
}

/// Packs 256 2-bit levels: byte `l` of each 32-byte group `g` holds elements
/// `128 g + l`, `+ 32`, `+ 64`, `+ 96` in bits 0-1, 2-3, 4-5, 6-7.
pub(crate) fn pack_2bit(levels: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for (g, q) in qs.chunks_exact_mut(32).enumerate() {
        let j = 128 * g;
        for l in 0..32 {
            q[l] = levels[j + l]
                | (levels[j + l + 32] << 2)
                | (levels[j + l + 64] << 4)
                | (levels[j + l + 96] << 6);
        }
    }
}

pub fn dequantize_block(b: &BlockQ2K, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    let min = f16_to_f32(b.dmin);
    let mut is = 0;
    let mut out = 0;
    for q in b.qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let sc = b.scales[is];
                is += 1;
                let dl = d * (sc & 0xF) as f32;
                let ml = min * (sc >> 4) as f32;
                for l in 0..16 {
                    y[out] = dl * ((q[16 * half + l] >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

pub fn dequantize(x: &[BlockQ2K], y: &mut [f32]) {
    dequantize_blocks::<_, QK_K>(x, y, dequantize_block)
}

/// Reference dot product of a row with `x` (see `quant::dot_row`).
pub fn dot(x: &[BlockQ2K], y: &[f32]) -> f32 {
    dot_by_blocks::<_, QK_K>(x, y, dequantize_block)
}
