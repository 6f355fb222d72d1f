//! Mutation fuzzing of the parsers that GGUF and safetensors did not cover
//! (tests/formats_fuzz.rs): ONNX (the layout model, through the whole graph
//! build), CTranslate2 `model.bin`, the audio front end (WAV through hound
//! and symphonia; FLAC, MP3 and Ogg Vorbis files through symphonia),
//! PNG and JPEG images, tokenizer.json (HF and Whisper) and an HF
//! config.json. Each case applies one to four seeded mutations to a small
//! valid input (bit flips, byte overwrites, extreme 4- and 8-byte values,
//! truncations, insertions, deletions, duplicated ranges; for JSON also a
//! value replaced by an extreme one) and opens the result the way the tools
//! do. It must come back `Ok` or `Err`, never panic, and never ask for an
//! absurd allocation (this binary's allocator refuses any single one over
//! 256 MiB, which aborts the run).
//!
//! `cargo test --test inputs_fuzz` runs a quick campaign; the long one is
//! ignored (docs/fuzzing.md):
//! `LFM_FUZZ_SECONDS=300 cargo test --test inputs_fuzz -- --ignored --nocapture`
//! (`LFM_FUZZ_TARGETS=flac,mp3` runs only those targets).

mod common;
mod fuzz_support;

use fuzz_support::temp_dir;
use lfm::util::rng::Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

/// Applies one to four random mutations to `bytes`; `hot` bytes at the start
/// (headers) get most of them.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, hot: usize) {
    const EXTREMES: [u64; 10] = [
        0,
        1,
        0x7FFF_FFFF,
        0xFFFF_FFFF,
        0xFFFF_FFF0,
        1 << 31,
        1 << 32,
        1 << 62,
        u64::MAX,
        0x8000_0000_0000_0000,
    ];
    let n = 1 + (rng.next_u64() % 4) as usize;
    for _ in 0..n {
        if bytes.is_empty() {
            bytes.push(rng.next_u64() as u8);
            continue;
        }
        let len = bytes.len();
        let span = if rng.next_u64() % 5 < 4 {
            hot.min(len).max(1)
        } else {
            len
        };
        let at = (rng.next_u64() as usize) % span;
        match rng.next_u64() % 8 {
            0 => bytes[at] ^= 1 << (rng.next_u64() % 8),
            1 => bytes[at] = rng.next_u64() as u8,
            2 | 3 => {
                let v = EXTREMES[(rng.next_u64() % EXTREMES.len() as u64) as usize];
                let w = if rng.next_u64().is_multiple_of(2) {
                    4
                } else {
                    8
                };
                for (i, b) in v.to_le_bytes()[..w].iter().enumerate() {
                    if at + i < len {
                        bytes[at + i] = *b;
                    }
                }
            }
            4 => bytes.truncate(at),
            5 => {
                let k = 1 + (rng.next_u64() % 16) as usize;
                let ins: Vec<u8> = (0..k).map(|_| rng.next_u64() as u8).collect();
                bytes.splice(at..at, ins);
            }
            6 => {
                let end = (at + 1 + (rng.next_u64() % 64) as usize).min(len);
                bytes.drain(at..end);
            }
            _ => {
                let end = (at + 1 + (rng.next_u64() % 64) as usize).min(len);
                let piece = bytes[at..end].to_vec();
                let to = (rng.next_u64() as usize) % len;
                bytes.splice(to..to, piece);
            }
        }
    }
}

/// A JSON document with one number or string replaced by an extreme value,
/// when it has one; else byte mutations.
fn mutate_json(rng: &mut Rng, bytes: &mut Vec<u8>) {
    const VALUES: [&str; 10] = [
        "18446744073709551616",
        "-1",
        "1e308",
        "0.5",
        "null",
        "\"\"",
        "[]",
        "{}",
        "4294967296",
        "\"\\ud800\"",
    ];
    if rng.next_u64().is_multiple_of(2) {
        if let Ok(text) = std::str::from_utf8(bytes) {
            let starts: Vec<usize> = text
                .char_indices()
                .filter(|(i, c)| {
                    (c.is_ascii_digit() || *c == '"') && text[..*i].ends_with([':', '[', ',', ' '])
                })
                .map(|(i, _)| i)
                .collect();
            if !starts.is_empty() {
                let at = starts[(rng.next_u64() as usize) % starts.len()];
                let rest = &text[at..];
                let end = if let Some(inner) = rest.strip_prefix('"') {
                    inner.find('"').map_or(rest.len(), |e| e + 2)
                } else {
                    rest.find([',', '}', ']']).unwrap_or(rest.len())
                };
                let v = VALUES[(rng.next_u64() % VALUES.len() as u64) as usize];
                let mut out = text[..at].to_string();
                out.push_str(v);
                out.push_str(&rest[end..]);
                *bytes = out.into_bytes();
                return;
            }
        }
    }
    let hot = bytes.len();
    mutate(rng, bytes, hot);
}

/// Opens mutated bytes (written to the given path when the reader needs a
/// file); returns whether they opened.
type Opener = Box<dyn Fn(&[u8], &Path) -> bool>;

/// One fuzz target: a base input, how to mutate it, and how to use it.
struct Target {
    name: &'static str,
    base: Vec<u8>,
    hot: usize,
    json: bool,
    open: Opener,
}

fn wav_base() -> Vec<u8> {
    let mut cursor = std::io::Cursor::new(Vec::new());
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 22_050,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
    for n in 0..2205 {
        let v = ((n as f32 * 0.05).sin() * 8000.0) as i16;
        w.write_sample(v).unwrap();
        w.write_sample(-v).unwrap();
    }
    w.finalize().unwrap();
    cursor.into_inner()
}

fn float_wav_base() -> Vec<u8> {
    let mut cursor = std::io::Cursor::new(Vec::new());
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
    for n in 0..1600 {
        w.write_sample((n as f32 * 0.01).sin() * 0.3).unwrap();
    }
    w.finalize().unwrap();
    cursor.into_inner()
}

/// Headers of the formats symphonia probes, followed by random bytes: what
/// its FLAC, MP3 and Ogg readers see of a damaged file.
fn image_base(jpeg: bool) -> Vec<u8> {
    let img = image::RgbImage::from_fn(48, 32, |x, y| {
        image::Rgb([(x * 5) as u8, (y * 7) as u8, 128])
    });
    let mut bytes = std::io::Cursor::new(Vec::new());
    let format = if jpeg {
        image::ImageFormat::Jpeg
    } else {
        image::ImageFormat::Png
    };
    img.write_to(&mut bytes, format).unwrap();
    bytes.into_inner()
}

/// A small CTranslate2 model.bin (binary version 6) with variables of every
/// dtype, an int8 weight with its scale, and an alias.
fn ct2_base() -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&((s.len() + 1) as u16).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&6u32.to_le_bytes());
    string(&mut out, "WhisperSpec");
    out.extend_from_slice(&3u32.to_le_bytes());
    let vars: Vec<(&str, Vec<u32>, u8, usize)> = vec![
        ("encoder/conv1/weight", vec![4, 3], 0, 4),
        ("encoder/layer_0/weight", vec![2, 8], 1, 1),
        ("encoder/layer_0/weight_scale", vec![2], 0, 4),
        ("decoder/embeddings/weight", vec![3, 4], 4, 2),
        ("decoder/bf", vec![5], 5, 2),
        ("decoder/big", vec![2, 2], 2, 2),
        ("decoder/big_scale", vec![], 0, 4),
        ("decoder/ids", vec![3], 3, 4),
    ];
    out.extend_from_slice(&(vars.len() as u32).to_le_bytes());
    for (i, (name, dims, dtype, size)) in vars.iter().enumerate() {
        string(&mut out, name);
        out.push(dims.len() as u8);
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.push(*dtype);
        let n: usize = dims.iter().map(|&d| d as usize).product::<usize>() * size;
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.extend((0..n).map(|k| (k * 31 + i * 7) as u8 % 64));
    }
    out.extend_from_slice(&1u32.to_le_bytes());
    string(&mut out, "decoder/projection/weight");
    string(&mut out, "decoder/embeddings/weight");
    out
}

fn targets(dir: &Path) -> Vec<Target> {
    let repo = common::repo();
    let mut t = Vec::new();
    for (name, base) in [("wav-pcm16", wav_base()), ("wav-float", float_wav_base())] {
        t.push(Target {
            name,
            base,
            hot: 64,
            json: false,
            open: Box::new(|bytes, path| {
                std::fs::write(path, bytes).unwrap();
                lfm::run::audio::load(path, 16_000).is_ok()
            }),
        });
    }
    // Real files (samples/fixtures/audio): the demuxers and the decoders.
    for (name, file) in [
        ("flac", "clip-0930.flac"),
        ("mp3", "clip-0930.mp3"),
        ("mp3-xing", "clip-0930-vbr.mp3"),
        ("ogg", "clip-0930.ogg"),
    ] {
        let ext = name.split('-').next().unwrap();
        t.push(Target {
            name,
            base: std::fs::read(common::repo().join("samples/fixtures/audio").join(file)).unwrap(),
            hot: 4096,
            json: false,
            open: Box::new(move |bytes, path| {
                let path = path.with_extension(ext);
                std::fs::write(&path, bytes).unwrap();
                lfm::run::audio::load(&path, 16_000).is_ok()
            }),
        });
    }
    for (name, jpeg) in [("png", false), ("jpeg", true)] {
        t.push(Target {
            name,
            base: image_base(jpeg),
            hot: 256,
            json: false,
            open: Box::new(|bytes, path| {
                std::fs::write(path, bytes).unwrap();
                lfm::run::image::load(path).is_ok()
            }),
        });
    }
    t.push(Target {
        name: "ct2",
        base: ct2_base(),
        hot: 512,
        json: false,
        open: Box::new(|bytes, path| {
            std::fs::write(path, bytes).unwrap();
            let Ok(f) = lfm::formats::ct2::Ct2File::open(path) else {
                return false;
            };
            for name in f.names() {
                let shape = f.variable(name).unwrap().shape.clone();
                let _ = f.f32(name, &shape);
                let _ = f.scalar_i64(name);
            }
            let _ = f.f32("decoder/projection/weight", &[3, 4]);
            true
        }),
    });
    let onnx = common::model("layout-cdla/layout_cdla.onnx");
    t.push(Target {
        name: "onnx",
        base: std::fs::read(&onnx).unwrap(),
        hot: 64 << 10,
        json: false,
        open: Box::new(|bytes, path| {
            let Ok(m) = lfm::formats::onnx::OnnxModel::parse(path, bytes) else {
                return false;
            };
            for init in &m.graph.initializers {
                let _ = init.shape();
                let _ = init.to_f32();
            }
            std::fs::write(path, bytes).unwrap();
            let _ = lfm::models::layout::LayoutModel::open(path);
            true
        }),
    });
    let hf_tokenizer = repo.join("samples/fixtures/llm/tiny-lfm2/tokenizer.json");
    let model_dir = dir.join("hf");
    std::fs::create_dir_all(&model_dir).unwrap();
    for f in [
        "config.json",
        "tokenizer_config.json",
        "generation_config.json",
        "model.safetensors",
    ] {
        std::fs::copy(
            repo.join("samples/fixtures/llm/tiny-lfm2").join(f),
            model_dir.join(f),
        )
        .unwrap();
    }
    t.push(Target {
        name: "tokenizer-json",
        base: std::fs::read(&hf_tokenizer).unwrap(),
        hot: usize::MAX,
        json: true,
        open: Box::new(move |bytes, _| {
            std::fs::write(model_dir.join("tokenizer.json"), bytes).unwrap();
            match lfm::tokenizer::Tokenizer::from_hf_dir(&model_dir) {
                Ok(tok) => {
                    let _ = tok.encode("Hello there, wörld 12345!", true);
                    true
                }
                Err(_) => false,
            }
        }),
    });
    // What embed reads its tokenizer with (and, below, Whisper's loader).
    t.push(Target {
        name: "embed-tokenizer",
        base: std::fs::read(common::model("all-minilm-l6-v2/tokenizer.json")).unwrap(),
        hot: usize::MAX,
        json: true,
        open: Box::new(|bytes, path| {
            std::fs::write(path, bytes).unwrap();
            match lfm::formats::hf::read_tokenizer_json(path) {
                Ok(tok) => {
                    let _ = tok.encode("A man is eating food, 12345!", true);
                    true
                }
                Err(_) => false,
            }
        }),
    });
    let whisper_tokenizer = std::fs::read(common::model("whisper-tiny.en/tokenizer.json")).unwrap();
    t.push(Target {
        name: "whisper-tokenizer",
        base: whisper_tokenizer,
        hot: usize::MAX,
        json: true,
        open: Box::new(|bytes, path| {
            std::fs::write(path, bytes).unwrap();
            lfm::models::whisper::tokens::Tokenizer::load(path).is_ok()
        }),
    });
    let config_dir = dir.join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "model.safetensors",
    ] {
        std::fs::copy(
            repo.join("samples/fixtures/llm/tiny-lfm2").join(f),
            config_dir.join(f),
        )
        .unwrap();
    }
    t.push(Target {
        name: "config-json",
        base: std::fs::read(repo.join("samples/fixtures/llm/tiny-lfm2/config.json")).unwrap(),
        hot: usize::MAX,
        json: true,
        open: Box::new(move |bytes, _| {
            std::fs::write(config_dir.join("config.json"), bytes).unwrap();
            let opts = lfm::models::LoadOptions {
                device: lfm::cli::DeviceChoice::Cpu,
                weight_type: None,
                cpu_activations: lfm::tensor::Activations::F32,
            };
            lfm::models::load_llm(&config_dir, &opts).is_ok()
        }),
    });
    t
}

/// Runs `cases` cases (or until `deadline`) per target from `seed`; returns
/// (target, cases, opened) rows. A panic keeps the input and fails.
fn campaign(
    seed: u64,
    cases: usize,
    deadline: Option<Duration>,
) -> Vec<(&'static str, usize, usize)> {
    let dir = temp_dir(&format!("inputs-{seed}"));
    let mut rows = Vec::new();
    // The WAV targets print a warning per damaged file; only panics matter.
    lfm::util::log::set_quiet(true);
    let only = std::env::var("LFM_FUZZ_TARGETS").ok();
    let mut all = targets(&dir);
    if let Some(only) = &only {
        all.retain(|t| only.split(',').any(|n| n == t.name));
        assert!(!all.is_empty(), "LFM_FUZZ_TARGETS={only} names no target");
    }
    let per_target = deadline.map(|d| d / all.len() as u32);
    for target in all {
        let mut rng = Rng::new(seed ^ (target.name.len() as u64 * 0x9E37));
        let start = Instant::now();
        let (mut done, mut opened) = (0, 0);
        let path = dir.join(format!("case-{}", target.name));
        while match per_target {
            Some(d) => start.elapsed() < d,
            None => done < cases,
        } {
            let mut bytes = target.base.clone();
            if target.json {
                mutate_json(&mut rng, &mut bytes);
            } else {
                mutate(&mut rng, &mut bytes, target.hot);
            }
            let r = catch_unwind(AssertUnwindSafe(|| (target.open)(&bytes, &path)));
            match r {
                Ok(true) => opened += 1,
                Ok(false) => {}
                Err(_) => {
                    let keep = std::env::temp_dir()
                        .join(format!("lfm-fuzz-crash-{}-{seed}-{done}", target.name));
                    std::fs::write(&keep, &bytes).unwrap();
                    panic!(
                        "{} case {done} of seed {seed} panicked; input kept as {}",
                        target.name,
                        keep.display()
                    );
                }
            }
            done += 1;
        }
        eprintln!("{}: {done} cases, {opened} opened", target.name);
        rows.push((target.name, done, opened));
    }
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

#[test]
fn mutated_inputs_are_errors_not_panics() {
    let rows = campaign(1, 120, None);
    for (name, done, _) in &rows {
        assert_eq!(*done, 120, "{name}");
    }
    // The unmutated bases open (so the campaign reaches past the headers).
    let dir = temp_dir("bases");
    for t in targets(&dir) {
        assert!(
            (t.open)(&t.base, &dir.join(format!("base-{}", t.name))),
            "{} base does not open",
            t.name
        );
    }
}

#[test]
#[ignore = "long campaign, run by hand (docs/fuzzing.md)"]
fn long_campaign() {
    let secs = std::env::var("LFM_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let seed = std::env::var("LFM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    for (name, done, opened) in campaign(seed, 0, Some(Duration::from_secs(secs))) {
        println!("| {name} | {done} | {opened} |");
    }
}
