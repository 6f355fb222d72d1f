//! The float element types (F32, F16, BF16) behind the same row functions as
//! the block formats. Bytes are little-endian and may sit at any alignment
//! (a safetensors tensor can start at an odd offset).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Elements converted per step when a row goes through a stack buffer.
const CHUNK: usize = 256;

pub(crate) fn f32_to_f32(src: &[u8], dst: &mut [f32]) {
    match bytemuck::try_cast_slice::<u8, f32>(src) {
        Ok(s) => dst.copy_from_slice(s),
        Err(_) => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

pub(crate) fn f32_from_f32(src: &[f32], dst: &mut [u8]) {
    dst.copy_from_slice(bytemuck::cast_slice(src));
}

pub(crate) fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    match bytemuck::try_cast_slice::<u8, f16>(src) {
        Ok(s) => s.convert_to_f32_slice(dst),
        Err(_) => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
    }
}

/// Rounds to nearest even, as `GGML_FP32_TO_FP16` and numpy do.
pub(crate) fn f16_from_f32(src: &[f32], dst: &mut [u8]) {
    for (d, &x) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f16::from_f32(x).to_le_bytes());
    }
}

pub(crate) fn bf16_to_f32(src: &[u8], dst: &mut [f32]) {
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

/// ggml's `ggml_compute_fp32_to_bf16`: NaN becomes a quiet NaN with the same
/// sign and top payload bits, everything else rounds to nearest even.
pub(crate) fn bf16_from_f32(src: &[f32], dst: &mut [u8]) {
    for (d, &x) in dst.chunks_exact_mut(2).zip(src) {
        let u = x.to_bits();
        let h = if u & 0x7fff_ffff > 0x7f80_0000 {
            (u >> 16) | 64
        } else {
            (u + (0x7fff + ((u >> 16) & 1))) >> 16
        };
        d.copy_from_slice(&(h as u16).to_le_bytes());
    }
}

/// For F32 this is exactly `cpu::dot(row, x)` (bit for bit) when the row is
/// 4-byte aligned, as memory-mapped GGUF and safetensors weights are.
pub(crate) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    match bytemuck::try_cast_slice::<u8, f32>(row) {
        Ok(w) => crate::cpu::dot(w, x),
        Err(_) => {
            let mut w = vec![0.0f32; x.len()];
            f32_to_f32(row, &mut w);
            crate::cpu::dot(&w, x)
        }
    }
}

pub(crate) fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    dot_chunked(row, x, 2, f16_to_f32)
}

pub(crate) fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    dot_chunked(row, x, 2, bf16_to_f32)
}

fn dot_chunked(row: &[u8], x: &[f32], width: usize, convert: fn(&[u8], &mut [f32])) -> f32 {
    let mut buf = [0.0f32; CHUNK];
    let mut sum = 0.0f32;
    for (bytes, xs) in row.chunks(CHUNK * width).zip(x.chunks(CHUNK)) {
        let w = &mut buf[..xs.len()];
        convert(bytes, w);
        sum += crate::cpu::dot(w, xs);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_like_ggml() {
        let cases = [
            (1.0f32, 0x3f80u16),
            (f32::from_bits(0x3f80_8000), 0x3f80), // tie, even stays
            (f32::from_bits(0x3f81_8000), 0x3f82), // tie, odd rounds up
            (f32::from_bits(0x3f80_8001), 0x3f81),
            (-2.5, 0xc020),
            (f32::INFINITY, 0x7f80),
        ];
        for (x, want) in cases {
            let mut out = [0u8; 2];
            bf16_from_f32(&[x], &mut out);
            assert_eq!(u16::from_le_bytes(out), want, "{x}");
        }
        let mut out = [0u8; 2];
        bf16_from_f32(&[f32::from_bits(0x7f80_0001)], &mut out);
        assert_eq!(u16::from_le_bytes(out), 0x7fc0, "NaN is quieted");
    }

    #[test]
    fn unaligned_rows_read_the_same() {
        let vals = [1.5f32, -2.25, 3.0, 1e-3, 7.0];
        // Backed by u32 so that byte 1 is certainly not 4-aligned.
        let mut backing = [0u32; 6];
        let buf = &mut bytemuck::cast_slice_mut::<u32, u8>(&mut backing)[1..21];
        f32_from_f32(&vals, buf);
        let mut out = [0.0f32; 5];
        f32_to_f32(buf, &mut out);
        assert_eq!(out, vals);
        let x = [1.0f32, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(dot_f32(buf, &x), crate::cpu::dot(&vals, &x));
    }
}
