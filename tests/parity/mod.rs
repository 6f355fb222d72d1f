//! Shared machinery for GPU-vs-CPU parity tests.
//!
//! Rules every case follows (ARCHITECTURE.md "Two backends, one truth"):
//! seeded non-zero inputs, odd sizes, outputs poisoned with NaN before the
//! run, NaN/Inf checked first, then the normalised error
//! ||gpu - cpu||^2 / ||cpu||^2 under a per-kernel tolerance.

pub mod basic;
pub mod dense;
pub mod llm;
pub mod speech;
pub mod vision;
pub mod whisper;

use lfm::gpu::{Gpu, GpuOptions, Kernel, Variant};
use std::sync::OnceLock;

/// Sizes that catch off-by-one and partial-workgroup bugs: 1, odd, and
/// around the common workgroup sizes (64, 128, 256).
pub const SIZES: &[usize] = &[1, 33, 63, 64, 65, 132, 255, 256, 257, 260, 1025];

/// One kernel's parity test.
pub struct Case {
    pub kernel: &'static str,
    pub run: fn(&Gpu, &Variant),
}

/// The GPU under test. Without an adapter this fails the test, unless the
/// person running it opted out with `LFM_SKIP_GPU_TESTS=1` (never set in CI).
pub fn gpu() -> Option<&'static Gpu> {
    static GPU: OnceLock<Option<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new(&GpuOptions::default()) {
        Ok(g) => {
            eprintln!("{}", g.describe());
            Some(g)
        }
        Err(e) if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() => {
            eprintln!("SKIPPING GPU tests (LFM_SKIP_GPU_TESTS set): {e}");
            None
        }
        Err(e) => panic!("GPU tests need an adapter ({e}); set LFM_SKIP_GPU_TESTS=1 to skip them"),
    })
    .as_ref()
}

/// The variants of `k` this adapter can run.
pub fn runnable_variants(gpu: &Gpu, k: &Kernel) -> Vec<Variant> {
    k.variants
        .iter()
        .map(|d| Variant::new(d))
        .filter(|v| gpu.caps.missing(v).is_none())
        .collect()
}

/// Checks `got` against `want`: same length, every element finite, and
/// ||got - want||^2 / ||want||^2 <= tol.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("{what}: element {i} is {} (cpu {})", got[i], want[i]);
    }
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| ((g - w) as f64).powi(2))
        .sum();
    let den: f64 = want
        .iter()
        .map(|w| (*w as f64).powi(2))
        .sum::<f64>()
        .max(1e-30);
    let err = num / den;
    assert!(err <= tol, "{what}: normalised error {err:.3e} > {tol:.1e}");
}
