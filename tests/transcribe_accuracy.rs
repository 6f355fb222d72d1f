//! Word error rate of Whisper tiny.en on the five LibriVox clips of Debian's
//! pocketsphinx-testdata, on the CPU reference, side by side with
//! faster-whisper run on the same CTranslate2 files with the same decoding
//! options (samples/fixtures/whisper/gold.json). Ours may not exceed
//! faster-whisper's by more than one point.
//!
//! Our transcripts and WER are recorded in samples/fixtures/whisper/lfm.json
//! (`LFM_BLESS=1 cargo test --test transcribe_accuracy` rewrites it); the
//! test also fails when the transcripts drift from that record.

mod common;

use lfm::models::whisper::WhisperFiles;
use lfm::run::transcribe::{transcribe, CpuBackend, Options, Task};
use std::path::PathBuf;

const CLIPS: &str = "/usr/share/pocketsphinx/test/data/librivox";

/// Must match `normalise` in scripts/fixtures/whisper_gold.py: lower case,
/// anything but letters, digits and apostrophes becomes a space, titles
/// spelled out as the reference transcripts spell them.
fn normalise(text: &str) -> Vec<String> {
    let lowered: String = text
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '\'' {
                c
            } else {
                ' '
            }
        })
        .collect();
    lowered
        .split_whitespace()
        .map(|w| w.trim_matches('\''))
        .filter(|w| !w.is_empty())
        .map(|w| match w {
            "mr" => "mister",
            "mrs" => "missus",
            "dr" => "doctor",
            w => w,
        })
        .map(str::to_string)
        .collect()
}

fn edit_distance(a: &[String], b: &[String]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, x) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, y) in b.iter().enumerate() {
            cur.push(
                (prev[j + 1] + 1)
                    .min(cur[j] + 1)
                    .min(prev[j] + usize::from(x != y)),
            );
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The options faster-whisper was run with, as ours.
fn options(gold: &serde_json::Value, beam_size: usize) -> Options {
    let o = &gold["options"];
    let f = |k: &str| o[k].as_f64().unwrap() as f32;
    Options {
        language: Some(o["language"].as_str().unwrap().to_string()),
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
        // faster-whisper's length_penalty 1 is openai-whisper's default
        // ranking: log probability / length.
        length_penalty: None,
        compression_ratio_threshold: Some(f("compression_ratio_threshold")),
        logprob_threshold: Some(f("log_prob_threshold")),
        no_speech_threshold: Some(f("no_speech_threshold")),
        condition_on_previous_text: o["condition_on_previous_text"].as_bool().unwrap(),
        initial_prompt: None,
        without_timestamps: o["without_timestamps"].as_bool().unwrap(),
        max_initial_timestamp: Some(f("max_initial_timestamp")),
        suppress_blank: o["suppress_blank"].as_bool().unwrap(),
        seed: 0,
        ..Options::default()
    }
}

#[test]
fn wer_within_one_point_of_faster_whisper() {
    let fixtures = common::repo().join("samples/fixtures/whisper");
    let gold: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures.join("gold.json")).unwrap()).unwrap();
    assert_eq!(gold["format_version"], 1);
    let files = WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap();
    let refs = gold["references"].as_object().unwrap();
    let fw = &gold["faster_whisper"]["beam_size_1"];
    let opts = options(&gold, 1);

    let mut ours = serde_json::Map::new();
    let (mut our_errors, mut fw_errors, mut words) = (0, 0, 0);
    eprintln!("{:<45} {:>4} {:>4}  text", "clip", "ours", "fw");
    for clip in fw["clips"].as_array().unwrap() {
        let name = clip["clip"].as_str().unwrap();
        let path = PathBuf::from(CLIPS).join(format!("{name}.wav"));
        assert!(
            path.is_file(),
            "{} is missing: run scripts/setup",
            path.display()
        );
        let audio = lfm::run::audio::load(&path, 16_000).unwrap();
        let mut encoder = CpuBackend::new(&files.model);
        let t = transcribe(&files, &mut encoder, &audio.samples, &opts, &mut |_, _| {
            Ok(())
        })
        .unwrap();
        let text = t.text.trim().to_string();
        let reference = normalise(refs[name].as_str().unwrap());
        let e_ours = edit_distance(&reference, &normalise(&text));
        let e_fw = edit_distance(&reference, &normalise(clip["text"].as_str().unwrap()));
        // Both normalisers agree on faster-whisper's text.
        assert_eq!(
            e_fw as u64,
            clip["errors"].as_u64().unwrap(),
            "{name}: normalisers disagree"
        );
        eprintln!("{name:<45} {e_ours:>4} {e_fw:>4}  {text}");
        our_errors += e_ours;
        fw_errors += e_fw;
        words += reference.len();
        ours.insert(
            name.to_string(),
            serde_json::json!({ "text": text, "errors": e_ours }),
        );
    }
    let wer = 100.0 * our_errors as f64 / words as f64;
    let fw_wer = 100.0 * fw_errors as f64 / words as f64;
    eprintln!("WER: lfm {wer:.2}% ({our_errors}/{words}), faster-whisper {fw_wer:.2}% ({fw_errors}/{words})");
    assert!(
        wer <= fw_wer + 1.0,
        "WER {wer:.2}% exceeds faster-whisper's {fw_wer:.2}% by more than 1 point"
    );

    let record = serde_json::json!({
        "format_version": 1,
        "made_by": "LFM_BLESS=1 cargo test --test transcribe_accuracy",
        "model": "whisper-tiny.en, CPU reference",
        "options": "as gold.json, beam_size 1",
        "clips": ours,
        "errors": our_errors,
        "ref_words": words,
        "wer": our_errors as f64 / words as f64,
        "faster_whisper_wer": fw_errors as f64 / words as f64,
    });
    let path = fixtures.join("lfm.json");
    if std::env::var_os("LFM_BLESS").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&record).unwrap() + "\n").unwrap();
    } else {
        let recorded: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            recorded["clips"], record["clips"],
            "transcripts changed; LFM_BLESS=1 records them"
        );
    }
}
