//! The batched pipeline (`transcribe --batch-size`) on the CPU against
//! faster-whisper's `BatchedInferencePipeline` (batched.json, from
//! scripts/fixtures/whisper_batched_gold.py): 30 s clips of a 59.5 s
//! recording, greedy and beam 5, with word timestamps, with VAD, and five
//! inputs batched across each other, token for token; and the sequential
//! pipeline where the two pipelines' rules agree.

mod common;

use lfm::models::silero_vad::SileroVad;
use lfm::models::whisper::WhisperFiles;
use lfm::run::transcribe::batch::transcribe_batched;
use lfm::run::transcribe::vad::VadOptions;
use lfm::run::transcribe::{transcribe, CpuBackend, Options, Transcript};
use std::path::PathBuf;
use std::sync::OnceLock;

const CLIPS: &str = "/usr/share/pocketsphinx/test/data/librivox";

fn gold() -> &'static serde_json::Value {
    static G: OnceLock<serde_json::Value> = OnceLock::new();
    G.get_or_init(|| {
        serde_json::from_slice(
            &std::fs::read(common::repo().join("samples/fixtures/whisper/batched.json")).unwrap(),
        )
        .unwrap()
    })
}

fn files() -> &'static WhisperFiles {
    static FILES: OnceLock<WhisperFiles> = OnceLock::new();
    FILES.get_or_init(|| WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap())
}

fn names() -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(CLIPS)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().to_string();
            name.strip_suffix(".wav").map(str::to_string)
        })
        .collect();
    n.sort();
    n
}

fn clip(name: &str) -> Vec<f32> {
    let path = PathBuf::from(CLIPS).join(format!("{name}.wav"));
    lfm::run::audio::load(&path, 16_000).unwrap().samples
}

/// The clips twice, each followed by 1 s of silence (the fixture's "x2").
fn recording() -> Vec<f32> {
    let mut x = Vec::new();
    for _ in 0..2 {
        for n in names() {
            x.extend(clip(&n));
            x.extend(std::iter::repeat_n(0.0, 16_000));
        }
    }
    x
}

/// The fixture's options (faster-whisper's batched pipeline at temperature 0).
fn options(beam_size: usize, word_timestamps: bool) -> Options {
    let o = &gold()["options"];
    Options {
        language: Some("en".into()),
        temperatures: vec![o["temperature"].as_f64().unwrap() as f32],
        best_of: o["best_of"].as_u64().unwrap() as usize,
        beam_size,
        word_timestamps,
        ..Options::default()
    }
}

/// Checks a transcript against a gold case: the same segments with the
/// same tokens and text, times within `tolerance` seconds; words too.
fn compare(case: &str, t: &Transcript, tolerance: f64) {
    let want = gold()["cases"][case].as_array().unwrap();
    let texts: Vec<&str> = t.segments.iter().map(|s| s.text.as_str()).collect();
    let want_texts: Vec<&str> = want.iter().map(|s| s["text"].as_str().unwrap()).collect();
    assert_eq!(texts, want_texts, "{case}: segments");
    for (s, w) in t.segments.iter().zip(want) {
        let ids: Vec<u64> = s.tokens.iter().map(|t| t.id as u64).collect();
        let want_ids: Vec<u64> = w["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(ids, want_ids, "{case}: tokens of {:?}", s.text);
        for (got, key) in [(s.start, "start"), (s.end, "end")] {
            let g = w[key].as_f64().unwrap();
            assert!(
                (got - g).abs() <= tolerance,
                "{case}: {:?} {key} {got} against {g}",
                s.text
            );
        }
        if let Some(gw) = w.get("words") {
            let words = s.words.as_ref().expect("words were asked for");
            let gw = gw.as_array().unwrap();
            let got: Vec<&str> = words.iter().map(|w| w.word.as_str()).collect();
            let want: Vec<&str> = gw.iter().map(|w| w["word"].as_str().unwrap()).collect();
            assert_eq!(got, want, "{case}: words of {:?}", s.text);
            for (w, g) in words.iter().zip(gw) {
                for (got, key) in [(w.start, "start"), (w.end, "end")] {
                    let g = g[key].as_f64().unwrap();
                    assert!(
                        (got - g).abs() <= tolerance,
                        "{case}: word {:?} {key} {got} against {g}",
                        w.word
                    );
                }
            }
        }
    }
}

#[test]
fn batched_recording_matches_faster_whisper() {
    let files = files();
    let x2 = recording();
    let mut cpu = CpuBackend::new(&files.model);
    // Both 30 s clips in one batch, greedy and beam 5; times are
    // faster-whisper's own (rounded to 3 decimals from the same tokens).
    for (case, beam, words) in [
        ("x2 clips beam 1", 1, false),
        ("x2 clips beam 5", 5, false),
        ("x2 clips beam 1 words", 1, true),
    ] {
        let t = transcribe_batched(files, &mut cpu, &[&x2], &options(beam, words), None, 2)
            .unwrap()
            .remove(0);
        eprintln!("{case}: {}", t.text);
        // Times are faster-whisper's own, to the last decimal it rounds to:
        // the same tokens, and the same alignment in f32 on both sides.
        compare(case, &t, 1e-9);
    }
}

#[test]
fn batched_vad_chunks_match_faster_whisper() {
    let files = files();
    let x2 = recording();
    let vad = SileroVad::load(&common::repo().join("samples/models/silero-vad/silero_vad_v6.onnx"))
        .unwrap();
    // faster-whisper's batched VAD defaults: 160 ms of silence ends a
    // chunk, chunks of at most 30 s.
    let o = VadOptions {
        min_silence_duration_ms: 160,
        ..VadOptions::default()
    };
    let mut cpu = CpuBackend::new(&files.model);
    let t = transcribe_batched(
        files,
        &mut cpu,
        &[&x2],
        &options(1, false),
        Some((&vad, &o)),
        4,
    )
    .unwrap()
    .remove(0);
    eprintln!("x2 vad: {}", t.text);
    // Times mapped back to the recording through the speech chunks (and
    // rounded to 10 ms) as faster-whisper's map does.
    compare("x2 vad beam 1", &t, 1e-9);
}

#[test]
fn inputs_batched_together_match_each_alone_and_faster_whisper() {
    let files = files();
    let names = names();
    let clips: Vec<Vec<f32>> = names.iter().map(|n| clip(n)).collect();
    let signals: Vec<&[f32]> = clips.iter().map(Vec::as_slice).collect();
    let opts = options(1, false);
    let mut cpu = CpuBackend::new(&files.model);
    // Five inputs in batches of three: windows of different inputs share
    // a batch, and each gets its own transcript.
    let batched = transcribe_batched(files, &mut cpu, &signals, &opts, None, 3).unwrap();
    for (n, t) in names.iter().zip(&batched) {
        compare(&format!("clip {n}"), t, 1e-9);
    }
    // Where the pipelines' rules agree, the sequential one gives the same
    // tokens: a clip under 30 s has one window whose features are the
    // same, no previous text, and (here) no fallback or silence skipped.
    let sequential_opts = Options {
        language: Some("en".into()),
        ..Options::default()
    };
    for ((n, signal), b) in names.iter().zip(&signals).zip(&batched) {
        let s = transcribe(
            files,
            &mut cpu,
            signal,
            &sequential_opts,
            &mut |_, _| Ok(()),
        )
        .unwrap();
        assert!(s.segments.iter().all(|seg| seg.temperature == 0.0));
        let ids = |t: &Transcript| -> Vec<Vec<u32>> {
            t.segments
                .iter()
                .map(|s| s.tokens.iter().map(|t| t.id).collect())
                .collect()
        };
        assert_eq!(ids(&s), ids(b), "{n}: sequential and batched tokens");
    }
}
