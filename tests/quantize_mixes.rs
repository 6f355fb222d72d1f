//! `quantize --to Q4_K_M` (and the other K-quant mixes) give every tensor
//! the type llama-quantize gives it: the types llama-quantize chose for the
//! tiny fixtures are in samples/fixtures/quant/llama_quantize_mixes.json
//! (scripts/fixtures/quant_mixes.py), and our plan for the same files must
//! equal them tensor for tensor, GGUF and HF directory alike.

mod common;
use common::*;

use lfm::quant::policy::{Mix, Policy};
use lfm::run::convert::{plan, PlanOptions};
use std::collections::BTreeMap;

fn expected() -> serde_json::Value {
    let path = repo().join("samples/fixtures/quant/llama_quantize_mixes.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn planned(input: &std::path::Path, mix: Mix) -> BTreeMap<String, String> {
    let policy = Policy {
        mix: Some(mix),
        ..Policy::pure(mix.base())
    };
    let opts = PlanOptions {
        allow_requantize: false,
        tokenizer_pre: None,
    };
    plan(input, &policy, &opts)
        .unwrap()
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.to.name().to_string()))
        .collect()
}

#[test]
fn mixes_give_every_tensor_llama_quantizes_type() {
    let want = expected();
    assert_eq!(want["format_version"], 1);
    let mut compared = 0;
    for (fixture, mixes) in want["fixtures"].as_object().unwrap() {
        for (mix_name, types) in mixes.as_object().unwrap() {
            let mix = Mix::from_name(mix_name).unwrap_or_else(|| panic!("{mix_name}"));
            let want: BTreeMap<String, String> = types
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            for input in [
                repo().join(format!("samples/fixtures/llm/{fixture}.f32.gguf")),
                repo().join(format!("samples/fixtures/llm/{fixture}")),
            ] {
                let got = planned(&input, mix);
                assert_eq!(got, want, "{} {mix_name}", input.display());
                compared += got.len();
            }
        }
    }
    assert!(compared > 500, "{compared} tensors compared");
}

#[test]
fn the_cli_takes_mix_names_and_records_the_file_type() {
    let dir = scratch("quantize-mix");
    let out = dir.join("tiny-q4_k_m.gguf");
    let src = repo().join("samples/fixtures/llm/tiny-lfm2.f32.gguf");
    let o = run(
        env!("CARGO_BIN_EXE_quantize"),
        &[
            src.to_str().unwrap(),
            out.to_str().unwrap(),
            "Q4_K_M",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let g = lfm::formats::gguf::GgufFile::open(&out).unwrap();
    assert_eq!(
        g.get_u32("general.file_type").unwrap(),
        15,
        "LLAMA_FTYPE_MOSTLY_Q4_K_M"
    );
    let o = run(
        env!("CARGO_BIN_EXE_quantize"),
        &[src.to_str().unwrap(), "--to", "q4_k_x"],
    );
    assert_usage_failure(&o, &["q4_k_x", "q4_k_m"]);
}
