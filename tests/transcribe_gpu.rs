//! The Whisper encoder on the GPU (conv stem included) against the CPU
//! reference on one real 30 s window, and a transcript decoded from the GPU
//! encoder's cross-attention state. On Mesa lavapipe in CI.

mod common;

use lfm::gpu::{Gpu, GpuOptions};
use lfm::models::whisper::gpu::GpuEncoder;
use lfm::models::whisper::model::CrossKv;
use lfm::models::whisper::WhisperFiles;
use lfm::run::transcribe::{transcribe, AudioEncoder, Options};
use std::sync::Arc;

const CLIP: &str =
    "/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav";

fn gpu() -> Option<Arc<Gpu>> {
    match Gpu::new(&GpuOptions::default()) {
        Ok(g) => {
            eprintln!("{}", g.describe());
            Some(Arc::new(g))
        }
        Err(e) if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() => {
            eprintln!("SKIPPING GPU tests (LFM_SKIP_GPU_TESTS set): {e}");
            None
        }
        Err(e) => panic!("GPU tests need an adapter ({e}); set LFM_SKIP_GPU_TESTS=1 to skip them"),
    }
}

fn normalised_error(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("element {i} is {}", got[i]);
    }
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    num / den
}

/// Hands out cross-attention state computed beforehand, once.
struct Precomputed(Option<CrossKv>);

impl AudioEncoder for Precomputed {
    fn encode(&mut self, _mel: &[f32]) -> lfm::Result<CrossKv> {
        Ok(self.0.take().expect("one window"))
    }
}

#[test]
fn gpu_encoder_matches_cpu_and_transcribes() {
    let Some(gpu) = gpu() else { return };
    let files = WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap();
    let m = &files.model;
    let samples = lfm::run::audio::load(std::path::Path::new(CLIP), 16_000)
        .unwrap()
        .samples;
    let mel = files.mel.log_mel(&samples);
    let window = mel.window(0, mel.content_frames());

    let enc = GpuEncoder::new(gpu, m).unwrap();
    let t0 = std::time::Instant::now();
    let got = enc.forward(&window).unwrap();
    let kv = enc.cross_kv().unwrap();
    eprintln!("gpu encoder: {:.1} s", t0.elapsed().as_secs_f64());
    let want = m.encoder.forward(&m.config, &window);
    let err = normalised_error(&got, &want);
    eprintln!("encoder output: normalised error {err:.3e}");
    // f32 everywhere; the GPU sums in another order and its erf is a
    // rational approximation (~1e-7 relative): four layers of that.
    assert!(err < 1e-8, "encoder output: normalised error {err:.3e}");

    let want_kv = m.decoder.cross_kv(&want);
    for (l, (g, w)) in kv.kv.iter().zip(&want_kv.kv).enumerate() {
        let err = normalised_error(g, w);
        assert!(
            err < 1e-8,
            "cross K/V of decoder layer {l}: normalised error {err:.3e}"
        );
    }

    let opts = Options {
        language: Some("en".into()),
        ..Options::default()
    };
    let mut pre = Precomputed(Some(kv));
    let t = transcribe(&files, &mut pre, &samples, &opts, &mut |_, _| Ok(())).unwrap();
    assert_eq!(t.text.trim(), "He was not an old-sposed young man.");
}
