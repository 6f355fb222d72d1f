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
    check_dir(
        name,
        &common::repo().join("samples/fixtures/llm").join(model_path),
    );
}

fn check_dir(name: &str, path: &std::path::Path) {
    let g = gold(name);
    let model_path = path.display();
    let mut loaded = load_llm(
        path,
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

#[test]
fn tiny_qwen2_hf_and_gguf_match_transformers() {
    check("tiny-qwen2", "tiny-qwen2");
    check("tiny-qwen2", "tiny-qwen2.f32.gguf");
}

#[test]
fn tiny_qwen3_hf_and_gguf_match_transformers() {
    check("tiny-qwen3", "tiny-qwen3");
    check("tiny-qwen3", "tiny-qwen3.f32.gguf");
}

#[test]
fn tiny_gemma3_hf_matches_transformers() {
    check("tiny-gemma3", "tiny-gemma3");
}

#[test]
fn tiny_phi3_hf_and_gguf_match_transformers() {
    check("tiny-phi3", "tiny-phi3");
    check("tiny-phi3", "tiny-phi3.f32.gguf");
}

#[test]
fn tiny_mistral_hf_matches_transformers() {
    check("tiny-mistral", "tiny-mistral");
}

#[test]
fn tiny_llama3_hf_and_gguf_match_transformers() {
    check("tiny-llama3", "tiny-llama3");
    // llama.cpp's converter stores the scaling as rope_freqs.weight.
    check("tiny-llama3", "tiny-llama3.f32.gguf");
}

/// LFM2's config.json as LiquidAI publishes it: the original key names
/// (block_ff_dim, block_norm_eps, theta, tie_embedding, full_attn_idxs, ...),
/// no intermediate_size or layer_types. The same weights must load to the same
/// model as the transformers-style config.
#[test]
fn lfm2_published_config_style_loads_the_same_model() {
    let src = common::repo().join("samples/fixtures/llm/tiny-lfm2");
    let dir = tempdir_with_copy(&src);
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    let layer_types = cfg["layer_types"].as_array().unwrap();
    let attn: Vec<usize> = (0..layer_types.len())
        .filter(|&i| layer_types[i] == "full_attention")
        .collect();
    let theta = cfg["rope_parameters"]["rope_theta"].clone();
    let published = serde_json::json!({
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "block_auto_adjust_ff_dim": cfg["block_auto_adjust_ff_dim"],
        "block_dim": cfg["hidden_size"],
        "block_ff_dim": cfg["intermediate_size"],
        "block_ffn_dim_multiplier": cfg["block_ffn_dim_multiplier"],
        "block_multiple_of": cfg["block_multiple_of"],
        "block_norm_eps": cfg["norm_eps"],
        "bos_token_id": cfg["bos_token_id"],
        "conv_L_cache": cfg["conv_L_cache"],
        "conv_bias": false,
        "eos_token_id": cfg["eos_token_id"],
        "full_attn_idxs": attn,
        "hidden_size": cfg["hidden_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_heads": cfg["num_attention_heads"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "pad_token_id": cfg["pad_token_id"],
        "theta": theta,
        "tie_embedding": true,
        "vocab_size": cfg["vocab_size"],
    });
    std::fs::write(dir.join("config.json"), published.to_string()).unwrap();
    let open = |p: &std::path::Path| lfm::models::open_llm(p).unwrap();
    let (want, _) = open(&src);
    let (got, _) = open(&dir);
    assert_eq!(format!("{got:?}"), format!("{want:?}"));
    check_dir("tiny-lfm2", &dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A copy of the model directory `src` in a fresh temporary directory.
fn tempdir_with_copy(src: &std::path::Path) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("lfm-published-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

/// A RoPE scaling or architecture we do not implement is refused by name,
/// with what is supported, never run with a silent fallback.
#[test]
fn unknown_architectures_and_rope_scalings_are_refused_by_name() {
    let src = common::repo().join("samples/fixtures/llm/tiny-llama");
    let dir = tempdir_with_copy(&src);
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg["rope_parameters"] =
        serde_json::json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let err = lfm::models::open_llm(&dir)
        .err()
        .expect("yarn is refused")
        .to_string();
    assert!(err.contains("'yarn'") && err.contains("llama3"), "{err}");
    assert!(err.contains("config.json"), "names the file: {err}");
    cfg["model_type"] = "falcon".into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let err = lfm::models::open_llm(&dir)
        .err()
        .expect("falcon is refused")
        .to_string();
    assert!(
        err.contains("'falcon'") && err.contains("gemma3_text"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every published LFM2 size's config in LiquidAI's key style (no hub is
/// reachable here: the files are written from the released configs' keys and
/// sizes) parses to the shapes of the released checkpoints: the feed-forward
/// width transformers derives from `block_ff_dim` (2/3, times the
/// multiplier, rounded up to `block_multiple_of`), the attention layers from
/// `full_attn_idxs`, the head from `tie_embedding`.
#[test]
fn published_lfm2_sizes_parse_to_their_shapes() {
    // (name, hidden, layers, heads, kv heads, block_ff_dim, attention layers, ffn)
    type Size = (
        &'static str,
        usize,
        usize,
        usize,
        usize,
        usize,
        &'static [usize],
        usize,
    );
    let sizes: [Size; 4] = [
        ("350M", 1024, 16, 16, 8, 6656, &[2, 5, 8, 10, 12, 14], 4608),
        ("700M", 1536, 16, 24, 8, 10240, &[2, 5, 8, 10, 12, 14], 6912),
        ("1.2B", 2048, 16, 32, 8, 12288, &[2, 5, 8, 10, 12, 14], 8192),
        (
            "2.6B",
            2048,
            30,
            32,
            8,
            10752,
            &[2, 6, 10, 14, 18, 21, 24, 27],
            7168,
        ),
    ];
    let dir = std::env::temp_dir().join(format!("lfm-lfm2-sizes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, hidden, layers, heads, kv, ff, attn, ffn) in sizes {
        let cfg = serde_json::json!({
            "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2",
            "block_auto_adjust_ff_dim": true, "block_dim": hidden, "block_ff_dim": ff,
            "block_ffn_dim_multiplier": 1.0, "block_mlp_init_scale": 1.0, "block_multiple_of": 256,
            "block_norm_eps": 1e-5, "block_out_init_scale": 1.0, "block_use_swiglu": true,
            "block_use_xavier_init": true, "bos_token_id": 1, "conv_L_cache": 3, "conv_bias": false,
            "conv_dim": hidden, "conv_dim_out": hidden, "conv_use_xavier_init": true,
            "eos_token_id": 7, "full_attn_idxs": attn, "hidden_size": hidden,
            "initializer_range": 0.02, "max_position_embeddings": 128000, "norm_eps": 1e-5,
            "num_attention_heads": heads, "num_heads": heads, "num_hidden_layers": layers,
            "num_key_value_heads": kv, "pad_token_id": 0, "rope_theta": 1000000.0,
            "theta": 1000000.0, "tie_embedding": true, "torch_dtype": "bfloat16",
            "use_cache": true, "use_pos_enc": true, "vocab_size": 65536,
        });
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let c = lfm::formats::hf::HfConfig::open(&dir).unwrap();
        let (got, _) = lfm::models::arch::from_hf(&c).unwrap();
        assert_eq!(
            (
                got.hidden,
                got.layers.len(),
                got.heads,
                got.kv_heads,
                got.ffn,
                got.vocab
            ),
            (hidden, layers, heads, kv, ffn, 65536),
            "LFM2-{name}"
        );
        let attention: Vec<usize> = (0..layers)
            .filter(|&i| got.layers[i] == lfm::models::llm::LayerKind::Attention)
            .collect();
        assert_eq!(attention, attn, "LFM2-{name}: attention layers");
        assert_eq!(got.rope_theta, 1e6, "LFM2-{name}: theta");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A GGUF file with an architecture, RoPE scaling or tokenizer we do not
/// implement, or a vocabulary that disagrees with its embedding, is refused
/// in one line naming the file and what is supported.
#[test]
fn bad_gguf_files_are_refused_naming_the_file() {
    use lfm::formats::gguf::{GgufFile, GgufWriter, Value};
    let src = common::repo().join("samples/fixtures/llm/tiny-qwen2.f32.gguf");
    let g = GgufFile::open(&src).unwrap();
    let dir = std::env::temp_dir().join(format!("lfm-bad-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let variant = |name: &str, edit: &dyn Fn(&mut GgufWriter)| -> String {
        let mut w = GgufWriter::new();
        for (k, v) in g.metadata() {
            w.set(k.clone(), v.clone()).unwrap();
        }
        for t in g.tensor_infos() {
            w.add_tensor(lfm::formats::TensorSource::tensor(&g, &t.name).unwrap())
                .unwrap();
        }
        edit(&mut w);
        let path = dir.join(name);
        w.write(&path, true).unwrap();
        let err = lfm::models::open_llm(&path)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains(name),
            "{name}: the message names the file: {err}"
        );
        err
    };
    let err = variant("falcon.gguf", &|w| {
        w.set("general.architecture", "falcon").unwrap();
    });
    assert!(err.contains("'falcon'") && err.contains("gemma3"), "{err}");
    let err = variant("yarn.gguf", &|w| {
        w.set("qwen2.rope.scaling.type", "yarn").unwrap();
    });
    assert!(err.contains("'yarn'") && err.contains("linear"), "{err}");
    let err = variant("bert-vocab.gguf", &|w| {
        w.set("tokenizer.ggml.model", "bert").unwrap();
    });
    assert!(
        err.contains("bert") && err.contains("gpt2") && err.contains("llama"),
        "{err}"
    );
    let err = variant("short-vocab.gguf", &|w| {
        let tokens: Vec<String> = g.get_str_array("tokenizer.ggml.tokens").unwrap()[..383].to_vec();
        w.set("tokenizer.ggml.tokens", Value::from(tokens)).unwrap();
    });
    assert!(err.contains("383") && err.contains("384"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
