//! Voice activity detection against faster-whisper (samples/fixtures/whisper/vad.json,
//! from scripts/fixtures/vad_gold.py): Silero VAD v6 read from the ONNX file
//! faster-whisper ships, scored by our CPU forward, against onnxruntime's
//! probabilities; `get_speech_timestamps` with two sets of options giving
//! the very same chunks (in samples); the transcript of the speech with
//! word timestamps mapped back to the recording as faster-whisper maps
//! them; and silence and noise giving no text.

mod common;

use lfm::models::silero_vad::SileroVad;
use lfm::models::whisper::WhisperFiles;
use lfm::run::transcribe::vad::{get_speech_timestamps, transcribe_speech, Speech, VadOptions};
use lfm::run::transcribe::{CpuBackend, Options};
use std::path::PathBuf;

const CLIPS: &str = "/usr/share/pocketsphinx/test/data/librivox";

fn gold() -> serde_json::Value {
    let path = common::repo().join("samples/fixtures/whisper/vad.json");
    let g: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(g["format_version"], 1);
    g
}

fn vad_model() -> SileroVad {
    SileroVad::load(&common::model("silero-vad").join("silero_vad_v6.onnx")).unwrap()
}

/// The fixture's white noise: a 32-bit LCG, exact in f32.
fn noise(n: usize, state: &mut u32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *state = state.wrapping_mul(1664525).wrapping_add(1013904223);
            ((*state >> 16) as f32 - 32768.0) / 32768.0 / 16.0
        })
        .collect()
}

/// The fixture's test signal: clips, silence and noise in its order.
fn signal(g: &serde_json::Value) -> Vec<f32> {
    let mut state = g["noise"]["seed"].as_u64().unwrap() as u32;
    let mut out = Vec::new();
    for p in g["parts"].as_array().unwrap() {
        let v = &p["value"];
        match p["kind"].as_str().unwrap() {
            "silence" => out.extend(vec![0.0; (v.as_f64().unwrap() * 16_000.0) as usize]),
            "noise" => out.extend(noise((v.as_f64().unwrap() * 16_000.0) as usize, &mut state)),
            _ => {
                let path = PathBuf::from(CLIPS).join(format!("{}.wav", v.as_str().unwrap()));
                out.extend(lfm::run::audio::load(&path, 16_000).unwrap().samples);
            }
        }
    }
    assert_eq!(out.len() as u64, g["samples"].as_u64().unwrap());
    out
}

fn speeches(v: &serde_json::Value) -> Vec<Speech> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| Speech {
            start: s["start"].as_u64().unwrap() as usize,
            end: s["end"].as_u64().unwrap() as usize,
        })
        .collect()
}

fn vad_options(o: &serde_json::Value) -> VadOptions {
    let d = VadOptions::default();
    VadOptions {
        threshold: o["threshold"].as_f64().unwrap_or(d.threshold),
        min_speech_duration_ms: o["min_speech_duration_ms"]
            .as_u64()
            .map_or(d.min_speech_duration_ms, |v| v as u32),
        min_silence_duration_ms: o["min_silence_duration_ms"]
            .as_u64()
            .map_or(d.min_silence_duration_ms, |v| v as u32),
        speech_pad_ms: o["speech_pad_ms"]
            .as_u64()
            .map_or(d.speech_pad_ms, |v| v as u32),
        ..d
    }
}

#[test]
fn speech_chunks_and_transcript_match_faster_whisper() {
    let g = gold();
    let audio = signal(&g);
    let vad = vad_model();
    let probs = vad.speech_probs(&audio);
    let want: Vec<f64> = g["speech_probs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap())
        .collect();
    assert_eq!(probs.len(), want.len());
    let worst = probs
        .iter()
        .zip(&want)
        .map(|(a, b)| (*a as f64 - b).abs())
        .fold(0.0, f64::max);
    eprintln!(
        "{} windows: max |ours - onnxruntime| = {worst:.2e}",
        probs.len()
    );
    // f32 on both sides, summed in other orders, through an LSTM carried
    // across 644 windows: a few 1e-6 expected.
    assert!(worst < 1e-4, "speech probability off by {worst:.3e}");
    // Scored in blocks of 100 windows, the state carried across: the same.
    let blocked = vad.speech_probs_in_blocks(&audio, 100);
    let drift = probs
        .iter()
        .zip(&blocked)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        drift < 1e-6,
        "blocks change the probabilities by {drift:.3e}"
    );

    for case in ["default", "other"] {
        let o = vad_options(&g[case]["options"]);
        let got = get_speech_timestamps(&probs, audio.len(), &o);
        assert_eq!(got, speeches(&g[case]["speeches"]), "{case} options");
    }

    let files = WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap();
    let opts = Options {
        language: Some("en".into()),
        word_timestamps: true,
        ..Options::default()
    };
    let mut encoder = CpuBackend::new(&files.model);
    let t = transcribe_speech(
        &files,
        &mut encoder,
        &vad,
        &audio,
        &opts,
        &VadOptions::default(),
        &mut |_, _| Ok(()),
    )
    .unwrap();
    let want = g["transcript"]["segments"].as_array().unwrap();
    let texts: Vec<&str> = t
        .transcript
        .segments
        .iter()
        .map(|s| s.text.as_str())
        .collect();
    let want_texts: Vec<&str> = want.iter().map(|s| s["text"].as_str().unwrap()).collect();
    assert_eq!(texts, want_texts);
    for (seg, w) in t.transcript.segments.iter().zip(want) {
        assert_eq!(
            (seg.start, seg.end),
            (w["start"].as_f64().unwrap(), w["end"].as_f64().unwrap()),
            "{:?}",
            seg.text
        );
        let words = seg.words.as_ref().unwrap();
        let gw = w["words"].as_array().unwrap();
        assert_eq!(words.len(), gw.len());
        for (a, b) in words.iter().zip(gw) {
            assert_eq!(a.word, b["word"].as_str().unwrap());
            assert_eq!(
                (a.start, a.end),
                (b["start"].as_f64().unwrap(), b["end"].as_f64().unwrap()),
                "{:?}",
                a.word
            );
        }
    }
    let kept: usize = t.speech.iter().map(|s| s.end - s.start).sum();
    assert_eq!(
        kept as f64 / 16_000.0,
        g["transcript"]["duration_after_vad"].as_f64().unwrap()
    );
}

#[test]
fn ten_minutes_of_silence_and_noise_give_no_text() {
    let g = gold();
    assert_eq!(g["quiet"]["segments"].as_array().unwrap().len(), 0);
    // As the fixture's quiet signal (which faster-whisper found empty), ten
    // times longer: 200 s of silence, 400 s of noise.
    let mut state = g["noise"]["seed"].as_u64().unwrap() as u32 + 1;
    let mut audio = vec![0.0f32; 200 * 16_000];
    audio.extend(noise(400 * 16_000, &mut state));
    let vad = vad_model();
    let files = WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap();
    let mut encoder = CpuBackend::new(&files.model);
    let t = transcribe_speech(
        &files,
        &mut encoder,
        &vad,
        &audio,
        &Options::default(),
        &VadOptions::default(),
        &mut |_, _| Ok(()),
    )
    .unwrap();
    assert!(t.speech.is_empty(), "speech found in noise: {:?}", t.speech);
    assert!(t.transcript.segments.is_empty());
    assert_eq!(t.transcript.duration, 600.0);
}
