//! Whisper on the GPU against the CPU reference on real 30 s windows: the
//! encoder (conv stem included), the decoder's logits step by step (prompt,
//! forked and reordered sequences), and whole transcripts, greedy and beam
//! search, token for token against faster-whisper's (gold.json). On Mesa
//! lavapipe in CI.

mod common;

use lfm::gpu::{Gpu, GpuOptions};
use lfm::models::whisper::gpu::{GpuBackend, GpuEncoder};
use lfm::models::whisper::WhisperFiles;
use lfm::run::transcribe::{transcribe, Backend, CpuBackend, Options, Task};
use std::path::PathBuf;
use std::sync::Arc;

const CLIPS: &str = "/usr/share/pocketsphinx/test/data/librivox";
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

#[test]
fn gpu_encoder_matches_cpu() {
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
}

#[test]
fn gpu_decoder_logits_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let files = WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap();
    let m = &files.model;
    let s = &files.tokenizer.specials;
    let samples = lfm::run::audio::load(std::path::Path::new(CLIP), 16_000)
        .unwrap()
        .samples;
    let mel = files.mel.log_mel(&samples);
    let window = mel.window(0, mel.content_frames());
    let mut cpu = CpuBackend::new(m);
    let mut gpu = GpuBackend::new(gpu, m, 3).unwrap();
    cpu.encode(&window).unwrap();
    gpu.encode(&window).unwrap();
    // A previous-text prompt, so the prompt pass has many rows; logits of
    // two of them, as decoding reads.
    let mut prompt = vec![s.sot_prev];
    prompt.extend(
        files
            .tokenizer
            .encode(" He was not an ill disposed")
            .unwrap(),
    );
    let sot = prompt.len();
    prompt.push(s.sot);
    let rows = [sot, prompt.len() - 1];
    let check = |what: &str, got: Vec<f32>, want: Vec<f32>| {
        let err = normalised_error(&got, &want);
        eprintln!("{what}: normalised error {err:.3e}");
        // f32 on both sides, f16 weights widened alike; sums in another
        // order through four layers and the 51864-wide head: ~1e-12 seen,
        // a wrong row or position is O(1).
        assert!(err < 1e-9, "{what}: normalised error {err:.3e}");
    };
    check(
        "prompt",
        gpu.prompt(&prompt, &rows).unwrap(),
        cpu.prompt(&prompt, &rows).unwrap(),
    );
    // Fork into three sequences, step, reorder (one dropped, one doubled),
    // step, then keep one and step again.
    let steps: [(&[usize], &[u32]); 3] = [
        (&[0, 0, 0], &[s.timestamp_begin, 440, 1544]),
        (&[2, 0, 2], &[373, 407, 13]),
        (&[1], &[50]),
    ];
    for (i, (sources, tokens)) in steps.iter().enumerate() {
        cpu.select(sources).unwrap();
        gpu.select(sources).unwrap();
        check(
            &format!("step {i}"),
            gpu.step(tokens).unwrap(),
            cpu.step(tokens).unwrap(),
        );
    }
    assert!(
        gpu.select(&[0, 0, 0, 0]).is_err(),
        "more sequences than the decoder holds"
    );
}

/// faster-whisper's options of gold.json, as ours.
fn gold_options(gold: &serde_json::Value, beam_size: usize) -> Options {
    let o = &gold["options"];
    let f = |k: &str| o[k].as_f64().unwrap() as f32;
    Options {
        language: Some("en".into()),
        task: Task::Transcribe,
        temperatures: o["temperature"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_f64().unwrap() as f32)
            .collect(),
        best_of: o["best_of"].as_u64().unwrap() as usize,
        beam_size,
        patience: f("patience"),
        length_penalty: None,
        compression_ratio_threshold: Some(f("compression_ratio_threshold")),
        logprob_threshold: Some(f("log_prob_threshold")),
        no_speech_threshold: Some(f("no_speech_threshold")),
        max_initial_timestamp: Some(f("max_initial_timestamp")),
        ..Options::default()
    }
}

/// Every segment's tokens, timestamps included.
fn token_ids(t: &lfm::run::transcribe::Transcript) -> Vec<Vec<u64>> {
    t.segments
        .iter()
        .map(|s| s.tokens.iter().map(|t| t.id as u64).collect())
        .collect()
}

#[test]
fn gpu_transcripts_match_faster_whisper() {
    let Some(gpu) = gpu() else { return };
    let gold: serde_json::Value = serde_json::from_slice(
        &std::fs::read(common::repo().join("samples/fixtures/whisper/gold.json")).unwrap(),
    )
    .unwrap();
    let files = WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap();
    let mut backend = GpuBackend::new(gpu, &files.model, 5).unwrap();
    // Two clips greedy, one with beam search: each 30 s window costs
    // lavapipe ~30 s of encoder (CI time).
    for (beam, take) in [(1, 2), (5, 1)] {
        let opts = gold_options(&gold, beam);
        let fw = &gold["faster_whisper"][format!("beam_size_{beam}")]["clips"];
        for clip in fw.as_array().unwrap().iter().take(take) {
            let name = clip["clip"].as_str().unwrap();
            let path = PathBuf::from(CLIPS).join(format!("{name}.wav"));
            let samples = lfm::run::audio::load(&path, 16_000).unwrap().samples;
            let t = transcribe(&files, &mut backend, &samples, &opts, &mut |_, _| Ok(())).unwrap();
            let want: Vec<Vec<u64>> = clip["segments"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    s["tokens"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| t.as_u64().unwrap())
                        .collect()
                })
                .collect();
            eprintln!("beam {beam} {name}: {}", t.text.trim());
            assert_eq!(
                t.text.trim(),
                clip["text"].as_str().unwrap().trim(),
                "beam {beam} {name}"
            );
            assert_eq!(token_ids(&t), want, "beam {beam} {name}: tokens");
        }
    }
}
