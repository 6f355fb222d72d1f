//! ggml block formats, bit-exact with ggml (`ggml/src/ggml-quants.c`).
//!
//! A quantised row is a sequence of fixed-size blocks, each holding
//! [`GgmlType::block_size`] weights in [`GgmlType::block_bytes`] bytes. Every
//! format lives in its own file with a `#[repr(C)]` block struct (byte arrays
//! only, so a block can be viewed in any byte buffer whatever its alignment),
//! `quantize` (the same algorithm as ggml's `quantize_row_*_ref`, which is what
//! `llama-quantize` runs without an importance matrix), `dequantize`, and `dot`
//! (a quantised row against an f32 vector).
//!
//! The row-level functions here dispatch on the type and also cover the float
//! types (F32, F16, BF16), so one code path reads every weight format.
//! [`dot_row`] is the plain reference: it dequantises block by block and sums
//! in f32, so it equals `cpu::dot(dequantize_row(row), x)` up to summation
//! order. [`fast::RowDot`] computes the same sums faster (scales factored out
//! of vectorised inner loops) and is tested against it.

// The quantisers index their loops like the C they port, so the two can be
// read side by side.
#![allow(clippy::needless_range_loop)]

pub mod fast;
pub mod float;
pub mod policy;
pub mod q1_0;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;

mod util;

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

/// A tensor element type, numbered exactly as ggml's `enum ggml_type`.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q1_0,
}

impl GgmlType {
    /// Every supported type, floats first.
    pub const ALL: [GgmlType; 14] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q1_0,
    ];

    /// The type with ggml id `id`, if this engine supports it (see
    /// [`ggml_type_name`] for a name to put in an error otherwise).
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// ggml's type id (`GGML_TYPE_*`), as stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::BF16 => 30,
            GgmlType::Q1_0 => 41,
        }
    }

    /// The lower-case name: "f32", "q4_0", "q4_k" (ggml spells the K-quants
    /// "q4_K"; [`GgmlType::from_name`] accepts either case).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::BF16 => "bf16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q2_K => "q2_k",
            GgmlType::Q3_K => "q3_k",
            GgmlType::Q4_K => "q4_k",
            GgmlType::Q5_K => "q5_k",
            GgmlType::Q6_K => "q6_k",
            GgmlType::Q1_0 => "q1_0",
        }
    }

    /// Parses a name case-insensitively ("Q4_K", "q4_k", "F16").
    pub fn from_name(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        Self::ALL.into_iter().find(|t| t.name() == lower)
    }

    /// Elements per block (1 for the float types).
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                32
            }
            GgmlType::Q1_0 => q1_0::QK,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                QK_K
            }
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        use std::mem::size_of;
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => size_of::<q4_0::BlockQ4_0>(),
            GgmlType::Q4_1 => size_of::<q4_1::BlockQ4_1>(),
            GgmlType::Q5_0 => size_of::<q5_0::BlockQ5_0>(),
            GgmlType::Q5_1 => size_of::<q5_1::BlockQ5_1>(),
            GgmlType::Q8_0 => size_of::<q8_0::BlockQ8_0>(),
            GgmlType::Q2_K => size_of::<q2_k::BlockQ2K>(),
            GgmlType::Q3_K => size_of::<q3_k::BlockQ3K>(),
            GgmlType::Q4_K => size_of::<q4_k::BlockQ4K>(),
            GgmlType::Q5_K => size_of::<q5_k::BlockQ5K>(),
            GgmlType::Q6_K => size_of::<q6_k::BlockQ6K>(),
            GgmlType::Q1_0 => size_of::<q1_0::BlockQ1_0>(),
        }
    }

    /// Bytes in a row of `n` elements; `None` when `n` is not a multiple of
    /// the block size (or the size overflows).
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.block_bytes())
    }

    pub fn is_quantized(self) -> bool {
        !matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    /// Storage cost in bits per weight (block bytes * 8 / block size).
    pub fn bits_per_weight(self) -> f64 {
        (self.block_bytes() * 8) as f64 / self.block_size() as f64
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// ggml's name for any type id, including the ones this engine does not run,
/// so that an error can say "iq2_xxs is not supported" rather than "type 16".
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    if let Some(t) = GgmlType::from_id(id) {
        return Some(t.name());
    }
    Some(match id {
        9 => "q8_1",
        15 => "q8_k",
        16 => "iq2_xxs",
        17 => "iq2_xs",
        18 => "iq3_xxs",
        19 => "iq1_s",
        20 => "iq4_nl",
        21 => "iq3_s",
        22 => "iq2_s",
        23 => "iq4_xs",
        24 => "i8",
        25 => "i16",
        26 => "i32",
        27 => "i64",
        28 => "f64",
        29 => "iq1_m",
        34 => "tq1_0",
        35 => "tq2_0",
        39 => "mxfp4",
        40 => "nvfp4",
        42 => "q2_0",
        _ => return None,
    })
}

fn check_row(t: GgmlType, bytes: usize, n: usize, what: &str) {
    let expected = t.row_bytes(n);
    assert_eq!(
        expected,
        Some(bytes),
        "{what}: a {t} row of {n} elements is {expected:?} bytes, got {bytes}"
    );
}

/// Dequantises one row: `src` holds `dst.len()` elements of type `t`.
pub fn dequantize_row(t: GgmlType, src: &[u8], dst: &mut [f32]) {
    check_row(t, src.len(), dst.len(), "dequantize_row");
    match t {
        GgmlType::F32 => float::f32_to_f32(src, dst),
        GgmlType::F16 => float::f16_to_f32(src, dst),
        GgmlType::BF16 => float::bf16_to_f32(src, dst),
        GgmlType::Q4_0 => q4_0::dequantize(bytemuck::cast_slice(src), dst),
        GgmlType::Q4_1 => q4_1::dequantize(bytemuck::cast_slice(src), dst),
        GgmlType::Q5_0 => q5_0::dequantize(bytemuck::cast_slice(src), dst),
        GgmlType::Q5_1 => q5_1::dequantize(bytemuck::cast_slice(src), dst),
        GgmlType::Q8_0 => q8_0::dequantize(bytemuck::cast_slice(src), dst),
        GgmlType::Q2_K => q2_k::dequantize(bytemuck::cast_slice(src), dst),
        GgmlType::Q3_K => q3_k::dequantize(bytemuck::cast_slice(src), dst),
        GgmlType::Q4_K => q4_k::dequantize(bytemuck::cast_slice(src), dst),
        GgmlType::Q5_K => q5_k::dequantize(bytemuck::cast_slice(src), dst),
        GgmlType::Q6_K => q6_k::dequantize(bytemuck::cast_slice(src), dst),
        GgmlType::Q1_0 => q1_0::dequantize(bytemuck::cast_slice(src), dst),
    }
}

/// Quantises one row of `src.len()` elements into `dst` (exactly
/// `t.row_bytes(src.len())` bytes), as ggml's `quantize_row_*_ref` does.
pub fn quantize_row(t: GgmlType, src: &[f32], dst: &mut [u8]) {
    check_row(t, dst.len(), src.len(), "quantize_row");
    match t {
        GgmlType::F32 => float::f32_from_f32(src, dst),
        GgmlType::F16 => float::f16_from_f32(src, dst),
        GgmlType::BF16 => float::bf16_from_f32(src, dst),
        GgmlType::Q4_0 => q4_0::quantize(src, bytemuck::cast_slice_mut(dst)),
        GgmlType::Q4_1 => q4_1::quantize(src, bytemuck::cast_slice_mut(dst)),
        GgmlType::Q5_0 => q5_0::quantize(src, bytemuck::cast_slice_mut(dst)),
        GgmlType::Q5_1 => q5_1::quantize(src, bytemuck::cast_slice_mut(dst)),
        GgmlType::Q8_0 => q8_0::quantize(src, bytemuck::cast_slice_mut(dst)),
        GgmlType::Q2_K => q2_k::quantize(src, bytemuck::cast_slice_mut(dst)),
        GgmlType::Q3_K => q3_k::quantize(src, bytemuck::cast_slice_mut(dst)),
        GgmlType::Q4_K => q4_k::quantize(src, bytemuck::cast_slice_mut(dst)),
        GgmlType::Q5_K => q5_k::quantize(src, bytemuck::cast_slice_mut(dst)),
        GgmlType::Q6_K => q6_k::quantize(src, bytemuck::cast_slice_mut(dst)),
        GgmlType::Q1_0 => q1_0::quantize(src, bytemuck::cast_slice_mut(dst)),
    }
}

/// The reference dot product of a row of type `t` with `x` (`x.len()`
/// elements): equal to `cpu::dot(&dequantize_row(row), x)` up to the order of
/// the f32 additions.
pub fn dot_row(t: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    check_row(t, row.len(), x.len(), "dot_row");
    match t {
        GgmlType::F32 => float::dot_f32(row, x),
        GgmlType::F16 => float::dot_f16(row, x),
        GgmlType::BF16 => float::dot_bf16(row, x),
        GgmlType::Q4_0 => q4_0::dot(bytemuck::cast_slice(row), x),
        GgmlType::Q4_1 => q4_1::dot(bytemuck::cast_slice(row), x),
        GgmlType::Q5_0 => q5_0::dot(bytemuck::cast_slice(row), x),
        GgmlType::Q5_1 => q5_1::dot(bytemuck::cast_slice(row), x),
        GgmlType::Q8_0 => q8_0::dot(bytemuck::cast_slice(row), x),
        GgmlType::Q2_K => q2_k::dot(bytemuck::cast_slice(row), x),
        GgmlType::Q3_K => q3_k::dot(bytemuck::cast_slice(row), x),
        GgmlType::Q4_K => q4_k::dot(bytemuck::cast_slice(row), x),
        GgmlType::Q5_K => q5_k::dot(bytemuck::cast_slice(row), x),
        GgmlType::Q6_K => q6_k::dot(bytemuck::cast_slice(row), x),
        GgmlType::Q1_0 => q1_0::dot(bytemuck::cast_slice(row), x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
            assert_eq!(GgmlType::from_name(&t.name().to_uppercase()), Some(t));
            assert_eq!(ggml_type_name(t.id()), Some(t.name()));
        }
        assert_eq!(GgmlType::from_id(16), None);
        assert_eq!(ggml_type_name(16), Some("iq2_xxs"));
        assert_eq!(ggml_type_name(1000), None);
    }

    #[test]
    fn block_sizes_match_ggml() {
        // (type, elements per block, bytes per block) from gguf-py's GGML_QUANT_SIZES.
        let table = [
            (GgmlType::F32, 1, 4),
            (GgmlType::F16, 1, 2),
            (GgmlType::BF16, 1, 2),
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q2_K, 256, 84),
            (GgmlType::Q3_K, 256, 110),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
            (GgmlType::Q1_0, 128, 18),
        ];
        for (t, n, b) in table {
            assert_eq!((t.block_size(), t.block_bytes()), (n, b), "{t}");
        }
        assert_eq!(GgmlType::Q4_0.row_bytes(64), Some(36));
        assert_eq!(GgmlType::Q4_0.row_bytes(48), None);
        assert_eq!(GgmlType::F16.row_bytes(3), Some(6));
        assert_eq!(GgmlType::Q1_0.bits_per_weight(), 1.125);
    }
}
