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

/// The small multi-speaker voice (scripts/fixtures/piper_multispeaker.py).
fn multi() -> String {
    root()
        .join("samples/fixtures/speak/multi.onnx")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn speakers_are_listed_and_chosen_by_name_or_id() {
    let m = multi();
    let o = speak(&["-m", &m, "--list-speakers"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "0\talice\n1\tbob\n2\tcarol\n"
    );
    let run = |speaker: &str| {
        let o = speak(&[
            "-m",
            &m,
            "--cpu",
            "--seed",
            "3",
            "--speaker",
            speaker,
            "Hello there.",
            "--output-raw",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        o.stdout
    };
    let bob = run("bob");
    assert!(bob.len() > 1000);
    assert_eq!(
        run("1"),
        bob,
        "a speaker's name and id are the same speaker"
    );
    assert_ne!(run("carol"), bob, "another speaker, other audio");
    // Without --speaker: the voice's default (id 0).
    let o = speak(&[
        "-m",
        &m,
        "--cpu",
        "--seed",
        "3",
        "Hello there.",
        "--output-raw",
    ]);
    assert_eq!(o.stdout, run("alice"));
    for bad in ["dave", "3", "-1"] {
        let flag = format!("--speaker={bad}");
        let o = speak(&["-m", &m, "--cpu", &flag, "Hi.", "--output-raw"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains("multi.onnx.json")
                && err.contains(&format!("'{bad}'"))
                && err.contains("alice"),
            "{bad}: {err}"
        );
        assert!(o.stdout.is_empty() && !err.contains("panicked"), "{err}");
    }
    // espeak-ng reads emoji by name, as Piper does: audio, not an error.
    let o = speak(&["-m", &m, "--cpu", "🙂", "--output-raw"]);
    assert!(
        o.status.success() && o.stdout.len() > 1000,
        "{}",
        stderr(&o)
    );
}

#[test]
fn raw_output_is_the_wav_files_samples() {
    let m = multi();
    let wav = tmp("raw.wav");
    let args = [
        "-m",
        &m,
        "--cpu",
        "--seed",
        "4",
        "Stop! Wait for me, please.",
    ];
    let mut a = args.to_vec();
    a.extend(["-o", wav.to_str().unwrap(), "--force"]);
    assert!(speak(&a).status.success());
    let mut a = args.to_vec();
    a.push("--output-raw");
    let o = speak(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    let (spec, want) = samples(&wav);
    assert_eq!(spec.sample_rate, 16000);
    let got: Vec<i16> = o
        .stdout
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect();
    assert_eq!(got, want, "raw PCM = the WAV's samples");
}

/// Peak resident memory of a running process, in kB (Linux).
fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_100_kb_paragraph_streams_in_bounded_memory() {
    use std::io::{Read, Write};
    // One paragraph of ~100 kB with no sentence end: read clause by clause
    // and cut into bounded passes, the first audio comes long before the
    // text is read; the reader stops after a while (as a player might).
    let words = [
        "the",
        "lighthouse",
        "keeper",
        "climbed",
        "stairs",
        "and",
        "wound",
        "clockwork,",
    ];
    let mut text = String::new();
    let mut i = 0;
    while text.len() < 100_000 {
        text.push_str(words[i % words.len()]);
        text.push(' ');
        i += 1;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_speak"))
        .args(["-m", &multi(), "--cpu", "--seed", "1", "--output-raw"])
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).unwrap();
    drop(stdin);
    let t0 = std::time::Instant::now();
    let mut stdout = child.stdout.take().unwrap();
    // 20 s of 16 kHz audio: several passes of the one paragraph.
    let mut buf = vec![0u8; 20 * 16000 * 2];
    stdout.read_exact(&mut buf).unwrap();
    let first = t0.elapsed();
    let rss = peak_rss_kb(child.id());
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    eprintln!("20 s of audio after {first:?}, peak RSS {rss} kB; {err}");
    assert!(!err.contains("panicked"), "{err}");
    // The whole paragraph is ~2 hours of speech; holding it (or its
    // phonemes' latents) would take gigabytes.
    assert!(rss < 400_000, "peak RSS {rss} kB");
    assert!(buf.iter().any(|&b| b != 0), "silence");
}

#[test]
fn text_with_nothing_to_say_is_an_error() {
    let m = multi();
    for text in ["...!?", " , ; ", "\u{200b}"] {
        let o = speak(&["-m", &m, "--cpu", text, "--output-raw"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{text:?}: {err}");
        assert!(
            err.contains("nothing to say") || err.contains("no text"),
            "{text:?}: {err}"
        );
        assert!(o.stdout.is_empty() && !err.contains("panicked"), "{err}");
    }
    // espeak-ng reads emoji by name, as Piper does: audio, not an error.
    let o = speak(&["-m", &m, "--cpu", "🙂", "--output-raw"]);
    assert!(
        o.status.success() && o.stdout.len() > 1000,
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_gpu_repeats_itself_and_says_what_the_cpu_says() {
    let m = multi();
    let run = |device: &str| {
        let o = speak(&[
            "-m",
            &m,
            device,
            "--seed",
            "8",
            "--speaker",
            "carol",
            "--no-normalize",
            "--output-raw",
            // The first sentence alone, the next three in one group on the
            // GPU (the same dispatches, the speaker's offsets in each).
            "Hello there. How are you? I am fine, thanks. Goodbye now.",
        ]);
        assert!(o.status.success(), "{device}: {}", stderr(&o));
        o.stdout
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]))
            .collect::<Vec<i16>>()
    };
    let gpu = run("--gpu");
    assert_eq!(run("--gpu"), gpu, "same seed, same samples");
    let cpu = run("--cpu");
    // Same noise (drawn on the host), same durations; the whole graph in
    // f32 on both, sums in another order: within 2 of 32767.
    assert_eq!(cpu.len(), gpu.len());
    let max = cpu
        .iter()
        .zip(&gpu)
        .map(|(a, b)| (a - b).abs())
        .max()
        .unwrap();
    assert!(max <= 2, "cpu and gpu differ by {max}");
}
