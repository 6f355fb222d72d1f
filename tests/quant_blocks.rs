//! Block formats against ggml and gguf-py (fixture from
//! scripts/fixtures/quant_blocks.py): quantisation byte for byte, dequantisation
//! bit for bit, the reference dot product against dequantise-then-dot, and the
//! quantise -> dequantise error of each type within a stated budget.

use lfm::quant::{dequantize_row, dot_row, quantize_row, GgmlType};
use lfm::util::rng::Rng;
use safetensors::SafeTensors;
use std::path::Path;

struct Fixture {
    bytes: Vec<u8>,
}

impl Fixture {
    fn load() -> Fixture {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("samples/fixtures/quant/quant_blocks.safetensors");
        Fixture {
            bytes: std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        }
    }

    fn raw(&self, name: &str) -> Vec<u8> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        st.tensor(name)
            .unwrap_or_else(|e| panic!("fixture tensor {name}: {e}"))
            .data()
            .to_vec()
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        self.raw(name)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

/// The first block where two encodings differ, for a readable failure.
fn first_diff(t: GgmlType, got: &[u8], want: &[u8]) -> Option<usize> {
    got.chunks(t.block_bytes())
        .zip(want.chunks(t.block_bytes()))
        .position(|(a, b)| a != b)
}

#[test]
fn quantize_row_is_byte_identical_to_ggml_and_gguf_py() {
    let f = Fixture::load();
    let x = f.f32s("input");
    for t in GgmlType::ALL {
        let want = f.raw(&format!("quant.{}", t.name()));
        let mut got = vec![0u8; t.row_bytes(x.len()).unwrap()];
        quantize_row(t, &x, &mut got);
        assert_eq!(got.len(), want.len(), "{t}");
        if let Some(b) = first_diff(t, &got, &want) {
            let r = b * t.block_bytes()..(b + 1) * t.block_bytes();
            panic!(
                "{t}: block {b} (input values {}..) differs\n ours: {:?}\n ggml: {:?}",
                b * t.block_size(),
                &got[r.clone()],
                &want[r]
            );
        }
    }
}

#[test]
fn dequantize_row_is_bit_identical_to_gguf_py() {
    let f = Fixture::load();
    for t in GgmlType::ALL {
        let blocks = f.raw(&format!("blocks.{}", t.name()));
        let want = f.f32s(&format!("deq.{}", t.name()));
        let mut got = vec![f32::NAN; want.len()];
        dequantize_row(t, &blocks, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{t} element {i}: {g} vs {w}");
        }
    }
}

#[test]
fn dot_row_equals_dequantise_then_dot() {
    let f = Fixture::load();
    for t in GgmlType::ALL {
        let blocks = f.raw(&format!("blocks.{}", t.name()));
        let w = f.f32s(&format!("deq.{}", t.name()));
        let x = Rng::new(5).vec(w.len(), -1.0, 1.0);
        let want = lfm::cpu::dot(&w, &x);
        let got = dot_row(t, &blocks, &x);
        // Same products, different summation order: bounded by a few ulps of
        // the sum of |w x|.
        let mag: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
        assert!(
            (got - want).abs() <= 4.0 * f32::EPSILON * mag,
            "{t}: {got} vs {want} (sum |wx| = {mag})"
        );
    }
}

/// Relative RMS error ||x - dq(q(x))|| / ||x|| on 64Ki standard-normal
/// values, and the budget each type must stay within. The budgets are the
/// measured errors (lfm's quantisers are byte-identical to ggml's, so these
/// are ggml's numbers) plus about 10%: F16 2.08e-4, BF16 1.66e-3,
/// Q8_0 5.38e-3, Q6_K 1.78e-2, Q5_K 3.63e-2, Q5_1 3.80e-2, Q5_0 4.29e-2,
/// Q4_K 7.18e-2, Q4_1 7.85e-2, Q4_0 8.64e-2, Q3_K 0.151, Q2_K 0.298,
/// Q1_0 0.602 (sign only: sqrt(1 - 2/pi) = 0.603 for a normal).
const BUDGETS: [(GgmlType, f32); 14] = [
    (GgmlType::F32, 0.0),
    (GgmlType::F16, 2.3e-4),
    (GgmlType::BF16, 1.9e-3),
    (GgmlType::Q8_0, 6.0e-3),
    (GgmlType::Q6_K, 0.020),
    (GgmlType::Q5_K, 0.040),
    (GgmlType::Q5_1, 0.042),
    (GgmlType::Q5_0, 0.047),
    (GgmlType::Q4_K, 0.079),
    (GgmlType::Q4_1, 0.087),
    (GgmlType::Q4_0, 0.095),
    (GgmlType::Q3_K, 0.17),
    (GgmlType::Q2_K, 0.33),
    (GgmlType::Q1_0, 0.62),
];

#[test]
fn quantize_dequantize_error_within_budget() {
    let mut rng = Rng::new(42);
    let x: Vec<f32> = (0..65536).map(|_| rng.normal()).collect();
    let norm: f32 = x.iter().map(|v| v * v).sum::<f32>().sqrt();
    let mut report = String::new();
    for (t, budget) in BUDGETS {
        let mut q = vec![0u8; t.row_bytes(x.len()).unwrap()];
        quantize_row(t, &x, &mut q);
        let mut y = vec![0.0f32; x.len()];
        dequantize_row(t, &q, &mut y);
        let err: f32 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            .sqrt()
            / norm;
        report.push_str(&format!("{t}: {err:.3e} (budget {budget:.1e})\n"));
        assert!(
            err <= budget,
            "{t}: relative RMS error {err} over budget {budget}\n{report}"
        );
    }
    eprint!("{report}");
}

#[test]
fn every_type_has_a_budget() {
    for t in GgmlType::ALL {
        assert!(
            BUDGETS.iter().any(|(b, _)| *b == t),
            "{t} has no error budget"
        );
    }
}
