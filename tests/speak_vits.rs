//! The VITS port (CPU reference) against onnxruntime running the same Piper
//! ONNX file on the same phoneme ids with the noise scales at 0
//! (samples/fixtures/speak/hello.*, from scripts/fixtures/piper_gold.py).

use lfm::models::vits::{Scales, Vits};
use lfm::util::rng::Rng;
use safetensors::SafeTensors;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub struct Gold {
    pub ids: Vec<i64>,
    pub audio: Vec<f32>,
    pub durations: Vec<f32>,
    pub decoder_input: Vec<f32>,
}

pub fn gold() -> Gold {
    let dir = root().join("samples/fixtures/speak");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("hello.json")).unwrap()).unwrap();
    assert_eq!(meta["format_version"], 1);
    assert_eq!(meta["noise_scale"], 0.0);
    assert_eq!(meta["noise_w"], 0.0);
    assert_eq!(meta["length_scale"], 1.0);
    let bytes = std::fs::read(dir.join("hello.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let f32s =
        |name: &str| -> Vec<f32> { bytemuck::pod_collect_to_vec(st.tensor(name).unwrap().data()) };
    Gold {
        ids: serde_json::from_value(meta["ids"].clone()).unwrap(),
        audio: f32s("audio"),
        durations: f32s("durations"),
        decoder_input: f32s("decoder_input"),
    }
}

pub fn voice() -> Vits {
    let p = root().join("samples/models/piper-joe/en_US-joe-medium.onnx");
    assert!(p.exists(), "{} is missing: run scripts/setup", p.display());
    Vits::open(&p).unwrap()
}

/// Largest absolute difference and signal-to-noise ratio in dB.
pub fn compare(got: &[f32], want: &[f32]) -> (f32, f64) {
    assert_eq!(got.len(), want.len(), "length");
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let sig: f64 = want.iter().map(|v| (*v as f64).powi(2)).sum();
    let noise: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    (max, 10.0 * (sig / noise.max(1e-30)).log10())
}

const ZERO_NOISE: Scales = Scales {
    noise_scale: 0.0,
    length_scale: 1.0,
    noise_w: 0.0,
};

#[test]
fn cpu_waveform_matches_onnxruntime() {
    let g = gold();
    let v = voice();
    assert_eq!(v.config.sample_rate, 22050);
    let lat = v.latent(&g.ids, &ZERO_NOISE, &mut Rng::new(0)).unwrap();
    let want_d: Vec<usize> = g.durations.iter().map(|&d| d as usize).collect();
    assert_eq!(lat.durations, want_d, "frames per phoneme");
    let (max, snr) = compare(&lat.z, &g.decoder_input);
    eprintln!("decoder input: max abs err {max:.2e}, SNR {snr:.1} dB");
    assert!(max <= 1e-3, "decoder input max abs err {max}");
    let audio = v.dec.forward(&lat.z, lat.frames);
    let (max, snr) = compare(&audio, &g.audio);
    eprintln!(
        "audio ({} samples): max abs err {max:.2e}, SNR {snr:.1} dB",
        audio.len()
    );
    // The bar: max abs error <= 1e-3 or SNR >= 40 dB.
    assert!(
        max <= 1e-3 || snr >= 40.0,
        "max abs err {max}, SNR {snr} dB"
    );
}

/// The GPU generator on onnxruntime's own decoder input: the waveform must
/// meet the same bar as the CPU path.
#[test]
fn gpu_waveform_matches_onnxruntime() {
    use lfm::gpu::{Gpu, GpuOptions};
    let gpu = match Gpu::new(&GpuOptions::default()) {
        Ok(g) => std::sync::Arc::new(g),
        Err(e) if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() => {
            eprintln!("SKIPPING GPU test (LFM_SKIP_GPU_TESTS set): {e}");
            return;
        }
        Err(e) => panic!("GPU tests need an adapter ({e}); set LFM_SKIP_GPU_TESTS=1 to skip them"),
    };
    eprintln!("{}", gpu.describe());
    let g = gold();
    let v = voice();
    let dec = lfm::models::vits::GpuGenerator::new(gpu, &v.dec).unwrap();
    let frames = g.decoder_input.len() / v.inter_channels();
    let t0 = std::time::Instant::now();
    let audio = dec.forward(&g.decoder_input, frames).unwrap();
    let (max, snr) = compare(&audio, &g.audio);
    eprintln!(
        "gpu audio ({} samples, {:.2} s): max abs err {max:.2e}, SNR {snr:.1} dB",
        audio.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        max <= 1e-3 || snr >= 40.0,
        "max abs err {max}, SNR {snr} dB"
    );
}
