//! `quantize` end to end on the tiny fixtures: every input kind (HF
//! directory, its model.safetensors, a GGUF, a bare safetensors file), the
//! type policy (norms and conv taps kept, fallbacks for rows that do not fit
//! the blocks, --keep), output that our reader and loader take, logits close
//! to the original's and identical to `kld`'s on-the-fly arm of the same
//! type, and clean failures for bad input.
//!
//! The block quantisers themselves are byte-identical to ggml and gguf-py
//! (tests/quant_blocks.rs); here every quantised tensor is also checked to be
//! exactly `Tensor::quantize_f32` of its source.

mod common;
use common::*;

use lfm::cli::DeviceChoice;
use lfm::formats::gguf::GgufFile;
use lfm::formats::TensorSource;
use lfm::models::{load_llm, LoadOptions};
use lfm::quant::GgmlType;
use lfm::tensor::Tensor;
use std::path::{Path, PathBuf};

const BIN: &str = env!("CARGO_BIN_EXE_quantize");

fn fixture(rel: &str) -> PathBuf {
    repo().join("samples/fixtures/llm").join(rel)
}

fn quantize(input: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![input.to_str().unwrap(), "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(BIN, &args)
}

fn logits(path: &Path, weight_type: Option<GgmlType>) -> Vec<f32> {
    let mut m = load_llm(
        path,
        &LoadOptions {
            device: DeviceChoice::Cpu,
            weight_type,
            cpu_activations: lfm::tensor::Activations::F32,
        },
    )
    .unwrap();
    let ids: Vec<u32> = (0..24).map(|i| (i * 53 + 11) % 384).collect();
    m.model.forward(&ids, true).unwrap()
}

/// RMS of the logit difference over the largest reference logit.
fn rms_rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let ms = a
        .iter()
        .zip(b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    ms.sqrt() / scale
}

/// The expected type of each tensor of the tiny LFM2 (hidden 64, ffn 256)
/// quantised to `t`: 1-D tensors and conv taps stay f32; rows of 64 do not
/// fit 128- or 256-element blocks and fall back as llama-quantize does.
fn expected(name: &str, shape: &[usize], t: GgmlType) -> GgmlType {
    if shape.len() == 1 || name.contains("shortconv.conv") {
        return GgmlType::F32;
    }
    lfm::quant::policy::fallback(t, *shape.last().unwrap())
}

#[test]
fn hf_directory_to_every_type_loads_with_expected_types_and_close_logits() {
    let dir = scratch("quantize-types");
    let src = fixture("tiny-lfm2");
    let hf = GgufFile::open(fixture("tiny-lfm2.f32.gguf")).unwrap();
    let reference = logits(&src, None);
    // Bounds on RMS(logit diff) / max |logit| over 24 positions, about twice
    // the measured values (q8_0 6.0e-3, q6_k 6.5e-3, q5_0 4.8e-2, q4_k 4.9e-2,
    // q4_1 8.8e-2, q4_0 1.0e-1, q1_0 1.3e-1). This random model is built to be
    // sensitive (weights scaled up so every layer matters), so it amplifies
    // weight error far more than a trained model; what matters here is that
    // the error is there, bounded, and ordered by precision.
    let cases = [
        ("q8_0", 0.015),
        ("q6_k", 0.015),
        ("q5_0", 0.1),
        ("q4_k", 0.1),
        ("q4_1", 0.18),
        ("q4_0", 0.2),
        ("q1_0", 0.25),
    ];
    let mut errors = Vec::new();
    for (name, tol) in cases {
        let t = GgmlType::from_name(name).unwrap();
        let out = dir.join(format!("{name}.gguf"));
        let o = quantize(&src, &out, &["--to", name]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let g = GgufFile::open(&out).unwrap();
        assert_eq!(
            g.get_u32("general.file_type").unwrap(),
            lfm::quant::policy::llama_file_type(t)
        );
        let mut fell_back = 0;
        for info in g.tensor_infos() {
            let want = expected(&info.name, &info.shape, t);
            assert_eq!(info.dtype, want, "{name}: {}", info.name);
            if want != t && want != GgmlType::F32 {
                fell_back += 1;
                assert!(
                    stderr(&o).contains(&format!("{}: rows of", info.name)),
                    "{name}: fallback of {} not reported",
                    info.name
                );
            }
            // Exactly the reference quantiser on the f32 source (as llama.cpp
            // names it, from its own conversion).
            let source = hf.tensor(&info.name).unwrap();
            let want_bytes =
                Tensor::quantize_f32("x", source.shape.clone(), &source.to_f32(), info.dtype)
                    .unwrap();
            assert!(
                g.tensor(&info.name).unwrap().bytes() == want_bytes.bytes(),
                "{name}: {} bytes",
                info.name
            );
        }
        assert_eq!(fell_back > 0, t.block_size() > 64, "{name}: fallbacks");
        let d = rms_rel_diff(&logits(&out, None), &reference);
        eprintln!("{name}: RMS logit diff / max |logit| = {d:.2e}");
        assert!(d > 0.0 && d < tol, "{name}: {d:e} >= {tol:e}");
        errors.push(d);
        // The same as kld's arm of that type, built on load.
        assert_eq!(
            logits(&out, None),
            logits(&src, Some(t)),
            "{name}: file and on-the-fly arm differ"
        );
    }
    // 8 bits < 5 bits < 4 bits.
    assert!(errors[0] < errors[2] && errors[2] < errors[5], "{errors:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn model_safetensors_in_an_hf_directory_is_the_directory() {
    let dir = scratch("quantize-st");
    let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
    let src = fixture("tiny-llama");
    assert!(quantize(&src, &a, &["--to", "q8_0"]).status.success());
    let o = quantize(&src.join("model.safetensors"), &b, &["--to", "q8_0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gguf_input_keeps_metadata_and_refuses_requantising_unless_asked() {
    let dir = scratch("quantize-gguf");
    let src = fixture("tiny-lfm2.f32.gguf");
    let q4 = dir.join("q4_0.gguf");
    let o = quantize(&src, &q4, &["--to", "q4_0", "--keep", "embed"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (a, b) = (GgufFile::open(&src).unwrap(), GgufFile::open(&q4).unwrap());
    for ((ka, va), (kb, vb)) in a.metadata().iter().zip(b.metadata()) {
        assert_eq!(ka, kb);
        if ka != "general.file_type" {
            assert_eq!(va, vb, "{ka}");
        }
    }
    assert_eq!(b.get_u32("general.file_type").unwrap(), 2);
    let types: Vec<(String, GgmlType)> = b
        .tensor_infos()
        .iter()
        .map(|t| (t.name.clone(), t.dtype))
        .collect();
    assert!(
        types.contains(&("token_embd.weight".into(), GgmlType::F32)),
        "--keep embed"
    );
    assert!(types.contains(&("blk.1.attn_q.weight".into(), GgmlType::Q4_0)));
    let d = rms_rel_diff(&logits(&q4, None), &logits(&src, None));
    assert!(d > 0.0 && d < 0.2, "{d:e}");

    // Quantising the quantised file again is refused by default ...
    let q8 = dir.join("q8_0.gguf");
    let o = quantize(&q4, &q8, &["--to", "q8_0"]);
    assert_clean_failure(&o, &["q4_0.gguf", "already q4_0", "--allow-requantize"]);
    assert!(!q8.exists());
    // ... and done on request.
    let o = quantize(&q4, &q8, &["--to", "q8_0", "--allow-requantize"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        GgufFile::open(&q8)
            .unwrap()
            .tensor_info("blk.1.attn_q.weight")
            .unwrap()
            .dtype,
        GgmlType::Q8_0
    );
    // Dequantising to a float type needs no flag.
    let f32 = dir.join("f32.gguf");
    let o = quantize(&q4, &f32, &["--to", "f32"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        logits(&f32, None),
        logits(&q4, None),
        "f32 holds the q4_0 values exactly"
    );
    // The output may not replace the input.
    let o = quantize(&q4, &q4, &["--to", "q4_0", "--force"]);
    assert_clean_failure(&o, &["replace the input"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bare_safetensors_keeps_names_and_says_it_has_no_model_metadata() {
    let dir = scratch("quantize-bare");
    let bare = dir.join("weights.safetensors");
    std::fs::copy(fixture("tiny-lfm2/model.safetensors"), &bare).unwrap();
    // Default output: beside the input, named after it and the type.
    let o = run(BIN, &[bare.to_str().unwrap(), "--to", "q8_0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("no model metadata"), "{}", stderr(&o));
    let g = GgufFile::open(dir.join("weights-q8_0.gguf")).unwrap();
    assert_eq!(
        g.tensor_info("model.layers.1.self_attn.q_proj.weight")
            .unwrap()
            .dtype,
        GgmlType::Q8_0
    );
    assert_eq!(
        g.tensor_info("model.layers.1.operator_norm.weight")
            .unwrap()
            .dtype,
        GgmlType::F32
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_inputs_fail_cleanly_and_keep_what_was_there() {
    let dir = scratch("quantize-bad");
    let out = dir.join("out.gguf");
    let src = fixture("tiny-lfm2");

    // Unknown type: a command-line error listing the types.
    let o = quantize(&src, &out, &["--to", "q3_0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("unknown type 'q3_0'") && stderr(&o).contains("q1_0"));
    let o = quantize(
        &src,
        &out,
        &["--to", "q4_0", "--keep", "embed", "--embed-type", "q8_0"],
    );
    assert_usage_failure(&o, &["--keep embed", "--embed-type"]);

    // Missing input; a file that is neither GGUF nor safetensors.
    assert_clean_failure(
        &quantize(Path::new("/no/such.gguf"), &out, &["--to", "q4_0"]),
        &["/no/such.gguf"],
    );
    let junk = dir.join("junk.bin");
    std::fs::write(&junk, b"not a model at all").unwrap();
    assert_clean_failure(&quantize(&junk, &out, &["--to", "q4_0"]), &["junk.bin"]);

    // A tensor of an unsupported dtype.
    let header = br#"{"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}"#;
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(header);
    st.extend_from_slice(&[0u8; 16]);
    let i64_file = dir.join("ids.safetensors");
    std::fs::write(&i64_file, st).unwrap();
    assert_clean_failure(
        &quantize(&i64_file, &out, &["--to", "q4_0"]),
        &["ids.safetensors", "I64"],
    );

    // An existing output is kept without --force.
    std::fs::write(&out, b"precious").unwrap();
    assert_clean_failure(
        &quantize(&src, &out, &["--to", "q4_0"]),
        &["already exists"],
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");

    // A write that fails part-way (file-size limit, as a full disk) leaves
    // the old output and no temporary file.
    let script = format!(
        "trap '' XFSZ; ulimit -f 64; exec {BIN} {} -o {} --to f16 --force",
        src.display(),
        out.display()
    );
    let o = std::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_clean_failure(&o, &["out.gguf"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    let mut left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    left.sort();
    assert_eq!(left, ["ids.safetensors", "junk.bin", "out.gguf"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
