//! Word timestamps against faster-whisper's `word_timestamps=True`
//! (samples/fixtures/whisper/words.json, from
//! scripts/fixtures/whisper_words_gold.py) on the CPU reference: the same
//! words and segments, and every word boundary within 20 ms (the issue's
//! bound). The distribution of the differences is printed.
//!
//! Run on the five LibriVox clips concatenated twice (49 s: three windows,
//! the later ones starting where the last word of the one before ended)
//! and on the shortest clip alone.

mod common;

use lfm::models::whisper::WhisperFiles;
use lfm::run::transcribe::{transcribe, CpuBackend, Options, Transcript};
use std::path::PathBuf;

const CLIPS: &str = "/usr/share/pocketsphinx/test/data/librivox";

fn gold() -> serde_json::Value {
    let path = common::repo().join("samples/fixtures/whisper/words.json");
    let g: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(g["format_version"], 1);
    g
}

fn samples(name: &str) -> Vec<f32> {
    let path = PathBuf::from(CLIPS).join(format!("{name}.wav"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup",
        path.display()
    );
    lfm::run::audio::load(&path, 16_000).unwrap().samples
}

/// The options of the gold run (gold.json's, beam size 1, word timestamps).
fn options(g: &serde_json::Value) -> Options {
    let o = &g["options"];
    let f = |k: &str| o[k].as_f64().unwrap() as f32;
    Options {
        language: Some(o["language"].as_str().unwrap().into()),
        temperatures: o["temperature"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_f64().unwrap() as f32)
            .collect(),
        best_of: o["best_of"].as_u64().unwrap() as usize,
        beam_size: o["beam_size"].as_u64().unwrap() as usize,
        compression_ratio_threshold: Some(f("compression_ratio_threshold")),
        logprob_threshold: Some(f("log_prob_threshold")),
        no_speech_threshold: Some(f("no_speech_threshold")),
        word_timestamps: o["word_timestamps"].as_bool().unwrap(),
        prepend_punctuations: o["prepend_punctuations"].as_str().unwrap().into(),
        append_punctuations: o["append_punctuations"].as_str().unwrap().into(),
        ..Options::default()
    }
}

/// Compares one transcript with its gold clip; returns |ours - gold| of
/// every word start and end, in seconds.
fn compare(name: &str, ours: &Transcript, gold: &serde_json::Value) -> Vec<f64> {
    let want = gold["segments"].as_array().unwrap();
    let got: Vec<String> = ours.segments.iter().map(|s| s.text.clone()).collect();
    let want_text: Vec<&str> = want.iter().map(|s| s["text"].as_str().unwrap()).collect();
    assert_eq!(got, want_text, "{name}: segments differ");
    let mut diffs = Vec::new();
    for (seg, gs) in ours.segments.iter().zip(want) {
        let words = seg.words.as_ref().expect("words were asked for");
        let gw = gs["words"].as_array().unwrap();
        let got: Vec<&str> = words.iter().map(|w| w.word.as_str()).collect();
        let want: Vec<&str> = gw.iter().map(|w| w["word"].as_str().unwrap()).collect();
        assert_eq!(got, want, "{name}: words of {:?}", seg.text);
        for (w, g) in words.iter().zip(gw) {
            diffs.push((w.start - g["start"].as_f64().unwrap()).abs());
            diffs.push((w.end - g["end"].as_f64().unwrap()).abs());
            let p = g["probability"].as_f64().unwrap();
            // Probabilities of the same f16 weights in f32 on both sides.
            assert!(
                (w.probability - p).abs() < 2e-3,
                "{name}: {:?} probability {} vs {p}",
                w.word,
                w.probability
            );
        }
        diffs.push((seg.start - gs["start"].as_f64().unwrap()).abs());
        diffs.push((seg.end - gs["end"].as_f64().unwrap()).abs());
        assert_eq!(
            seg.seek as u64,
            gs["seek"].as_u64().unwrap(),
            "{name}: seek"
        );
    }
    diffs
}

#[test]
fn word_timestamps_match_faster_whisper() {
    let g = gold();
    let files = WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap();
    let opts = options(&g);
    let clips = g["clips"].as_array().unwrap();
    let concatenated = &g["concatenated"];
    let mut all = Vec::new();
    for clip in clips {
        let name = clip["clip"].as_str().unwrap();
        let audio = if name == concatenated["name"] {
            let parts: Vec<Vec<f32>> = concatenated["clips"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| samples(c.as_str().unwrap()))
                .collect();
            parts
                .concat()
                .repeat(concatenated["times"].as_u64().unwrap() as usize)
        } else if name.ends_with("0880") {
            samples(name)
        } else {
            continue;
        };
        let mut encoder = CpuBackend::new(&files.model);
        let t = transcribe(&files, &mut encoder, &audio, &opts, &mut |_, _| Ok(())).unwrap();
        let diffs = compare(name, &t, clip);
        let exact = diffs.iter().filter(|&&d| d < 1e-9).count();
        let worst = diffs.iter().copied().fold(0.0, f64::max);
        eprintln!(
            "{name}: {} boundaries, {exact} identical, worst {:.0} ms",
            diffs.len(),
            worst * 1000.0
        );
        all.extend(diffs);
    }
    assert!(all.len() > 200, "too few boundaries compared");
    all.sort_by(f64::total_cmp);
    let pct = |q: f64| all[((all.len() - 1) as f64 * q).round() as usize] * 1000.0;
    eprintln!(
        "|ours - faster-whisper| over {} boundaries: median {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        all.len(),
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(1.0)
    );
    assert!(
        pct(1.0) <= 20.0 + 1e-6,
        "a word boundary is {:.0} ms from faster-whisper's (bound 20 ms)",
        pct(1.0)
    );
}
