//! `transcribe` end to end on the CPU: the right words, stdin, output
//! formats, a file longer than one 30 s window, and every kind of bad input
//! the issue lists (clear one-line errors, exit 1, no panic).

mod common;

use common::{assert_clean_failure, assert_usage_failure, run, scratch, stderr, stdout};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_transcribe");
const CLIPS: &str = "/usr/share/pocketsphinx/test/data/librivox";

fn clip(name: &str) -> PathBuf {
    let p = Path::new(CLIPS).join(format!("sense_and_sensibility_01_austen_64kb-{name}.wav"));
    assert!(p.is_file(), "{} is missing: run scripts/setup", p.display());
    p
}

fn model() -> String {
    common::model("whisper-tiny.en").display().to_string()
}

fn transcribe(args: &[&str]) -> std::process::Output {
    let m = model();
    let mut all = vec!["--cpu", "-m", &m];
    all.extend_from_slice(args);
    run(BIN, &all)
}

/// A 16 kHz mono 16-bit WAV of `samples`.
fn write_wav(path: &Path, samples: &[f32]) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for s in samples {
        w.write_sample((s * 32767.0) as i16).unwrap();
    }
    w.finalize().unwrap();
}

#[test]
fn prints_the_words_and_reads_stdin() {
    let o = transcribe(&[clip("0930").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "He might even have been made amiable himself.\n"
    );
    assert!(stderr(&o).contains("real-time factor"), "{}", stderr(&o));

    // The same file through stdin, as SubRip.
    let m = model();
    let mut child = Command::new(BIN)
        .args(["--cpu", "-m", &m, "-f", "srt", "-q", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&std::fs::read(clip("0930")).unwrap())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let srt = stdout(&o);
    assert!(srt.starts_with("1\n00:00:00,000 --> 00:00:0"), "{srt}");
    assert!(
        srt.contains("He might even have been made amiable himself."),
        "{srt}"
    );
    assert!(stderr(&o).is_empty(), "--quiet printed {}", stderr(&o));
}

#[test]
fn long_audio_is_cut_into_windows_and_json_has_segments_and_tokens() {
    // Three clips with 12 s of silence between them: 42 s, two windows.
    let dir = scratch("transcribe-long");
    let mut samples = Vec::new();
    for name in ["0880", "0930", "0890"] {
        samples.extend(lfm::run::audio::load(&clip(name), 16_000).unwrap().samples);
        samples.extend(std::iter::repeat_n(0.0, 12 * 16_000));
    }
    let path = dir.join("long.wav");
    write_wav(&path, &samples);
    let o = transcribe(&["-f", "json", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let segs = j["segments"].as_array().unwrap();
    let text = j["text"].as_str().unwrap().to_lowercase();
    for words in ["young man", "made amiable himself", "rather selfish"] {
        assert!(text.contains(words), "{words:?} missing from {text:?}");
    }
    // The last clip starts at 2 * 12 s + 3.0 s + 3.3 s = 30.3 s: past the
    // first window, so it was found by seeking.
    let last = segs.last().unwrap();
    assert!(last["start"].as_f64().unwrap() > 29.0, "{last}");
    assert!(last["seek"].as_u64().unwrap() > 0, "{last}");
    let mut prev_end = 0.0;
    for s in segs {
        let (start, end) = (s["start"].as_f64().unwrap(), s["end"].as_f64().unwrap());
        assert!(
            start >= prev_end - 1e-9 && end > start,
            "segments out of order: {segs:?}"
        );
        prev_end = end;
        let tokens = s["tokens"].as_array().unwrap();
        assert!(!tokens.is_empty());
        assert!(tokens.iter().all(|t| t["logprob"].as_f64().unwrap() <= 0.0));
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn silence_gives_an_empty_transcript() {
    let dir = scratch("transcribe-silence");
    let path = dir.join("silence.wav");
    write_wav(&path, &vec![0.0; 10 * 16_000]);
    let o = transcribe(&["-f", "json", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        j["segments"].as_array().unwrap().len(),
        0,
        "hallucinated: {j}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_input_fails_cleanly() {
    let dir = scratch("transcribe-bad");
    let text = dir.join("notes.wav");
    std::fs::write(&text, "this is not audio\n".repeat(50)).unwrap();
    assert_clean_failure(
        &transcribe(&[text.to_str().unwrap()]),
        &["notes.wav", "not"],
    );

    let empty = dir.join("empty.wav");
    std::fs::write(&empty, b"").unwrap();
    assert_clean_failure(
        &transcribe(&[empty.to_str().unwrap()]),
        &["empty.wav", "empty"],
    );

    let zero = dir.join("zero.wav");
    write_wav(&zero, &[]);
    assert_clean_failure(
        &transcribe(&[zero.to_str().unwrap()]),
        &["zero.wav", "no audio samples"],
    );

    let missing = dir.join("missing.wav");
    assert_clean_failure(&transcribe(&[missing.to_str().unwrap()]), &["missing.wav"]);

    let c = clip("0880");
    let c = c.to_str().unwrap();
    assert_clean_failure(
        &transcribe(&["-l", "xx", c]),
        &["unknown language code \"xx\""],
    );
    assert_clean_failure(&transcribe(&["-l", "fr", c]), &["English-only"]);
    assert_clean_failure(&transcribe(&["--task", "translate", c]), &["multilingual"]);

    let o = run(BIN, &["--cpu", "-m", dir.to_str().unwrap(), c]);
    assert_clean_failure(&o, &["model.bin"]);

    let o = run(BIN, &["--cpu", "--beam-size", "0", c]);
    assert_eq!(o.status.code(), Some(2), "bad command line: {}", stderr(&o));

    // An unknown compute type names the accepted ones; int8 is the CPU's.
    let o = run(BIN, &["--cpu", "--compute-type", "bogus", c]);
    assert_usage_failure(&o, &["bogus", "--compute-type"]);
    assert!(
        stderr(&o).contains("[possible values: float32, int8]"),
        "{}",
        stderr(&o)
    );
    let o = run(BIN, &["--compute-type", "int8", c]);
    assert_usage_failure(&o, &["int8", "--cpu"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn umbrella_runs_transcribe() {
    let m = model();
    let o = run(
        env!("CARGO_BIN_EXE_lfm"),
        &[
            "transcribe",
            "--cpu",
            "-q",
            "-m",
            &m,
            clip("0880").to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "He was not an old-sposed young man.\n");
}

#[test]
fn word_timestamps_in_json_and_subtitles() {
    let c = clip("0930");
    let c = c.to_str().unwrap();
    let o = transcribe(&["--word-timestamps", "-f", "json", c]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let words = j["segments"][0]["words"].as_array().unwrap();
    let text: Vec<&str> = words.iter().map(|w| w["word"].as_str().unwrap()).collect();
    assert_eq!(
        text,
        [
            " He",
            " might",
            " even",
            " have",
            " been",
            " made",
            " amiable",
            " himself."
        ]
    );
    for w in words {
        let (s, e, p) = (
            w["start"].as_f64().unwrap(),
            w["end"].as_f64().unwrap(),
            w["probability"].as_f64().unwrap(),
        );
        assert!(s <= e && p > 0.0 && p <= 1.0, "{w}");
    }

    // Lines of at most 20 characters, one line a cue (faster-whisper's
    // word times for this clip, samples/fixtures/whisper/words.json).
    let o = transcribe(&[
        "--word-timestamps",
        "-f",
        "vtt",
        "--max-line-width",
        "20",
        "--max-line-count",
        "1",
        c,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "WEBVTT\n\n00:00.000 --> 00:01.220\nHe might even have\n\n\
         00:01.220 --> 00:02.320\nbeen made amiable\n\n\
         00:02.320 --> 00:02.800\nhimself.\n\n"
    );

    // Layout flags without word timestamps, or for text output: usage errors.
    for args in [
        &["--max-line-width", "20", c][..],
        &["--word-timestamps", "--highlight-words", c][..],
        &["--word-timestamps", "-f", "srt", "--max-line-count", "2", c][..],
    ] {
        let o = transcribe(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn vad_skips_silence_and_noise() {
    let dir = scratch("transcribe-vad");
    // 20 s of silence, a clip, 40 s of low white noise (an LCG, as the VAD
    // fixture's noise).
    let mut samples = vec![0.0f32; 20 * 16_000];
    samples.extend(
        lfm::run::audio::load(&clip("0930"), 16_000)
            .unwrap()
            .samples,
    );
    let mut state = 7u32;
    samples.extend((0..40 * 16_000).map(|_| {
        state = state.wrapping_mul(1664525).wrapping_add(1013904223);
        ((state >> 16) as f32 - 32768.0) / 32768.0 / 16.0
    }));
    let path = dir.join("quiet.wav");
    write_wav(&path, &samples);
    let o = transcribe(&["--vad", "-f", "json", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let segs = j["segments"].as_array().unwrap();
    assert_eq!(segs.len(), 1, "{j}");
    assert_eq!(
        segs[0]["text"].as_str().unwrap().trim(),
        "He might even have been made amiable himself."
    );
    // Times are the recording's: the clip starts 20 s in.
    let start = segs[0]["start"].as_f64().unwrap();
    assert!((19.0..21.0).contains(&start), "{start}");
    assert!(
        stderr(&o).contains("from 1 speech chunks"),
        "{}",
        stderr(&o)
    );

    // VAD options without --vad, and a model file that is not one.
    let p = path.to_str().unwrap();
    let o = transcribe(&["--vad-threshold", "0.3", p]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let bogus = dir.join("vad.onnx");
    std::fs::write(&bogus, "not a model").unwrap();
    assert_clean_failure(
        &transcribe(&["--vad", "--vad-model", bogus.to_str().unwrap(), p]),
        &["vad.onnx"],
    );
    let layout = common::model("layout-cdla").join("layout_cdla.onnx");
    assert_clean_failure(
        &transcribe(&["--vad", "--vad-model", layout.to_str().unwrap(), p]),
        &["layout_cdla.onnx", "not the Silero VAD"],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn one_bad_file_among_many_is_reported_and_the_rest_transcribed() {
    let dir = scratch("transcribe-many-bad");
    let bad = dir.join("notes.wav");
    std::fs::write(&bad, "this is not audio\n".repeat(50)).unwrap();
    let out = dir.join("out");
    let good = clip("0930");
    let o = transcribe(&[
        bad.to_str().unwrap(),
        good.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("notes.wav"), "{err}");
    assert!(err.contains("1 of 2 inputs failed"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let text =
        std::fs::read_to_string(out.join("sense_and_sensibility_01_austen_64kb-0930.txt")).unwrap();
    assert_eq!(text, "He might even have been made amiable himself.\n");
    assert!(!out.join("notes.txt").exists());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn batches_of_many_inputs_report_a_bad_one_and_transcribe_the_rest() {
    let dir = scratch("transcribe-batch-bad");
    let bad = dir.join("notes.wav");
    std::fs::write(&bad, "this is not audio\n".repeat(50)).unwrap();
    let empty = dir.join("empty.wav");
    write_wav(&empty, &[]);
    let out = dir.join("out");
    let (a, b) = (clip("0930"), clip("0880"));
    // Three windows a batch: the two clips share one, the bad inputs are
    // reported by name between them.
    let o = transcribe(&[
        "--batch-size",
        "3",
        a.to_str().unwrap(),
        bad.to_str().unwrap(),
        empty.to_str().unwrap(),
        b.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-f",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    for name in [
        "notes.wav",
        "empty.wav",
        "2 of 4 inputs failed",
        "batches of 3",
    ] {
        assert!(err.contains(name), "{name}: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    for (name, text) in [
        ("0930", " He might even have been made amiable himself."),
        ("0880", " He was not an old-sposed young man."),
    ] {
        let json: serde_json::Value = serde_json::from_slice(
            &std::fs::read(out.join(format!("sense_and_sensibility_01_austen_64kb-{name}.json")))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(json["text"], text, "{name}");
        assert_eq!(json["segments"][0]["seek"], 0, "{name}");
    }
    assert!(!out.join("notes.json").exists());
    assert!(!out.join("empty.json").exists());
    assert_eq!(
        transcribe(&["--batch-size", "0", a.to_str().unwrap()])
            .status
            .code(),
        Some(2)
    );
    std::fs::remove_dir_all(dir).unwrap();
}
