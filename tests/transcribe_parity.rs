//! The Whisper CPU reference against the outside world: log-mel features
//! against openai-whisper's `log_mel_spectrogram`, and the encoder output
//! against CTranslate2's `Whisper.encode` on the same features
//! (fixtures from scripts/fixtures/whisper_gold.py).

mod common;

use lfm::models::whisper::mel::{MelFilters, N_FRAMES};
use lfm::models::whisper::WhisperFiles;
use safetensors::SafeTensors;
use std::path::PathBuf;

fn fixture_dir() -> PathBuf {
    common::repo().join("samples/fixtures/whisper")
}

fn gold() -> serde_json::Value {
    let bytes = std::fs::read(fixture_dir().join("gold.json")).unwrap();
    let g: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(g["format_version"], 1);
    g
}

/// A tensor of features.safetensors as f32 with its shape.
fn fixture(name: &str) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(fixture_dir().join("features.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    let data = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (t.shape().to_vec(), data)
}

fn clip_samples(g: &serde_json::Value) -> Vec<f32> {
    let name = g["feature_clip"].as_str().unwrap();
    let path =
        PathBuf::from("/usr/share/pocketsphinx/test/data/librivox").join(format!("{name}.wav"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup",
        path.display()
    );
    lfm::run::audio::load(&path, 16_000).unwrap().samples
}

#[test]
fn log_mel_matches_openai_whisper() {
    let g = gold();
    let samples = clip_samples(&g);
    for n_mels in [80, 128] {
        let meta = &g["features"][format!("mel_{n_mels}")];
        let (shape, want) = fixture(&format!("mel_{n_mels}"));
        let kept = meta["kept_frames"].as_u64().unwrap() as usize;
        assert_eq!(shape, [n_mels, kept]);
        let filters = MelFilters::load(&common::model("whisper-mel"), n_mels).unwrap();
        let mel = filters.log_mel(&samples);
        assert_eq!(
            mel.total_frames() as u64,
            meta["total_frames"].as_u64().unwrap()
        );
        assert_eq!(
            mel.content_frames() as u64,
            meta["content_frames"].as_u64().unwrap()
        );
        let got = mel.frames(0, kept);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("mel {n_mels}: max |ours - openai-whisper| = {worst:.2e}");
        // The bound; the reference computes its FFT in f32, ours in
        // f64, so a few 1e-6 is expected.
        assert!(
            worst <= 1e-4,
            "mel {n_mels}: max abs difference {worst:.3e} > 1e-4"
        );
        // Past the kept frames every frame is silence: the floor.
        let floor = *want.last().unwrap();
        let tail = mel.frames(mel.total_frames() - 40, 40);
        assert!(
            tail.iter().all(|&v| (v - floor).abs() <= 1e-4),
            "silence frames off the floor"
        );
    }
}

#[test]
fn cpu_encoder_matches_ctranslate2() {
    let g = gold();
    let files = WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap();
    let c = &files.model.config;
    // The encoder input exactly as the fixture fed CTranslate2: the content
    // frames of openai-whisper's features, zero-filled to 30 s.
    let (_, mel) = fixture("mel_80");
    let kept = g["features"]["mel_80"]["kept_frames"].as_u64().unwrap() as usize;
    let content = g["features"]["mel_80"]["content_frames"].as_u64().unwrap() as usize;
    let mut window = vec![0.0f32; c.n_mels * N_FRAMES];
    for m in 0..c.n_mels {
        window[m * N_FRAMES..m * N_FRAMES + content]
            .copy_from_slice(&mel[m * kept..m * kept + content]);
    }
    let out = files.model.encoder.forward(c, &window);
    let (shape, want) = fixture("encoder_out");
    let rows = shape[0];
    assert_eq!(shape, [rows, c.d_model]);
    let got = &out[..rows * c.d_model];
    let num: f64 = got
        .iter()
        .zip(&want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!(
        "encoder: normalised error {:.3e}, max abs {worst:.3e}",
        num / den
    );
    // Same f16 weights widened to f32 on both sides; only the summation
    // order of the GEMMs (MKL/oneDNN vs ours) and erf differ: f32 rounding
    // carried through four layers stays well under 1e-9.
    assert!(num / den < 1e-9, "normalised error {:.3e}", num / den);
    assert!(worst < 1e-3, "max abs difference {worst:.3e}");
}
