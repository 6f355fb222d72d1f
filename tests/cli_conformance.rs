//! Every tool as users type it and adversarial testers try it (issue 25):
//! outputs that never clobber what they should not, input that is refused
//! or read as the reference tools read it, exit codes that say what went
//! wrong, quiet and exact stderr, and the flags people bring from llama.cpp
//! and Piper. Each case asserts its outcome: the exit code, the message
//! naming the user's file, the destination untouched, no temporary file left.
//! Everything runs on the CPU (`--cpu`) with the small models.

mod common;
use common::*;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const EMBED: &str = env!("CARGO_BIN_EXE_embed");
const GENERATE: &str = env!("CARGO_BIN_EXE_generate");
const SPEAK: &str = env!("CARGO_BIN_EXE_speak");
const TRANSCRIBE: &str = env!("CARGO_BIN_EXE_transcribe");
const QUANTIZE: &str = env!("CARGO_BIN_EXE_quantize");
const SCOREBOARD: &str = env!("CARGO_BIN_EXE_scoreboard");
const KLD: &str = env!("CARGO_BIN_EXE_kld");
const OCR: &str = env!("CARGO_BIN_EXE_ocr-layout");
const GGUF_WRITE: &str = env!("CARGO_BIN_EXE_gguf-write");
const LFM: &str = env!("CARGO_BIN_EXE_lfm");

const CLIPS: &str = "/usr/share/pocketsphinx/test/data/librivox";

fn minilm() -> String {
    model("all-minilm-l6-v2").display().to_string()
}

fn tiny_gguf() -> String {
    repo()
        .join("samples/fixtures/llm/tiny-lfm2.f32.gguf")
        .display()
        .to_string()
}

fn whisper() -> String {
    model("whisper-tiny.en").display().to_string()
}

fn clip(name: &str) -> PathBuf {
    let p = Path::new(CLIPS).join(format!("sense_and_sensibility_01_austen_64kb-{name}.wav"));
    assert!(p.is_file(), "{} is missing: run scripts/setup", p.display());
    p
}

/// `embed --cpu -m MiniLM "hi"` with `extra` arguments.
fn embed(extra: &[&str]) -> Output {
    let m = minilm();
    let mut args = vec!["--cpu", "-m", &m, "hi"];
    args.extend_from_slice(extra);
    run(EMBED, &args)
}

/// Names in `dir` that look like our temporary files.
fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect()
}

#[track_caller]
fn assert_usage_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "expected exit 2, stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "stderr {err:?} does not mention {n:?}");
    }
}

// ---------------------------------------------------------------------------
// 1. One output writer

#[test]
fn a_symlink_is_written_through_and_keeps_the_mode_of_what_it_replaces() {
    let dir = scratch("conf-link");
    let real = dir.join("real.jsonl");
    std::fs::write(&real, b"old").unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.join("link.jsonl");
    std::os::unix::fs::symlink("real.jsonl", &link).unwrap();

    let o = embed(&["-o", link.to_str().unwrap()]);
    assert_clean_failure(&o, &["link.jsonl", "already exists", "--force"]);
    assert_eq!(std::fs::read(&real).unwrap(), b"old");

    let o = embed(&["-o", link.to_str().unwrap(), "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(std::fs::read_to_string(&real)
        .unwrap()
        .starts_with("{\"index\":0"));
    let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the replaced file's mode");
    assert!(temp_files(&dir).is_empty(), "{:?}", temp_files(&dir));
}

#[test]
fn devices_and_stdout_are_written_not_replaced() {
    let o = embed(&["-o", "/dev/null"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    assert!(stdout(&o).is_empty());
    // speak turned a device into a WAV file (as root, /dev/null).
    for force in [&[][..], &["--force"]] {
        let mut args = vec!["--cpu", "Hi.", "-o", "/dev/null"];
        args.extend_from_slice(force);
        let o = run(SPEAK, &args);
        assert!(o.status.success(), "{force:?}: {}", stderr(&o));
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
    }

    // `-` and /dev/stdout are standard output, with or without --force.
    for args in [&["-o", "-"][..], &["-o", "/dev/stdout", "--force"][..]] {
        let dir = scratch("conf-dash");
        let m = minilm();
        let mut all = vec!["--cpu", "-m", &m, "hi"];
        all.extend_from_slice(args);
        let o = Command::new(EMBED)
            .args(&all)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).starts_with("{\"index\":0"), "{args:?}");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "{args:?} made a file"
        );
    }
    assert!(std::fs::symlink_metadata("/dev/stdout")
        .unwrap()
        .is_symlink());
}

#[test]
fn a_fifo_is_written_through_to_its_reader() {
    let dir = scratch("conf-fifo");
    let fifo = dir.join("pipe");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(&fifo).unwrap())
    };
    let o = embed(&["-o", fifo.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = reader.join().unwrap();
    assert!(
        got.starts_with(b"{\"index\":0"),
        "the reader got {} bytes",
        got.len()
    );
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(temp_files(&dir).is_empty());
}

#[test]
fn a_directory_or_a_missing_folder_fails_at_once_naming_the_users_path() {
    let dir = scratch("conf-dir");
    let o = embed(&["-o", dir.to_str().unwrap(), "--force"]);
    assert_clean_failure(&o, &[dir.to_str().unwrap(), "is a directory"]);
    assert!(temp_files(&dir).is_empty());
    // Beside it, in the shared temporary directory: only a temporary file
    // of this target counts (other programs write theirs there too).
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let beside: Vec<String> = temp_files(dir.parent().unwrap())
        .into_iter()
        .filter(|n| n.contains(&name))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");

    let missing = dir.join("no/such/out.jsonl");
    let o = embed(&["-o", missing.to_str().unwrap()]);
    assert_clean_failure(&o, &["out.jsonl", "does not exist"]);
    assert!(!stderr(&o).contains(".tmp"), "{}", stderr(&o));

    // quantize to a directory: refused before anything is converted.
    let o = run(
        QUANTIZE,
        &[&tiny_gguf(), "--to", "q8_0", "-o", dir.to_str().unwrap()],
    );
    assert_clean_failure(&o, &["is a directory"]);
    assert!(temp_files(&dir).is_empty());
}

#[test]
fn every_tool_asks_for_force_before_replacing_a_file() {
    let dir = scratch("conf-force");
    let old = |name: &str| {
        let p = dir.join(name);
        std::fs::write(&p, b"old").unwrap();
        p
    };
    let wav = old("existing.wav");
    let o = run(SPEAK, &["--cpu", "Hi.", "-o", wav.to_str().unwrap()]);
    assert_clean_failure(&o, &["existing.wav", "--force"]);
    assert_eq!(std::fs::read(&wav).unwrap(), b"old");

    let svg = old("existing.svg");
    let started = Instant::now();
    let o = run(
        SCOREBOARD,
        &[
            &tiny_gguf(),
            "-b",
            "cpu",
            "-p",
            "8",
            "-n",
            "4",
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    assert_clean_failure(&o, &["existing.svg", "--force"]);
    assert_eq!(std::fs::read(&svg).unwrap(), b"old");
    assert!(
        !stderr(&o).contains("..."),
        "the benchmark ran before the check: {}",
        stderr(&o)
    );
    assert!(started.elapsed() < Duration::from_secs(20));

    // --append into a missing directory: refused before the benchmark too.
    let o = run(
        SCOREBOARD,
        &[
            &tiny_gguf(),
            "-b",
            "cpu",
            "--append",
            dir.join("no/such/BENCH.md").to_str().unwrap(),
        ],
    );
    assert_clean_failure(&o, &["BENCH.md", "does not exist"]);
    assert!(!stderr(&o).contains("..."), "{}", stderr(&o));

    let txt = old("existing.txt");
    let o = run(
        TRANSCRIBE,
        &[
            "--cpu",
            "-m",
            &whisper(),
            clip("0930").to_str().unwrap(),
            "-o",
            txt.to_str().unwrap(),
        ],
    );
    assert_clean_failure(&o, &["existing.txt", "--force"]);
    assert_eq!(std::fs::read(&txt).unwrap(), b"old");

    let gguf = old("existing.gguf");
    let o = run(
        QUANTIZE,
        &[&tiny_gguf(), "--to", "q8_0", "-o", gguf.to_str().unwrap()],
    );
    assert_clean_failure(&o, &["existing.gguf", "--force"]);
    assert_eq!(std::fs::read(&gguf).unwrap(), b"old");

    let hf = repo().join("samples/fixtures/llm/tiny-lfm2");
    let o = run(
        GGUF_WRITE,
        &[hf.to_str().unwrap(), "-o", gguf.to_str().unwrap()],
    );
    assert_clean_failure(&o, &["existing.gguf", "--force"]);
    assert_eq!(std::fs::read(&gguf).unwrap(), b"old");

    let png = old("existing.png");
    let page = repo().join("samples/fixtures/layout/page-mime-02.png");
    let o = run(
        OCR,
        &[
            "--cpu",
            "--draw",
            png.to_str().unwrap(),
            page.to_str().unwrap(),
        ],
    );
    assert_clean_failure(&o, &["existing.png", "--force"]);
    assert_eq!(std::fs::read(&png).unwrap(), b"old");

    let kld_ref = old("existing.kld");
    let corpus = repo().join("samples/corpus/alice-ch1-4.txt");
    let o = run(
        KLD,
        &[
            "--cpu",
            "-m",
            &tiny_gguf(),
            "--corpus",
            corpus.to_str().unwrap(),
            "--arm",
            "q8_0",
            "--save-ref",
            kld_ref.to_str().unwrap(),
        ],
    );
    assert_clean_failure(&o, &["existing.kld", "--force"]);
    assert_eq!(std::fs::read(&kld_ref).unwrap(), b"old");
    assert!(temp_files(&dir).is_empty());
}

#[test]
fn the_format_follows_the_extension_or_the_contradiction_is_refused() {
    let dir = scratch("conf-ext");
    let npy = dir.join("x.npy");
    let o = embed(&["-o", npy.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(&std::fs::read(&npy).unwrap()[..6], b"\x93NUMPY");

    let o = embed(&["-o", dir.join("y.npy").to_str().unwrap(), "-f", "jsonl"]);
    assert_usage_error(&o, &["y.npy", "jsonl"]);
    assert!(!dir.join("y.npy").exists());

    let o = run(
        SPEAK,
        &["--cpu", "Hi.", "-o", dir.join("out.mp3").to_str().unwrap()],
    );
    assert_usage_error(&o, &["out.mp3", "WAV"]);
    let o = run(
        SCOREBOARD,
        &[
            &tiny_gguf(),
            "-b",
            "cpu",
            "--plot",
            dir.join("p.png").to_str().unwrap(),
        ],
    );
    assert_usage_error(&o, &["p.png", "SVG"]);
    let o = run(
        QUANTIZE,
        &[
            &tiny_gguf(),
            "--to",
            "q8_0",
            "-o",
            dir.join("q.safetensors").to_str().unwrap(),
        ],
    );
    assert_usage_error(&o, &["q.safetensors", "GGUF"]);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

/// Starts `embed` on many lines, waits for its temporary file, sends
/// `signal` and checks that the process died of it and left nothing.
fn interrupted_embed_leaves_nothing(signal: &str, number: i32) {
    let dir = scratch(&format!("conf-sig{signal}"));
    let input = dir.join("lines.txt");
    let lines: String = (0..20_000)
        .map(|i| format!("line number {i} of a long input\n"))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let out = dir.join("out.jsonl");
    let mut cmd = Command::new(EMBED);
    cmd.args(["--cpu", "-m", &minilm(), "-i", input.to_str().unwrap()])
        .args(["-o", out.to_str().unwrap()])
        .stderr(Stdio::null());
    // A shell's background job starts with SIGINT ignored, and the tool
    // keeps an ignored signal ignored (nohup): give the child the
    // dispositions a terminal gives, whatever ran these tests.
    // SAFETY: signal() is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let started = Instant::now();
    while temp_files(&dir).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no temporary file appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.signal(), Some(number), "{signal}: {:?}", o.status);
    assert!(
        temp_files(&dir).is_empty(),
        "{signal}: {:?}",
        temp_files(&dir)
    );
    assert!(!out.exists());
}

#[test]
fn sigterm_sigint_and_sighup_remove_the_temporary_file() {
    interrupted_embed_leaves_nothing("TERM", 15);
    interrupted_embed_leaves_nothing("INT", 2);
    // A closed terminal or ssh session.
    interrupted_embed_leaves_nothing("HUP", 1);
}

#[test]
fn a_failed_rename_removes_the_temporary_file_and_names_the_users_path() {
    // The output path turns into a directory while the tool works (another
    // program, a user): the final rename fails.
    let dir = scratch("conf-rename");
    let input = dir.join("lines.txt");
    let lines: String = (0..1_500)
        .map(|i| format!("line number {i} of an input\n"))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let out = dir.join("out.jsonl");
    let child = Command::new(EMBED)
        .args(["--cpu", "-m", &minilm(), "-i", input.to_str().unwrap()])
        .args(["-o", out.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while temp_files(&dir).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no temporary file appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), b"mine").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_clean_failure(&o, &["out.jsonl"]);
    assert!(!stderr(&o).contains(".tmp"), "{}", stderr(&o));
    assert!(temp_files(&dir).is_empty(), "{:?}", temp_files(&dir));
    assert_eq!(std::fs::read(out.join("keep.txt")).unwrap(), b"mine");
}

#[test]
fn speak_writes_a_streamed_wav_through_a_fifo_to_its_reader() {
    let dir = scratch("conf-speak-fifo");
    let fifo = dir.join("voice.wav");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(&fifo).unwrap())
    };
    let o = run(
        SPEAK,
        &[
            "--cpu",
            "--seed",
            "1",
            "Hello there.",
            "-o",
            fifo.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let got = reader.join().unwrap();
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(temp_files(&dir).is_empty(), "{:?}", temp_files(&dir));
    assert_eq!(&got[..4], b"RIFF", "the reader got {} bytes", got.len());
    assert_eq!(&got[8..12], b"WAVE");
    // The streaming header (no sizes) reads to the end, as a player reads it.
    let copy = dir.join("copy.wav");
    std::fs::write(&copy, &got).unwrap();
    let audio = lfm::run::audio::load(&copy, 22_050).unwrap();
    assert!(audio.seconds() > 0.5, "{} s of audio", audio.seconds());
    assert!(audio.samples.iter().any(|&s| s.abs() > 0.05), "silence");
}

// ---------------------------------------------------------------------------
// 2. Input guards

/// A 16-bit mono WAV of a 440 Hz tone at `rate`, as bytes.
fn tone_wav(rate: u32, seconds: f32) -> Vec<u8> {
    let mut cursor = std::io::Cursor::new(Vec::new());
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
    for n in 0..(rate as f32 * seconds) as usize {
        let v = (std::f32::consts::TAU * 440.0 * n as f32 / rate as f32).sin();
        w.write_sample((v * 16_000.0) as i16).unwrap();
    }
    w.finalize().unwrap();
    cursor.into_inner()
}

/// The offset of the `data` chunk's size field in a WAV file.
fn data_size_at(wav: &[u8]) -> usize {
    wav.windows(4).position(|w| w == b"data").unwrap() + 4
}

#[test]
fn placeholder_wav_sizes_are_read_to_the_end_of_the_file() {
    let dir = scratch("conf-wavsize");
    let good = tone_wav(22_050, 1.5);
    let good_path = dir.join("good.wav");
    std::fs::write(&good_path, &good).unwrap();
    let want = lfm::run::audio::load(&good_path, 16_000).unwrap().samples;
    let at = data_size_at(&good);
    for placeholder in [0u32, 0x7FFF_FFFF, 0xFFFF_FFFF, 0xFFFF_FFF0] {
        let mut bytes = good.clone();
        bytes[at..at + 4].copy_from_slice(&placeholder.to_le_bytes());
        bytes[4..8].copy_from_slice(&placeholder.to_le_bytes());
        let p = dir.join(format!("stream-{placeholder:x}.wav"));
        std::fs::write(&p, &bytes).unwrap();
        let got = lfm::run::audio::load(&p, 16_000)
            .unwrap_or_else(|e| panic!("{placeholder:#x}: {e}"))
            .samples;
        assert_eq!(got, want, "{placeholder:#x}");
    }
}

#[test]
fn a_streamed_wav_header_transcribes_like_the_finished_file() {
    let dir = scratch("conf-wavstream");
    let mut bytes = std::fs::read(clip("0930")).unwrap();
    let at = data_size_at(&bytes);
    bytes[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
    let p = dir.join("streamed.wav");
    std::fs::write(&p, &bytes).unwrap();
    let o = run(
        TRANSCRIBE,
        &["--cpu", "-m", &whisper(), p.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "He might even have been made amiable himself.\n"
    );
}

#[test]
fn implausible_sample_rates_are_refused_naming_the_file() {
    let dir = scratch("conf-rate");
    for rate in [1u32, 4_000_000_000] {
        let mut bytes = tone_wav(16_000, 0.5);
        bytes[24..28].copy_from_slice(&rate.to_le_bytes());
        let p = dir.join(format!("rate-{rate}.wav"));
        std::fs::write(&p, &bytes).unwrap();
        let started = Instant::now();
        let e = lfm::run::audio::load(&p, 16_000).unwrap_err().to_string();
        assert!(
            e.contains(&format!("rate-{rate}.wav")) && e.contains("implausible"),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}

#[test]
fn nan_and_inf_samples_are_an_error_not_a_panic() {
    let dir = scratch("conf-nan-wav");
    for (rate, bad) in [
        (44_100u32, f32::NAN),
        (16_000, f32::INFINITY),
        (8_000, f32::NEG_INFINITY),
    ] {
        let p = dir.join(format!("bad-{rate}.wav"));
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: rate,
            bits_per_sample: 32,
            sample_format: hound::SampleFormat::Float,
        };
        let mut w = hound::WavWriter::create(&p, spec).unwrap();
        for n in 0..rate {
            w.write_sample(if n == rate / 2 { bad } else { 0.1 })
                .unwrap();
        }
        w.finalize().unwrap();
        let o = run(
            TRANSCRIBE,
            &["--cpu", "-m", &whisper(), p.to_str().unwrap()],
        );
        assert_clean_failure(&o, &[&format!("bad-{rate}.wav"), "damaged audio"]);
    }
}

#[test]
fn a_truncated_jpeg_is_reported() {
    let dir = scratch("conf-jpeg");
    let page = repo().join("samples/fixtures/layout/page-mime-02.png");
    let img = image::open(&page).unwrap().to_rgb8();
    let jpg = dir.join("page.jpg");
    img.save(&jpg).unwrap();
    assert!(lfm::run::image::load(&jpg).is_ok());
    let bytes = std::fs::read(&jpg).unwrap();
    let cut = dir.join("cut.jpg");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = lfm::run::image::load(&cut).unwrap_err().to_string();
    assert!(e.contains("cut.jpg") && e.contains("truncated"), "{e}");
    let o = run(OCR, &["--cpu", cut.to_str().unwrap()]);
    assert_clean_failure(&o, &["cut.jpg", "truncated"]);
}

#[test]
fn truncated_flac_mp3_and_ogg_are_read_to_where_they_end_with_a_warning() {
    // As ffmpeg (and so faster-whisper) does: decode what is there, and say
    // so, naming the file and how much was read.
    let dir = scratch("conf-cut-audio");
    for name in [
        "clip-0930.flac",
        "clip-0930.mp3",
        "clip-0930-vbr.mp3",
        "clip-0930.ogg",
    ] {
        let whole = repo().join("samples/fixtures/audio").join(name);
        let full = lfm::run::audio::load(&whole, 16_000).unwrap();
        assert!(full.seconds() > 3.2, "{name}: {} s", full.seconds());
        assert!(full.warnings.is_empty(), "{name}: {:?}", full.warnings);

        let bytes = std::fs::read(&whole).unwrap();
        // Inside a frame (an Ogg page: this one's are 1.3 s long).
        let cut = dir.join(format!("cut-{name}"));
        std::fs::write(&cut, &bytes[..bytes.len() * 3 / 4 + 3]).unwrap();
        let part = lfm::run::audio::load(&cut, 16_000).unwrap();
        assert!(
            part.seconds() > 1.0 && part.seconds() < full.seconds() - 0.5,
            "{name}: {} s of {}",
            part.seconds(),
            full.seconds()
        );
        let read = format!("read {:.2} s", part.seconds());
        let [warning] = &part.warnings[..] else {
            panic!("{name}: warnings {:?}", part.warnings)
        };
        for needle in [cut.to_str().unwrap(), "truncated", &read] {
            assert!(warning.contains(needle), "{warning:?} lacks {needle:?}");
        }
    }
    // Cut before the first whole page of audio: nothing to decode.
    let early = dir.join("early.ogg");
    let ogg = std::fs::read(repo().join("samples/fixtures/audio/clip-0930.ogg")).unwrap();
    std::fs::write(&early, &ogg[..5000]).unwrap();
    let e = lfm::run::audio::load(&early, 16_000)
        .unwrap_err()
        .to_string();
    assert!(e.contains("early.ogg") && e.contains("truncated"), "{e}");

    // The tool prints the warning and transcribes what is there; -q
    // leaves only results and errors.
    let cut = dir.join("cut-clip-0930.mp3");
    let o = run(
        TRANSCRIBE,
        &["--cpu", "-m", &whisper(), cut.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o)
            .lines()
            .any(|l| l.starts_with("warning: ") && l.contains("cut-clip-0930.mp3")),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).starts_with("He might"), "{}", stdout(&o));
    let o = run(
        TRANSCRIBE,
        &["--cpu", "-q", "-m", &whisper(), cut.to_str().unwrap()],
    );
    assert!(
        o.status.success() && stderr(&o).is_empty(),
        "{}",
        stderr(&o)
    );
}

/// A copy of `src` with every byte from `from` on set to 0xFF (NaN as f32).
fn poisoned_copy(src: &Path, dst: &Path, from: usize) {
    let mut bytes = std::fs::read(src).unwrap();
    for b in &mut bytes[from..] {
        *b = 0xFF;
    }
    std::fs::write(dst, bytes).unwrap();
}

#[test]
fn nan_from_damaged_weights_is_an_error_naming_the_model() {
    let dir = scratch("conf-nan-weights");
    // embed: the safetensors header stays, every tensor becomes NaN.
    let model_dir = dir.join("minilm");
    std::fs::create_dir_all(&model_dir).unwrap();
    for entry in std::fs::read_dir(minilm()).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_owned();
        if name == "model.safetensors" {
            let bytes = std::fs::read(&p).unwrap();
            let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            poisoned_copy(&p, &model_dir.join(&name), header);
        } else if p.is_file() {
            std::fs::copy(&p, model_dir.join(&name)).unwrap();
        } else {
            std::os::unix::fs::symlink(&p, model_dir.join(&name)).unwrap();
        }
    }
    let o = run(EMBED, &["--cpu", "-m", model_dir.to_str().unwrap(), "hi"]);
    assert_clean_failure(&o, &["model.safetensors", "NaN"]);
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));

    // generate: the second half of the tensor data NaN.
    let gguf = dir.join("nan.gguf");
    let len = std::fs::metadata(tiny_gguf()).unwrap().len() as usize;
    poisoned_copy(Path::new(&tiny_gguf()), &gguf, len / 2);
    let o = run(
        GENERATE,
        &[
            "--cpu",
            "-m",
            gguf.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3",
            "-n",
            "4",
            "--temperature",
            "0",
        ],
    );
    assert_clean_failure(&o, &["nan.gguf"]);
    assert!(stdout(&o).trim().is_empty(), "{}", stdout(&o));
}

/// `generate --json` on `model` with `args`: the generated ids.
fn generated_ids(model: &Path, args: &[&str]) -> Vec<u64> {
    let mut all = vec!["-m", model.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let o = run(GENERATE, &all);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    v["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn nan_at_a_later_decode_step_is_an_error_naming_the_model() {
    // tiny-qwen3 has its own output head: NaN in every embedding row but the
    // prompt's leaves the prompt's logits clean, so the first forward passes
    // and the NaN comes in with the first generated token, at the second
    // step. The GPU's greedy steps read back only a token id (argmax's flag
    // says whether its logits were finite), its sampling steps the top
    // candidates; the CPU reads every logit.
    let dir = scratch("conf-nan-later");
    let clean = repo().join("samples/fixtures/llm/tiny-qwen3.f32.gguf");
    let prompt: [u64; 3] = [5, 6, 7];
    let ids = "5,6,7";
    let gguf = lfm::formats::gguf::GgufFile::open(&clean).unwrap();
    let embd = gguf.tensor_info("token_embd.weight").unwrap().clone();
    assert_eq!(embd.dtype.name(), "f32");
    let row = embd.size / embd.shape[0];
    let start = gguf.data_offset() + embd.offset;
    let mut bytes = std::fs::read(&clean).unwrap();
    for t in 0..embd.shape[0] {
        if !prompt.contains(&(t as u64)) {
            bytes[start + t * row..start + (t + 1) * row].fill(0xFF);
        }
    }
    let bad = dir.join("later-nan.gguf");
    std::fs::write(&bad, &bytes).unwrap();

    for device in ["--cpu", "--gpu"] {
        for sampling in [
            &["--temperature", "0"][..],
            &["--temperature", "1", "--seed", "3"],
        ] {
            let mut args = vec![device, "--prompt-ids", ids];
            args.extend_from_slice(sampling);
            let mut six = args.clone();
            six.extend(["-n", "6"]);
            let first = generated_ids(&clean, &six);
            assert!(
                !prompt.contains(&first[0]),
                "{args:?}: the first token {} is a prompt token",
                first[0]
            );
            // One token: only the first forward runs, and its logits are clean.
            let mut one = args.clone();
            one.extend(["-n", "1"]);
            assert_eq!(generated_ids(&bad, &one), first[..1], "{args:?}");

            let mut all = vec!["-m", bad.to_str().unwrap()];
            all.extend_from_slice(&six);
            let o = run(GENERATE, &all);
            assert_clean_failure(&o, &["later-nan.gguf", "NaN"]);
        }
    }
}

/// A copy of `src` with `len` bytes from `at` (a fraction of its length,
/// inside its weights) set to 0xFF: NaN in whatever tensor lies there.
fn poison_window(src: &Path, dst: &Path, at: f64, len: usize) {
    let mut bytes = std::fs::read(src).unwrap();
    let start = (bytes.len() as f64 * at) as usize;
    for b in &mut bytes[start..start + len] {
        *b = 0xFF;
    }
    std::fs::write(dst, bytes).unwrap();
}

#[test]
fn nan_scores_and_log_probabilities_name_the_model_file() {
    let dir = scratch("conf-nan-onnx-ct2");
    let onnx = dir.join("bad.onnx");
    poison_window(&model("layout-cdla/layout_cdla.onnx"), &onnx, 0.6, 4096);
    let page = repo().join("samples/fixtures/layout/page-mime-02.png");
    let o = run(
        OCR,
        &[
            "--cpu",
            "-m",
            onnx.to_str().unwrap(),
            page.to_str().unwrap(),
        ],
    );
    assert_clean_failure(&o, &["bad.onnx", "NaN"]);
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));

    let whisper_dir = dir.join("whisper");
    std::fs::create_dir_all(&whisper_dir).unwrap();
    let real = PathBuf::from(whisper());
    poison_window(
        &real.join("model.bin"),
        &whisper_dir.join("model.bin"),
        0.5,
        65536,
    );
    for f in ["config.json", "tokenizer.json", "vocabulary.txt"] {
        std::os::unix::fs::symlink(real.join(f), whisper_dir.join(f)).unwrap();
    }
    let o = run(
        TRANSCRIBE,
        &[
            "--cpu",
            "-m",
            whisper_dir.to_str().unwrap(),
            clip("0930").to_str().unwrap(),
        ],
    );
    assert_clean_failure(&o, &["model.bin", "NaN"]);
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}

#[test]
fn empty_prompts_and_stop_strings_are_refused_before_the_model_loads() {
    let missing = "/nonexistent/model.gguf";
    for args in [
        &["-m", missing, "-p", ""][..],
        &["-m", missing, "-p", "hi", "--stop", ""][..],
        &["-m", missing][..],
        &["-m", missing, "--prompt-ids", ""][..],
    ] {
        let o = run(GENERATE, args);
        assert_usage_error(&o, &[]);
        assert!(
            !stderr(&o).contains("nonexistent"),
            "{args:?} loaded the model first"
        );
    }
    let o = Command::new(GENERATE)
        .args(["-m", missing, "-p", "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_clean_failure(&o, &["prompt", "empty"]);
    assert!(!stderr(&o).contains("nonexistent"));
}

#[test]
fn mel_filters_are_computed_as_faster_whisper_does_when_absent() {
    // The computed bank equals openai-whisper's asset (librosa, f32).
    for n in [80, 128] {
        let asset = lfm::formats::npy::read(model(&format!("whisper-mel/mel_{n}.npy"))).unwrap();
        let ours = lfm::models::whisper::mel::slaney_weights(n);
        let worst = asset
            .data
            .iter()
            .zip(&ours)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-6, "mel_{n}: max difference {worst}");
    }
    // A bare CTranslate2 directory (no mel_*.npy, no whisper-mel beside it).
    let dir = scratch("conf-ct2");
    let bare = dir.join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    for f in [
        "model.bin",
        "config.json",
        "tokenizer.json",
        "vocabulary.txt",
    ] {
        std::os::unix::fs::symlink(Path::new(&whisper()).join(f), bare.join(f)).unwrap();
    }
    let o = run(
        TRANSCRIBE,
        &[
            "--cpu",
            "-m",
            bare.to_str().unwrap(),
            clip("0930").to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "He might even have been made amiable himself.\n"
    );

    let o = run(
        TRANSCRIBE,
        &[
            "--cpu",
            "--mel-filters",
            "/nonexistent/mel",
            clip("0930").to_str().unwrap(),
        ],
    );
    assert_clean_failure(&o, &["/nonexistent/mel"]);
}

// ---------------------------------------------------------------------------
// 3. Flags checked before a model loads, exit 2; messages in the user's terms

#[test]
fn bad_flag_values_are_exit_2_before_any_model_loads() {
    let missing = "/nonexistent/model";
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            GENERATE,
            vec!["-m", missing, "-p", "hi", "--temperature", "nan"],
        ),
        (GENERATE, vec!["-m", missing, "-p", "hi", "--top-p", "1.5"]),
        (GENERATE, vec!["-m", missing, "-p", "hi", "-n", "0"]),
        (
            SPEAK,
            vec!["-m", missing, "hi", "-o", "x.wav", "--length-scale", "0"],
        ),
        (
            SPEAK,
            vec!["-m", missing, "hi", "-o", "x.wav", "--noise-scale", "inf"],
        ),
        (
            KLD,
            vec!["-m", missing, "--arm", "q8_0", "--corpus", "x", "-c", "0"],
        ),
        (KLD, vec!["-m", missing, "--arm", "q9_9", "--corpus", "x"]),
        (SCOREBOARD, vec![missing, "-r", "0"]),
        (SCOREBOARD, vec![missing, "-t", "q9_9"]),
        (
            TRANSCRIBE,
            vec!["-m", missing, "x.wav", "--no-speech-threshold", "2"],
        ),
        (
            TRANSCRIBE,
            vec!["-m", missing, "x.wav", "--temperature", "-1"],
        ),
        (QUANTIZE, vec![missing, "--to", "q9_9"]),
        (EMBED, vec!["-m", missing, "hi", "-b", "0"]),
    ];
    for (bin, args) in cases {
        let o = run(bin, &args);
        assert_usage_error(&o, &[]);
        assert!(
            !stderr(&o).contains("nonexistent"),
            "{bin} {args:?}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn messages_carry_no_rust_debug_output() {
    let o = run(
        GENERATE,
        &[
            "-m",
            &tiny_gguf(),
            "--backend",
            "metal",
            "--prompt-ids",
            "1,2",
            "-n",
            "1",
        ],
    );
    assert_clean_failure(&o, &["--backend metal"]);
    assert!(
        !stderr(&o).contains("Some(") && !stderr(&o).contains("None"),
        "{}",
        stderr(&o)
    );

    let o = run(
        GENERATE,
        &[
            "--cpu",
            "-m",
            &tiny_gguf(),
            "--prompt-ids",
            "1,2",
            "-n",
            "2",
            "--temperature",
            "0",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("finish: "), "{err}");
    for debug in ["Eos", "Length", "Stop"] {
        assert!(!err.contains(&format!("finish: {debug}")), "{err}");
    }
}

// ---------------------------------------------------------------------------
// 4. Quiet, exact stderr; help and man pages

#[test]
fn no_wayland_noise_without_xdg_runtime_dir() {
    let o = Command::new(EMBED)
        .args(["-m", &minilm(), "hi", "-o", "/dev/null"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("XDG_RUNTIME_DIR"), "{}", stderr(&o));
}

#[test]
fn the_library_probe_is_quiet_without_xdg_runtime_dir_too() {
    // Library users (the GPU tests among them) do not go through a tool's
    // main: the helper below opens a GPU in a child without the variables.
    let o = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "gpu_probe_of_the_quiet_test", "--ignored"])
        .args(["--nocapture", "--test-threads=1"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .output()
        .unwrap();
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(o.status.success(), "{all}");
    assert!(all.contains("1 passed"), "{all}");
    assert!(!all.contains("XDG_RUNTIME_DIR"), "{all}");
}

#[test]
#[ignore = "run in a child by the_library_probe_is_quiet_without_xdg_runtime_dir_too"]
fn gpu_probe_of_the_quiet_test() {
    let gpu = lfm::gpu::Gpu::new(&Default::default()).expect("a GPU adapter (lavapipe on CI)");
    assert!(!gpu.describe().is_empty());
}

#[test]
fn quiet_leaves_only_results_and_every_tool_has_it() {
    let o = embed(&["-q"]);
    assert!(o.status.success());
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("{\"index\":0"));

    let o = run(
        GENERATE,
        &[
            "--cpu",
            "-q",
            "-m",
            &tiny_gguf(),
            "--prompt-ids",
            "1,2",
            "-n",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));

    for bin in [
        EMBED, GENERATE, SPEAK, TRANSCRIBE, QUANTIZE, SCOREBOARD, KLD, OCR, GGUF_WRITE,
    ] {
        let help = stdout(&run(bin, &["--help"]));
        assert!(help.contains("-q, --quiet"), "{bin}: {help}");
    }
}

#[test]
fn help_and_man_pages_describe_the_tool_and_cite_existing_pages() {
    let blurb = "Run neural networks on any GPU: one wgpu engine";
    for (bin, want) in [
        (GENERATE, "Generate text"),
        (SCOREBOARD, "Benchmark prompt processing"),
    ] {
        let help = stdout(&run(bin, &["--help"]));
        assert!(help.starts_with(want), "{help}");
        assert!(!help.contains(blurb), "{help}");
    }
    let lfm1 = std::fs::read_to_string(repo().join("man/lfm.1")).unwrap();
    assert!(
        !lfm1.contains("lfm\\-generate(1)"),
        "lfm.1 cites lfm-generate(1)"
    );
    for (name, _) in lfm::cli::tools() {
        let cited = format!("{}(1)", name.replace('-', "\\-"));
        assert!(lfm1.contains(&cited), "lfm.1 does not cite {cited}");
        assert!(repo().join(format!("man/{name}.1")).is_file());
        let page = std::fs::read_to_string(repo().join(format!("man/{name}.1"))).unwrap();
        assert!(!page.contains(blurb), "man/{name}.1 has the crate's blurb");
    }
}

// ---------------------------------------------------------------------------
// 5. The anchors' flags

#[test]
fn llama_cli_flags_work_in_generate() {
    let dir = scratch("conf-llama-cli");
    let prompt = dir.join("prompt.txt");
    std::fs::write(&prompt, "Once upon a time").unwrap();
    let o = run(
        GENERATE,
        &[
            "-m",
            &tiny_gguf(),
            "-f",
            prompt.to_str().unwrap(),
            "--raw",
            "--temp",
            "0",
            "-s",
            "7",
            "-c",
            "64",
            "-t",
            "1",
            "-ngl",
            "0",
            "--n-predict",
            "3",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["backend"], "cpu", "-ngl 0 runs on the CPU");
    assert_eq!(v["seed"], 7);
    assert!(v["generated_ids"].as_array().unwrap().len() <= 3);
    // -ngl 99 is the GPU request, not -n gl.
    let o = run(
        GENERATE,
        &["-m", "/nonexistent.gguf", "-ngl", "99", "-p", "hi"],
    );
    assert!(!stderr(&o).contains("'gl'"), "{}", stderr(&o));
    assert_clean_failure(&o, &["/nonexistent.gguf"]);
}

#[test]
fn llama_cli_sys_puts_a_system_message_in_the_chat_template() {
    let model = common::smollm2();
    let ids = |extra: &[&str]| {
        let mut args = vec![
            "--cpu",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "Hi",
            "-n",
            "1",
            "--temp",
            "0",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = run(GENERATE, &args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        v["prompt_ids"].as_array().unwrap().clone()
    };
    // SmolLM2's template has a default system message; -sys replaces it.
    let plain = ids(&[]);
    let with_sys = ids(&["-sys", "You answer in one word."]);
    assert_ne!(with_sys, plain, "-sys changed nothing");
    assert_eq!(
        ids(&["--system-prompt", "You answer in one word."]),
        with_sys
    );
    assert_eq!(ids(&["--system", "You answer in one word."]), with_sys);
}

#[test]
fn llama_quantize_positional_form_and_type_names() {
    let dir = scratch("conf-llama-quantize");
    let out = dir.join("out.gguf");
    let o = run(QUANTIZE, &[&tiny_gguf(), out.to_str().unwrap(), "Q8_0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.is_file());
    let o = run(
        QUANTIZE,
        &[&tiny_gguf(), dir.join("x.gguf").to_str().unwrap(), "Q9_9"],
    );
    assert_usage_error(&o, &["Q9_9"]);
    assert!(temp_files(&dir).is_empty());
}

#[test]
fn piper_flags_work_in_speak() {
    let dir = scratch("conf-piper");
    let out = dir.join("hi.wav");
    let o = run(
        SPEAK,
        &[
            "--cpu",
            "Hi.",
            "--output_file",
            out.to_str().unwrap(),
            "--length_scale",
            "1.1",
            "--speaker",
            "0",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(&std::fs::read(&out).unwrap()[..4], b"RIFF");

    let o = run(SPEAK, &["--cpu", "--seed", "1", "Hi.", "--output-raw"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.len() > 10_000 && &o.stdout[..4] != b"RIFF");
    assert_eq!(o.stdout.len() % 2, 0, "16-bit samples");

    let o = run(SPEAK, &["--cpu", "Hi.", "--output-raw", "--speaker", "3"]);
    assert_usage_error(&o, &["--speaker"]);
}

#[test]
fn model_flags_and_names_resolve() {
    let o = Command::new(TRANSCRIBE)
        .args(["--cpu", "-m", "tiny.en", clip("0930").to_str().unwrap()])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("amiable"));

    let page = repo().join("samples/fixtures/layout/page-mime-02.png");
    let onnx = model("layout-cdla/layout_cdla.onnx");
    let o = run(
        OCR,
        &[
            "--cpu",
            "--no-text",
            "-m",
            onnx.to_str().unwrap(),
            page.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // The default model is found from the binary's checkout, not only the working directory.
    let o = Command::new(OCR)
        .args(["--cpu", page.to_str().unwrap()])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));

    let o = run(
        SCOREBOARD,
        &[
            "-m",
            &tiny_gguf(),
            "-b",
            "cpu",
            "-p",
            "4",
            "-n",
            "2",
            "-r",
            "1",
            "-o",
            "json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 2);
}

// ---------------------------------------------------------------------------
// 6. Long inputs

#[test]
fn generate_stops_at_the_end_of_the_context() {
    let ids: Vec<String> = (1..=30).map(|i| i.to_string()).collect();
    let ids = ids.join(",");
    let o = run(
        GENERATE,
        &[
            "--cpu",
            "-m",
            &tiny_gguf(),
            "-c",
            "40",
            "--prompt-ids",
            &ids,
            "--temperature",
            "0",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert!(v["generated_ids"].as_array().unwrap().len() <= 10, "{v}");

    let o = run(
        GENERATE,
        &[
            "--cpu",
            "-m",
            &tiny_gguf(),
            "-c",
            "30",
            "--prompt-ids",
            &ids,
        ],
    );
    assert_clean_failure(&o, &["fills the context"]);
}

#[test]
fn transcribe_takes_many_files_into_a_directory() {
    let dir = scratch("conf-many");
    let out = dir.join("out");
    let (a, b) = (clip("0930"), clip("0880"));
    let o = run(
        TRANSCRIBE,
        &[
            "--cpu",
            "-m",
            &whisper(),
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text =
        std::fs::read_to_string(out.join("sense_and_sensibility_01_austen_64kb-0930.txt")).unwrap();
    assert_eq!(text, "He might even have been made amiable himself.\n");
    assert!(out
        .join("sense_and_sensibility_01_austen_64kb-0880.txt")
        .is_file());
    assert!(temp_files(&out).is_empty());

    let o = run(
        TRANSCRIBE,
        &[
            "--cpu",
            "-m",
            &whisper(),
            a.to_str().unwrap(),
            b.to_str().unwrap(),
        ],
    );
    assert_usage_error(&o, &["-o DIR"]);
}

#[test]
fn scoreboard_skips_a_software_gpu_by_default() {
    let o = run(
        SCOREBOARD,
        &[&tiny_gguf(), "-p", "4", "-n", "2", "-r", "1", "-o", "json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let backend = v["rows"][0]["backend"].as_str().unwrap().to_string();
    // On a machine whose only adapter is lavapipe (CI) the CPU is measured.
    if stderr(&o).contains("only a software GPU") {
        assert_eq!(backend, "cpu");
    } else {
        assert_eq!(backend, "gpu");
        assert!(!v["adapter"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("llvmpipe"));
    }
}

#[test]
fn the_umbrella_takes_the_same_flags() {
    let o = run(
        LFM,
        &["generate", "-m", "/nonexistent.gguf", "-ngl", "0", "-p", ""],
    );
    assert_usage_error(&o, &["--prompt"]);
}

/// Runs `bin` with `args`, its stdout and stderr on a new pseudo-terminal
/// (120 columns), and returns its exit code and what the terminal received,
/// escape sequences included.
fn on_a_terminal(bin: &str, args: &[&str]) -> (Option<i32>, String) {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut leader, mut follower) = (-1, -1);
    let size = libc::winsize {
        ws_row: 40,
        ws_col: 120,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty fills two descriptors, which become owned just below.
    let rc = unsafe {
        libc::openpty(
            &mut leader,
            &mut follower,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both are open descriptors owned by nothing else.
    let (leader, follower) =
        unsafe { (OwnedFd::from_raw_fd(leader), OwnedFd::from_raw_fd(follower)) };
    let mut child = {
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .env("TERM", "xterm")
            .stdin(Stdio::null())
            .stdout(Stdio::from(follower.try_clone().unwrap()))
            .stderr(Stdio::from(follower));
        cmd.spawn().unwrap()
        // The command, and with it our copies of the follower, drop here:
        // reading the leader ends (EIO) when the child's copies close.
    };
    let mut screen = Vec::new();
    let mut leader = std::fs::File::from(leader);
    let mut buf = [0u8; 4096];
    loop {
        match leader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => screen.extend_from_slice(&buf[..n]),
            Err(e) if e.raw_os_error() == Some(libc::EIO) => break,
            Err(e) => panic!("reading the terminal: {e}"),
        }
    }
    let status = child.wait().unwrap();
    (status.code(), String::from_utf8_lossy(&screen).into_owned())
}

/// The lines a terminal shows for `screen`, before later redraws: escape
/// sequences dropped, split at carriage returns and newlines.
fn terminal_pieces(screen: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut chars = screen.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters, then one final byte in @..~.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        plain.push(c);
    }
    plain
        .split(['\r', '\n'])
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.to_string())
        .collect()
}

#[test]
fn transcribe_prints_its_lines_above_its_progress_bar() {
    let (code, screen) = on_a_terminal(
        TRANSCRIBE,
        &["--cpu", "-m", &whisper(), clip("0930").to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{screen}");
    let pieces = terminal_pieces(&screen);
    assert!(
        pieces.iter().any(|p| p.contains("transcribing [")),
        "no progress bar on the terminal: {pieces:?}"
    );
    // The transcript is a line of its own, not drawn into the bar.
    assert!(
        pieces
            .iter()
            .any(|p| p == "He might even have been made amiable himself."),
        "{pieces:?}"
    );
    // On a pipe: no bar.
    let o = run(
        TRANSCRIBE,
        &["--cpu", "-m", &whisper(), clip("0930").to_str().unwrap()],
    );
    assert!(o.status.success());
    assert!(!stderr(&o).contains("transcribing ["), "{}", stderr(&o));
}

#[test]
fn embed_and_speak_show_progress_on_a_terminal_and_none_on_a_pipe() {
    let dir = scratch("conf-progress");
    let input = dir.join("lines.txt");
    let lines: String = (0..300).map(|i| format!("sentence {i}\n")).collect();
    std::fs::write(&input, lines).unwrap();
    let embed_args = [
        "--cpu",
        "-m",
        &minilm(),
        "-i",
        input.to_str().unwrap(),
        "-b",
        "8",
        "-o",
        "/dev/null",
    ];
    let (code, screen) = on_a_terminal(EMBED, &embed_args);
    assert_eq!(code, Some(0), "{screen}");
    let pieces = terminal_pieces(&screen);
    assert!(
        pieces
            .iter()
            .any(|p| p.contains("embed [") && p.contains("/300")),
        "{pieces:?}"
    );
    let o = run(EMBED, &embed_args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("/300"), "{}", stderr(&o));

    let text = "One sentence. Another sentence. And a third one.";
    let wav = dir.join("three.wav");
    let speak_args = [
        "--cpu",
        "--seed",
        "1",
        text,
        "-o",
        wav.to_str().unwrap(),
        "--force",
    ];
    let (code, screen) = on_a_terminal(SPEAK, &speak_args);
    assert_eq!(code, Some(0), "{screen}");
    let pieces = terminal_pieces(&screen);
    assert!(
        pieces
            .iter()
            .any(|p| p.contains("speaking") && p.contains("3 sentences")),
        "{pieces:?}"
    );
    let o = run(SPEAK, &speak_args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("speaking"), "{}", stderr(&o));
}

#[test]
fn speak_cuts_a_long_run_on_sentence_into_bounded_passes() {
    let dir = scratch("conf-long-speech");
    let words = [
        "the", "small", "cat", "sat", "on", "a", "warm", "mat", "and",
    ];
    let text: Vec<&str> = words.iter().cycle().take(120).copied().collect();
    let out = dir.join("long.wav");
    let o = run(
        SPEAK,
        &[
            "--cpu",
            "--seed",
            "1",
            "--json",
            "-o",
            out.to_str().unwrap(),
            &text.join(" "),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let sentences = v["sentences"].as_array().unwrap();
    assert!(sentences.len() >= 2, "one pass for 120 words");
    for s in sentences {
        let n = s["phonemes"].as_str().unwrap().chars().count();
        assert!(
            n <= lfm::run::phonemes::MAX_PHONEMES,
            "a pass of {n} phonemes"
        );
    }
    assert!(v["audio_seconds"].as_f64().unwrap() > 20.0, "{v}");
}
