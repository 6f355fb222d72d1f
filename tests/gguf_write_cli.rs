//! `gguf-write` on the tiny LFM2 and Llama checkpoints: the files equal
//! llama.cpp's own conversions (`convert_hf_to_gguf.py --outtype f32`, in
//! samples/fixtures/llm/) key for key and byte for byte, load with our
//! reader and loader with the same logits as the HF directory, and every bad
//! input fails cleanly without touching what was there.

mod common;
use common::*;

use lfm::cli::DeviceChoice;
use lfm::formats::gguf::{GgufFile, Value};
use lfm::formats::TensorSource;
use lfm::models::{load_llm, LoadOptions};
use lfm::quant::GgmlType;
use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_gguf-write");

fn fixture(rel: &str) -> std::path::PathBuf {
    repo().join("samples/fixtures/llm").join(rel)
}

/// Keys that may differ from llama.cpp's conversion: the display name
/// (llama.cpp derives "Tiny Lfm2" from the directory name with heuristics
/// we do not copy; we write the directory name).
const MAY_DIFFER: [&str; 1] = ["general.name"];

fn assert_same_as_llama_cpp(ours: &Path, theirs: &Path) {
    let (a, b) = (
        GgufFile::open(ours).unwrap(),
        GgufFile::open(theirs).unwrap(),
    );
    let keys = |g: &GgufFile| -> Vec<(String, Value)> {
        g.metadata()
            .iter()
            .filter(|(k, _)| !MAY_DIFFER.contains(&k.as_str()))
            .cloned()
            .collect()
    };
    let (ka, kb) = (keys(&a), keys(&b));
    assert_eq!(
        ka.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        kb.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        "metadata keys and their order"
    );
    for ((k, va), (_, vb)) in ka.iter().zip(&kb) {
        assert_eq!(va, vb, "metadata value of {k} (type and value)");
    }
    assert!(a.get("general.name").is_some());
    assert_eq!(a.alignment(), b.alignment());
    let (ta, tb) = (a.tensor_infos(), b.tensor_infos());
    assert_eq!(
        ta.iter().map(|t| &t.name).collect::<Vec<_>>(),
        tb.iter().map(|t| &t.name).collect::<Vec<_>>(),
        "tensor names and order"
    );
    for (x, y) in ta.iter().zip(tb) {
        assert_eq!((x.dtype, &x.shape), (y.dtype, &y.shape), "{}", x.name);
        assert!(
            a.tensor(&x.name).unwrap().bytes() == b.tensor(&y.name).unwrap().bytes(),
            "{}: bytes differ",
            x.name
        );
    }
}

fn cpu(weight_type: Option<GgmlType>) -> LoadOptions {
    LoadOptions {
        device: DeviceChoice::Cpu,
        weight_type,
        cpu_activations: lfm::tensor::Activations::F32,
    }
}

/// All-position logits of a fixed token sequence.
fn logits(path: &Path) -> Vec<f32> {
    let mut m = load_llm(path, &cpu(None)).unwrap();
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 384).collect();
    m.model.forward(&ids, true).unwrap()
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn tiny_checkpoints_equal_llama_cpp_conversions_and_load_with_the_same_logits() {
    let dir = scratch("gguf-write-same");
    for (arch, tensors) in [
        ("lfm2", 40),
        ("llama", 29),
        ("qwen2", 38),
        ("qwen3", 36),
        ("llama3", 30),
        ("phi3", 21),
        // Gemma's SentencePiece tokenizer.model, (1 + w) norms, sliding window.
        ("gemma3-spm", 80),
    ] {
        let out = dir.join(format!("tiny-{arch}.f32.gguf"));
        let src = fixture(&format!("tiny-{arch}"));
        let o = run(
            BIN,
            &[
                src.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "--type",
                "f32",
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stdout(&o).contains(&format!("{tensors} tensors")),
            "{}",
            stdout(&o)
        );
        assert_same_as_llama_cpp(&out, &fixture(&format!("tiny-{arch}.f32.gguf")));

        let (ours, hf) = (logits(&out), logits(&src));
        if !arch.starts_with("llama") {
            // Same tensors, same forward: bit for bit.
            assert_eq!(ours, hf, "{arch}: logits");
        } else {
            // Llama's GGUF q/k rows are permuted for interleaved RoPE, which
            // only reorders the sums of the attention scores.
            let d = max_rel_diff(&ours, &hf);
            assert!(d < 1e-5, "{arch}: logits differ by {d:e} of the range");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn f16_and_bf16_keep_norms_and_conv_taps_f32() {
    let dir = scratch("gguf-write-half");
    let src = fixture("tiny-lfm2");
    let reference = logits(&src);
    for (t, ftype, tol) in [("f16", 1u32, 2e-3f32), ("bf16", 32, 2e-2)] {
        let out = dir.join(format!("{t}.gguf"));
        let o = run(
            BIN,
            &[src.to_str().unwrap(), "-o", out.to_str().unwrap(), "-t", t],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let g = GgufFile::open(&out).unwrap();
        assert_eq!(g.get_u32("general.file_type").unwrap(), ftype);
        let want = GgmlType::from_name(t).unwrap();
        for info in g.tensor_infos() {
            let kept = info.shape.len() == 1 || info.name.contains("shortconv.conv");
            let expected = if kept { GgmlType::F32 } else { want };
            assert_eq!(info.dtype, expected, "{t}: {}", info.name);
        }
        let d = max_rel_diff(&logits(&out), &reference);
        assert!(
            d > 0.0 && d < tol,
            "{t}: logits differ by {d:e} of the range"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn existing_output_is_kept_without_force_and_replaced_with_it() {
    let dir = scratch("gguf-write-force");
    let out = dir.join("out.gguf");
    std::fs::write(&out, b"precious").unwrap();
    let src = fixture("tiny-llama");
    let args = [src.to_str().unwrap(), "-o", out.to_str().unwrap()];
    let o = run(BIN, &args);
    assert_clean_failure(&o, &["out.gguf", "already exists", "--force"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    let o = run(BIN, &[&args[..], &["--force"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(GgufFile::open(&out).is_ok());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "temporary file left"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A write that fails part-way (here the file-size limit, which fails
/// writes as a full disk does) leaves neither a partial file nor a
/// temporary one, and the old output survives.
#[test]
fn failed_write_removes_the_partial_file_and_keeps_the_old_output() {
    let dir = scratch("gguf-write-full");
    let out = dir.join("out.gguf");
    std::fs::write(&out, b"old").unwrap();
    let src = fixture("tiny-lfm2");
    // SIGXFSZ is ignored so the write returns EFBIG instead of killing us.
    let script = format!(
        "trap '' XFSZ; ulimit -f 64; exec {BIN} {} -o {} -t f32 --force",
        src.display(),
        out.display()
    );
    let o = std::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_clean_failure(&o, &["out.gguf"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"old");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("out.gguf")],
        "partial file left"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_inputs_fail_cleanly() {
    let dir = scratch("gguf-write-bad");
    let out = dir.join("o.gguf");
    let o_arg = out.to_str().unwrap();

    // A quantised type is a command-line error (exit 2) naming the other tool.
    let src = fixture("tiny-lfm2");
    let o = run(BIN, &[src.to_str().unwrap(), "-o", o_arg, "-t", "q4_0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("quantize"), "{}", stderr(&o));
    let o = run(BIN, &[src.to_str().unwrap(), "-o", o_arg, "-t", "f8"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown type 'f8'"), "{}", stderr(&o));

    // Not a directory; no such directory.
    let gguf = fixture("tiny-lfm2.f32.gguf");
    assert_clean_failure(
        &run(BIN, &[gguf.to_str().unwrap(), "-o", o_arg]),
        &["not a directory"],
    );
    assert_clean_failure(
        &run(BIN, &["/no/such/model", "-o", o_arg]),
        &["/no/such/model"],
    );

    // A directory without a tokenizer, and one of an unsupported architecture.
    let copy = dir.join("no-tokenizer");
    std::fs::create_dir_all(&copy).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), copy.join(f)).unwrap();
    }
    assert_clean_failure(
        &run(BIN, &[copy.to_str().unwrap(), "-o", o_arg]),
        &["tokenizer.json"],
    );
    let config = std::fs::read_to_string(copy.join("config.json")).unwrap();
    std::fs::write(
        copy.join("config.json"),
        config.replace("\"lfm2\"", "\"mamba\""),
    )
    .unwrap();
    assert_clean_failure(
        &run(BIN, &[copy.to_str().unwrap(), "-o", o_arg]),
        &["config.json", "mamba"],
    );

    // A tensor of an unsupported dtype.
    let i64_dir = dir.join("i64");
    std::fs::create_dir_all(&i64_dir).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), i64_dir.join(f)).unwrap();
    }
    let header =
        br#"{"model.embed_tokens.weight":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}"#;
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(header);
    st.extend_from_slice(&[0u8; 16]);
    std::fs::write(i64_dir.join("model.safetensors"), st).unwrap();
    assert_clean_failure(
        &run(BIN, &[i64_dir.to_str().unwrap(), "-o", o_arg]),
        &["model.safetensors", "I64"],
    );

    assert!(!out.exists(), "no output for a failed run");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        2,
        "only the two input directories remain"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
