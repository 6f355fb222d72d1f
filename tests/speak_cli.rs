//! The `speak` binary end to end on the CPU: outputs, determinism, streams
//! and bad input (clear one-line errors, exit 1, nothing overwritten).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn speak(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_speak"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lfm-speak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn samples(path: &Path) -> (hound::WavSpec, Vec<i16>) {
    let r = hound::WavReader::open(path).unwrap();
    let spec = r.spec();
    (spec, r.into_samples().map(|s| s.unwrap()).collect())
}

#[test]
fn same_seed_same_samples_and_a_playable_wav() {
    let (a, b, c) = (tmp("a.wav"), tmp("b.wav"), tmp("c.wav"));
    for (path, seed) in [(&a, "5"), (&b, "5"), (&c, "6")] {
        let o = speak(&[
            "Hello there.",
            "-o",
            path.to_str().unwrap(),
            "--cpu",
            "--seed",
            seed,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("real-time factor"), "{}", stderr(&o));
    }
    let (spec, sa) = samples(&a);
    assert_eq!(
        (spec.channels, spec.sample_rate, spec.bits_per_sample),
        (1, 22050, 16)
    );
    // About a second of speech that uses the whole range (Piper normalises).
    assert!((15_000..30_000).contains(&sa.len()), "{} samples", sa.len());
    assert_eq!(sa.iter().map(|s| s.unsigned_abs()).max(), Some(32767));
    assert_eq!(samples(&b).1, sa, "same seed, same samples");
    assert_ne!(samples(&c).1, sa, "another seed, other noise");
}

#[test]
fn stream_on_stdout_carries_the_same_audio_as_a_file() {
    let file = tmp("file.wav");
    let args = [
        "--cpu",
        "--seed",
        "9",
        "--noise-scale",
        "0",
        "--noise-w",
        "0",
    ];
    let mut a = vec!["Stop! Wait for me.", "-o", file.to_str().unwrap()];
    a.extend(args);
    let o = speak(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    // Text on stdin, WAV on stdout.
    let mut child = Command::new(env!("CARGO_BIN_EXE_speak"))
        .args(["-o", "-"])
        .args(args)
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Stop! Wait for me.")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("2 sentence(s)"), "{}", stderr(&out));
    let stream = out.stdout;
    assert_eq!(&stream[..4], b"RIFF");
    assert_eq!(
        u32::from_le_bytes(stream[24..28].try_into().unwrap()),
        22050
    );
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(
        &stream[44..],
        &bytes[44..],
        "same samples in the stream and the file"
    );
}

#[test]
fn bad_input_is_a_clear_error_and_keeps_the_old_output() {
    // A folder of its own: other tests write beside their outputs meanwhile.
    let dir = tmp("keep");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("keep.wav");
    std::fs::write(&out, b"old").unwrap();
    let o = out.to_str().unwrap();
    // Bad input is exit 1, a bad flag value exit 2 (before the voice loads).
    for (args, want, code) in [
        (vec!["", "-o", o, "--cpu", "--force"], "no text to speak", 1),
        (vec!["?!", "-o", o, "--cpu", "--force"], "nothing to say", 1),
        (
            vec![
                "Hi.",
                "-o",
                o,
                "--cpu",
                "--force",
                "--model",
                "/nonexistent/voice.onnx",
            ],
            "/nonexistent/voice.onnx",
            1,
        ),
        (vec!["Hi.", "-o", o, "--cpu"], "already exists", 1),
        (
            vec!["Hi.", "-o", o, "--cpu", "--length-scale", "0"],
            "--length-scale",
            2,
        ),
        (
            vec!["Hi.", "-o", o, "--cpu", "--noise-w", "nan"],
            "--noise-w",
            2,
        ),
    ] {
        let r = speak(&args);
        let err = stderr(&r);
        assert_eq!(r.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            err.contains("error: ") && err.contains(want),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(
            std::fs::read(&out).unwrap(),
            b"old",
            "{args:?} touched the output"
        );
    }
    // A good run replaces it, leaving no temporary file behind.
    let r = speak(&["Hi.", "-o", o, "--cpu", "--seed", "1", "--force"]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(&std::fs::read(&out).unwrap()[..4], b"RIFF");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    // A bad command line is exit 2.
    assert_eq!(speak(&["Hi."]).status.code(), Some(2));
}

#[test]
fn phonemes_missing_from_the_voice_are_skipped_with_a_notice() {
    // The real voice with "ð" removed from its map.
    let dir = tmp("voice");
    std::fs::create_dir_all(&dir).unwrap();
    let src = root().join("samples/models/piper-joe/en_US-joe-medium.onnx");
    let onnx = dir.join("v.onnx");
    let _ = std::fs::remove_file(&onnx);
    std::os::unix::fs::symlink(&src, &onnx).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.with_extension("onnx.json")).unwrap())
            .unwrap();
    cfg["phoneme_id_map"].as_object_mut().unwrap().remove("ð");
    std::fs::write(dir.join("v.onnx.json"), cfg.to_string()).unwrap();
    let out = tmp("missing.wav");
    let r = speak(&[
        "Hello there.",
        "-o",
        out.to_str().unwrap(),
        "--cpu",
        "--model",
        onnx.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("notice: skipped phonemes the voice does not know: ð"),
        "{}",
        stderr(&r)
    );
}

#[test]
fn phoneme_ids_in_gold_samples_out() {
    // onnxruntime's waveform for these ids with the noise off
    // (samples/fixtures/speak/hello.*), through the whole command line.
    let dir = root().join("samples/fixtures/speak");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("hello.json")).unwrap()).unwrap();
    let ids: Vec<i64> = serde_json::from_value(meta["ids"].clone()).unwrap();
    let ids = ids
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let bytes = std::fs::read(dir.join("hello.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let gold: Vec<f32> = bytemuck::pod_collect_to_vec(st.tensor("audio").unwrap().data());
    let out = tmp("ids.wav");
    let o = speak(&[
        "--phoneme-ids",
        &ids,
        "-o",
        out.to_str().unwrap(),
        "--cpu",
        "--noise-scale",
        "0",
        "--noise-w",
        "0",
        "--no-normalize",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (_, got) = samples(&out);
    assert_eq!(got.len(), gold.len());
    let worst = got
        .iter()
        .zip(&gold)
        .map(|(g, w)| (*g as f32 - w * 32767.0).abs())
        .fold(0.0, f32::max);
    // Truncation to int16 (up to 1) plus the model's 2.6e-5 difference.
    assert!(worst <= 2.0, "worst sample differs by {worst} LSB");
    let bad = speak(&[
        "--phoneme-ids",
        "1,x,2",
        "-o",
        out.to_str().unwrap(),
        "--cpu",
        "--force",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("--phoneme-ids"), "{}", stderr(&bad));
    let bad = speak(&[
        "--phoneme-ids",
        "1,999,2",
        "-o",
        out.to_str().unwrap(),
        "--cpu",
        "--force",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("phoneme id 999"), "{}", stderr(&bad));
}
