//! Mutation fuzzing of the GGUF and safetensors readers. Starting from small
//! valid files built here, each case applies a few seeded random mutations
//! (bit flips, byte overwrites, extreme values written over 4- and 8-byte
//! fields, truncations, insertions, deletions, duplicated ranges, and for
//! safetensors numbers in the JSON header replaced by extreme ones and
//! entries rewritten with random shapes and offsets; a quarter of the GGUF
//! cases are instead generated from random structural choices), then
//! opens the result and, when it opens, reads every metadata value and every
//! tensor and runs a matrix-vector product over it. The readers must return
//! `Ok` or `Err`, never panic, and never ask for an absurd allocation: this
//! test binary's allocator refuses any single allocation over 256 MiB, which
//! aborts the run.
//!
//! `cargo test --test formats_fuzz` runs a quick campaign (a few thousand
//! cases per format). A longer one, not run in CI (see docs/fuzzing.md):
//! `LFM_FUZZ_SECONDS=600 cargo test --release --test formats_fuzz -- --ignored --nocapture`

mod fuzz_support;

use fuzz_support::temp_dir;
use lfm::formats::gguf::{Array, GgufFile, GgufWriter, Value};
use lfm::formats::safetensors::Safetensors;
use lfm::formats::TensorSource;
use lfm::quant::GgmlType;
use lfm::tensor::{matvec, Tensor};
use lfm::util::rng::Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

fn base_gguf(dir: &Path) -> Vec<u8> {
    let mut rng = Rng::new(3);
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama").unwrap();
    w.set("llama.block_count", 2u32).unwrap();
    w.set("llama.rope.freq_base", 10000.0f32).unwrap();
    w.set("llama.use_parallel_residual", true).unwrap();
    w.set("general.file_type", 2u64).unwrap();
    let tokens: Vec<String> = ["<s>", "</s>", "a", "b", "Ġthe", "é"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    w.set("tokenizer.ggml.tokens", tokens).unwrap();
    w.set("tokenizer.ggml.scores", vec![0.0f32, -1.0, -2.0, -3.0])
        .unwrap();
    w.set("tokenizer.ggml.token_type", vec![1i32, 3, 1, 1])
        .unwrap();
    w.set(
        "x.nested",
        Array::Array(vec![
            Array::U16(vec![1, 2]),
            Array::String(vec!["s".into()]),
        ]),
    )
    .unwrap();
    let types = [
        (GgmlType::F32, vec![3, 8]),
        (GgmlType::F16, vec![2, 8]),
        (GgmlType::BF16, vec![4]),
        (GgmlType::Q4_0, vec![2, 32]),
        (GgmlType::Q4_1, vec![1, 32]),
        (GgmlType::Q5_0, vec![1, 32]),
        (GgmlType::Q5_1, vec![1, 32]),
        (GgmlType::Q8_0, vec![1, 1, 32]),
        (GgmlType::Q1_0, vec![1, 128]),
        (GgmlType::Q2_K, vec![1, 256]),
        (GgmlType::Q4_K, vec![1, 256]),
        (GgmlType::Q6_K, vec![1, 256]),
    ];
    for (i, (t, shape)) in types.into_iter().enumerate() {
        let n = shape.iter().product();
        let data = rng.vec(n, -1.0, 1.0);
        w.add_tensor(Tensor::quantize_f32(format!("t{i}.{t}"), shape, &data, t).unwrap())
            .unwrap();
    }
    let path = dir.join("base.gguf");
    w.write(&path, true).unwrap();
    std::fs::read(&path).unwrap()
}

fn base_safetensors() -> Vec<u8> {
    use safetensors::tensor::{Dtype, TensorView};
    let f32s: Vec<u8> = (0..12).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let halves: Vec<u8> = (0..6)
        .flat_map(|i| (i as u16 * 977).to_le_bytes())
        .collect();
    let longs = vec![7u8; 16];
    let views = vec![
        (
            "a.weight",
            TensorView::new(Dtype::F32, vec![3, 4], &f32s).unwrap(),
        ),
        (
            "b.weight",
            TensorView::new(Dtype::F16, vec![2, 3], &halves).unwrap(),
        ),
        (
            "c.weight",
            TensorView::new(Dtype::BF16, vec![6], &halves).unwrap(),
        ),
        (
            "position_ids",
            TensorView::new(Dtype::I64, vec![1, 2], &longs).unwrap(),
        ),
    ];
    let meta = [("format".to_string(), "pt".to_string())].into();
    safetensors::serialize(views, Some(meta)).unwrap()
}

/// Values that break naive readers when written over a count, length,
/// dimension or offset.
fn extreme(rng: &mut Rng, len: usize) -> u64 {
    let choices = [
        0,
        1,
        u64::MAX,
        u64::MAX - 1,
        u32::MAX as u64,
        1 << 31,
        1 << 32,
        1 << 62,
        1 << 63,
        i64::MAX as u64,
        len as u64,
        len as u64 + 1,
        (len as u64).wrapping_sub(8),
        rng.next_u64() % 4096,
        rng.next_u64(),
    ];
    choices[(rng.next_u64() % choices.len() as u64) as usize]
}

fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

/// Applies one to four random mutations. `hot` is the length of the prefix
/// that holds the structure (header and tensor infos), where most of the
/// mutations land.
fn mutate(rng: &mut Rng, base: &[u8], hot: usize, json: bool) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..1 + below(rng, 4) {
        if b.is_empty() {
            break;
        }
        let region = if below(rng, 5) > 0 {
            hot.min(b.len())
        } else {
            b.len()
        };
        let pos = below(rng, region);
        match below(rng, if json { 11 } else { 9 }) {
            0 => b[pos] ^= 1 << below(rng, 8),
            1 => b[pos] = rng.next_u64() as u8,
            2 | 3 => {
                let v = extreme(rng, b.len()).to_le_bytes();
                let pos = pos & !7;
                let n = (b.len() - pos).min(8);
                b[pos..pos + n].copy_from_slice(&v[..n]);
            }
            4 => {
                let v = (extreme(rng, b.len()) as u32).to_le_bytes();
                let pos = pos & !3;
                let n = (b.len() - pos).min(4);
                b[pos..pos + n].copy_from_slice(&v[..n]);
            }
            5 => b.truncate(pos),
            6 => {
                let ins: Vec<u8> = (0..1 + below(rng, 16))
                    .map(|_| rng.next_u64() as u8)
                    .collect();
                b.splice(pos..pos, ins);
            }
            7 => {
                let end = (pos + 1 + below(rng, 32)).min(b.len());
                b.drain(pos..end);
            }
            8 => {
                let end = (pos + 1 + below(rng, 64)).min(b.len());
                let chunk = b[pos..end].to_vec();
                let at = below(rng, b.len());
                b.splice(at..at, chunk);
            }
            9 => replace_json_number(rng, &mut b, hot),
            _ => rewrite_safetensors_entry(rng, &mut b),
        }
    }
    b
}

/// A GGUF file generated from random structural choices rather than by
/// mutation: random version, metadata of random (also nested and unknown)
/// types with random counts, tensor infos with random dimension counts,
/// dimensions, type ids and offsets, an optional `general.alignment`, and a
/// random amount of data. This reaches combinations (a zero next to a huge
/// dimension, an offset just past the end) that byte mutations seldom hit.
fn generate_gguf(rng: &mut Rng) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    let put32 = |b: &mut Vec<u8>, v: u32| b.extend_from_slice(&v.to_le_bytes());
    let put64 = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
    let version = [2, 3, 3, 3, 1, 4][below(rng, 6)];
    put32(&mut b, version);
    let n_tensors = below(rng, 5);
    let n_kv = below(rng, 5);
    put64(
        &mut b,
        if below(rng, 20) == 0 {
            extreme(rng, 64)
        } else {
            n_tensors as u64
        },
    );
    put64(
        &mut b,
        if below(rng, 20) == 0 {
            extreme(rng, 64)
        } else {
            n_kv as u64
        },
    );
    fn value(rng: &mut Rng, b: &mut Vec<u8>, t: u32, depth: usize) {
        match t {
            0 | 1 | 7 => b.push(below(rng, 3) as u8),
            2 | 3 => b.extend_from_slice(&(rng.next_u64() as u16).to_le_bytes()),
            4..=6 => b.extend_from_slice(&(rng.next_u64() as u32).to_le_bytes()),
            8 => {
                let n = below(rng, 6);
                let len = if below(rng, 10) == 0 {
                    extreme(rng, b.len())
                } else {
                    n as u64
                };
                b.extend_from_slice(&len.to_le_bytes());
                b.extend((0..n).map(|_| b"ab\xc3\xa9z"[below(rng, 5)]));
            }
            9 => {
                let et = if depth > 3 {
                    below(rng, 9) as u32
                } else {
                    below(rng, 14) as u32
                };
                b.extend_from_slice(&et.to_le_bytes());
                let n = below(rng, 4);
                let count = if below(rng, 10) == 0 {
                    extreme(rng, b.len())
                } else {
                    n as u64
                };
                b.extend_from_slice(&count.to_le_bytes());
                for _ in 0..n {
                    value(rng, b, et, depth + 1);
                }
            }
            10..=12 => b.extend_from_slice(&rng.next_u64().to_le_bytes()),
            _ => {}
        }
    }
    let mut alignment_set = false;
    for i in 0..n_kv {
        let key = if !alignment_set && below(rng, 4) == 0 {
            alignment_set = true;
            "general.alignment".to_string()
        } else {
            format!("k{i}")
        };
        put64(&mut b, key.len() as u64);
        b.extend_from_slice(key.as_bytes());
        let t = if key == "general.alignment" && below(rng, 2) == 0 {
            4
        } else {
            below(rng, 14) as u32
        };
        put32(&mut b, t);
        if key == "general.alignment" && t == 4 {
            put32(&mut b, [1, 2, 8, 32, 64, 0, 3, 1 << 31][below(rng, 8)]);
        } else {
            value(rng, &mut b, t, 0);
        }
    }
    let dims = [
        0u64,
        1,
        2,
        3,
        31,
        32,
        33,
        64,
        128,
        256,
        1 << 31,
        1 << 32,
        1 << 62,
        u64::MAX,
    ];
    let types = [
        0u32, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30, 41, 9, 16, 42, 99,
    ];
    for i in 0..n_tensors {
        let name = format!("t{}", if below(rng, 10) == 0 { 0 } else { i });
        put64(&mut b, name.len() as u64);
        b.extend_from_slice(name.as_bytes());
        let n_dims = [1, 1, 2, 2, 3, 4, 0, 5][below(rng, 8)];
        put32(&mut b, n_dims);
        for _ in 0..n_dims {
            put64(&mut b, dims[below(rng, dims.len())]);
        }
        put32(&mut b, types[below(rng, types.len())]);
        let offset = match below(rng, 4) {
            0 => 0,
            1 => 32 * below(rng, 40) as u64,
            2 => below(rng, 2048) as u64,
            _ => extreme(rng, 4096),
        };
        put64(&mut b, offset);
    }
    let data = below(rng, 2048);
    b.extend((0..data).map(|_| rng.next_u64() as u8));
    b
}

/// Replaces a run of digits in the JSON header with an extreme number.
fn replace_json_number(rng: &mut Rng, b: &mut Vec<u8>, hot: usize) {
    let end = hot.min(b.len());
    let digits: Vec<usize> = (8..end).filter(|&i| b[i].is_ascii_digit()).collect();
    if digits.is_empty() {
        return;
    }
    let start = digits[below(rng, digits.len())];
    let mut stop = start;
    while stop < end && b[stop].is_ascii_digit() {
        stop += 1;
    }
    let new: &[u8] = [
        &b"18446744073709551615"[..],
        b"18446744073709551616",
        b"9223372036854775807",
        b"4294967296",
        b"-1",
        b"0",
        b"1e30",
        b"0.5",
        b"99999999999999999999999",
    ][below(rng, 9)];
    b.splice(start..stop, new.iter().copied());
}

/// Rewrites one tensor entry of a safetensors header with a random shape
/// (zeros, ones, huge dimensions, up to five of them) and offsets that are
/// either kept, empty or extreme, then re-serialises the header.
fn rewrite_safetensors_entry(rng: &mut Rng, b: &mut Vec<u8>) {
    let Some(n) = b
        .get(..8)
        .map(|h| u64::from_le_bytes(h.try_into().unwrap()) as usize)
    else {
        return;
    };
    let Some(Ok(mut header)) = b
        .get(8..8usize.saturating_add(n))
        .map(serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>)
    else {
        return;
    };
    let names: Vec<String> = header
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    if names.is_empty() {
        return;
    }
    let entry = &mut header[&names[below(rng, names.len())]];
    let dims = [
        0u64,
        1,
        2,
        3,
        4,
        1 << 20,
        1 << 31,
        1 << 32,
        1 << 62,
        u64::MAX,
    ];
    let shape: Vec<u64> = (0..below(rng, 6))
        .map(|_| dims[below(rng, dims.len())])
        .collect();
    entry["shape"] = serde_json::json!(shape);
    let start = entry["data_offsets"][0].as_u64().unwrap_or(0);
    match below(rng, 3) {
        0 => {}
        1 => entry["data_offsets"] = serde_json::json!([start, start]),
        _ => entry["data_offsets"] = serde_json::json!([start, extreme(rng, b.len())]),
    }
    let text = serde_json::to_vec(&header).unwrap();
    let data = b[8 + n..].to_vec();
    b.clear();
    b.extend_from_slice(&(text.len() as u64).to_le_bytes());
    b.extend_from_slice(&text);
    b.extend_from_slice(&data);
}

/// Reads everything a model would read from an opened file.
fn exercise(src: &dyn TensorSource) {
    for name in src.names() {
        let Ok(t) = src.tensor(&name) else { continue };
        let v = t.to_f32();
        assert_eq!(v.len(), t.numel());
        // A tensor with a zero dimension may still have a huge row count:
        // only multiply tensors that hold elements.
        if t.numel() > 0 && t.row_len() <= 1 << 16 {
            let x = vec![1.0f32; t.row_len()];
            let mut y = vec![0.0f32; t.rows()];
            matvec(&t, &x, &mut y);
        }
    }
}

fn exercise_gguf(f: &GgufFile) {
    let _ = f.architecture();
    for (key, v) in f.metadata() {
        let _ = (
            f.get_u32(key),
            f.get_i32(key),
            f.get_usize(key),
            f.get_f32(key),
        );
        let _ = (f.get_bool(key), f.get_str(key), f.get_str_array(key));
        let _ = (
            f.get_f32_array(key),
            f.get_i32_array(key),
            f.get_usize_array(key),
        );
        if let Value::Array(a) = v {
            let _ = a.to_i128s();
        }
    }
    exercise(f);
}

struct Campaign {
    cases: u64,
    opened: u64,
    /// Cases made by `generate_gguf`, and how many of those opened.
    generated: u64,
    generated_opened: u64,
}

/// Runs cases until `budget` (a case count or a deadline) is spent; a panic
/// fails the test with the seed and the mutated file kept for replay.
fn campaign(
    name: &str,
    base: &[u8],
    hot: usize,
    json: bool,
    seed: u64,
    budget: impl Fn(u64) -> bool,
    open: impl Fn(&Path) -> bool,
) -> Campaign {
    let dir = temp_dir(name);
    let path = dir.join(format!("case.{name}"));
    let mut rng = Rng::new(seed);
    let mut c = Campaign {
        cases: 0,
        opened: 0,
        generated: 0,
        generated_opened: 0,
    };
    while budget(c.cases) {
        let generated = !json && below(&mut rng, 4) == 0;
        let bytes = if generated {
            generate_gguf(&mut rng)
        } else {
            mutate(&mut rng, base, hot, json)
        };
        c.generated += generated as u64;
        std::fs::write(&path, &bytes).unwrap();
        match catch_unwind(AssertUnwindSafe(|| open(&path))) {
            Ok(true) => {
                c.opened += 1;
                c.generated_opened += generated as u64;
            }
            Ok(false) => {}
            Err(_) => {
                let keep = std::env::temp_dir().join(format!("lfm-fuzz-crash-{name}-{}", c.cases));
                std::fs::write(&keep, &bytes).unwrap();
                panic!(
                    "{name}: case {} (seed {seed}) panicked; input kept in {}",
                    c.cases,
                    keep.display()
                );
            }
        }
        c.cases += 1;
    }
    std::fs::remove_dir_all(&dir).unwrap();
    c
}

fn open_gguf(p: &Path) -> bool {
    match GgufFile::open(p) {
        Ok(f) => {
            exercise_gguf(&f);
            true
        }
        Err(e) => {
            assert!(e.to_string().starts_with(&p.display().to_string()), "{e}");
            false
        }
    }
}

fn open_safetensors(p: &Path) -> bool {
    match Safetensors::open(p) {
        Ok(f) => {
            exercise(&f);
            true
        }
        Err(e) => {
            assert!(e.to_string().starts_with(&p.display().to_string()), "{e}");
            false
        }
    }
}

fn gguf_hot_len(base: &[u8], dir: &Path) -> usize {
    let path = dir.join("hot.gguf");
    std::fs::write(&path, base).unwrap();
    GgufFile::open(&path).unwrap().data_offset()
}

#[test]
fn gguf_mutations_never_panic() {
    let dir = temp_dir("gguf-base");
    let base = base_gguf(&dir);
    let hot = gguf_hot_len(&base, &dir);
    let c = campaign("gguf", &base, hot, false, 1, |n| n < 3000, open_gguf);
    eprintln!(
        "gguf: {} cases, {} opened ({} generated, {} of those opened)",
        c.cases, c.opened, c.generated, c.generated_opened
    );
    assert!(
        c.opened > 0 && c.opened < c.cases,
        "mutations should both break and spare files"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn safetensors_mutations_never_panic() {
    let base = base_safetensors();
    let hot = 8 + u64::from_le_bytes(base[..8].try_into().unwrap()) as usize;
    let c = campaign("st", &base, hot, true, 2, |n| n < 3000, open_safetensors);
    eprintln!("safetensors: {} cases, {} opened", c.cases, c.opened);
    assert!(
        c.opened > 0 && c.opened < c.cases,
        "mutations should both break and spare files"
    );
}

/// The long campaign recorded in docs/fuzzing.md: `LFM_FUZZ_SECONDS` per
/// format (default 60), seeds from `LFM_FUZZ_SEED` (default 1000).
#[test]
#[ignore = "minutes long; run by hand, see docs/fuzzing.md"]
fn long_campaign() {
    let secs: u64 = std::env::var("LFM_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("LFM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let dir = temp_dir("long-base");
    let gguf = base_gguf(&dir);
    let hot = gguf_hot_len(&gguf, &dir);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let c = campaign(
        "gguf-long",
        &gguf,
        hot,
        false,
        seed,
        |_| Instant::now() < deadline,
        open_gguf,
    );
    eprintln!(
        "gguf: {} cases in {secs} s, {} opened ({} generated, {} of those opened)",
        c.cases, c.opened, c.generated, c.generated_opened
    );
    let st = base_safetensors();
    let hot = 8 + u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let c = campaign(
        "st-long",
        &st,
        hot,
        true,
        seed + 1,
        |_| Instant::now() < deadline,
        open_safetensors,
    );
    eprintln!(
        "safetensors: {} cases in {secs} s, {} opened",
        c.cases, c.opened
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
