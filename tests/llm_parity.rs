//! The CPU reference against transformers: tiny random LFM2 and Llama
//! checkpoints (HF directories and llama.cpp's GGUF conversions of them), with
//! logits recorded by scripts/fixtures/llm_tiny.py at every prompt position and
//! every greedy decode step. See samples/fixtures/llm/README.md.

mod common;

use lfm::cli::DeviceChoice;
use lfm::models::{load_llm, LoadOptions};
use safetensors::SafeTensors;

struct Gold {
    prompt: Vec<u32>,
    prefill: Vec<f32>,
    steps: Vec<f32>,
    tokens: Vec<u32>,
}

fn gold(name: &str) -> Gold {
    let bytes = std::fs::read(
        common::repo().join(format!("samples/fixtures/llm/{name}.logits.safetensors")),
    )
    .unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(meta.metadata().as_ref().unwrap()["format_version"], "1");
    let f32s = |n: &str| -> Vec<f32> { bytemuck::pod_collect_to_vec(st.tensor(n).unwrap().data()) };
    let ids = |n: &str| -> Vec<u32> {
        bytemuck::pod_collect_to_vec::<u8, i32>(st.tensor(n).unwrap().data())
            .into_iter()
            .map(|v| v as u32)
            .collect()
    };
    Gold {
        prompt: ids("prompt_ids"),
        prefill: f32s("prefill_logits"),
        steps: f32s("step_logits"),
        tokens: ids("tokens"),
    }
}

/// max |got - want| / max |want|: transformers and we both compute in f32
/// with different summation orders; 1e-4 of the logit range is far below
/// any top-1/top-2 gap in these fixtures (smallest: 1.4e-2 of the range).
#[track_caller]
fn assert_logits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    eprintln!("{what}: max |diff| / max |logit| = {:.2e}", err / scale);
    assert!(
        err / scale <= 1e-4,
        "{what}: max |diff| {err} vs max |logit| {scale}"
    );
}

fn check(name: &str, model_path: &str) {
    let g = gold(name);
    let path = common::repo().join("samples/fixtures/llm").join(model_path);
    let mut loaded = load_llm(
        &path,
        &LoadOptions {
            device: DeviceChoice::Cpu,
            weight_type: None,
            cpu_activations: lfm::tensor::Activations::F32,
        },
    )
    .unwrap();
    let vocab = loaded.model.config().vocab;

    // The tokenizer (HF tokenizer.json or the GGUF's embedded one) gives the same prompt ids.
    let tok = loaded.tokenizer.as_ref().expect("fixture has a tokenizer");
    assert_eq!(
        tok.encode("Alice was beginning to get very", false)
            .unwrap(),
        g.prompt,
        "{model_path}: prompt ids"
    );

    let m = loaded.model.as_mut();
    let prefill = m.forward(&g.prompt, true).unwrap();
    assert_logits(&format!("{model_path} prefill"), &prefill, &g.prefill);
    let last = &prefill[(g.prompt.len() - 1) * vocab..];
    assert_logits(&format!("{model_path} step 0"), last, &g.steps[..vocab]);
    let mut next = lfm::run::sampling::argmax(last) as u32;
    assert_eq!(next, g.tokens[0], "{model_path}: greedy token 0");
    for step in 1..g.tokens.len() {
        let logits = m.forward(&[next], false).unwrap();
        assert_logits(
            &format!("{model_path} step {step}"),
            &logits,
            &g.steps[step * vocab..(step + 1) * vocab],
        );
        next = lfm::run::sampling::argmax(&logits) as u32;
        assert_eq!(next, g.tokens[step], "{model_path}: greedy token {step}");
    }
}

#[test]
fn tiny_lfm2_hf_matches_transformers() {
    check("tiny-lfm2", "tiny-lfm2");
}

#[test]
fn tiny_lfm2_gguf_matches_transformers() {
    check("tiny-lfm2", "tiny-lfm2.f32.gguf");
}

#[test]
fn tiny_llama_hf_matches_transformers() {
    check("tiny-llama", "tiny-llama");
}

#[test]
fn tiny_llama_gguf_matches_transformers() {
    check("tiny-llama", "tiny-llama.f32.gguf");
}
