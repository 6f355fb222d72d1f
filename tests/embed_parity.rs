//! all-MiniLM-L6-v2 against sentence-transformers' own vectors
//! (samples/fixtures/embed, made by scripts/fixtures/embed_gold.py): the same
//! tokens, and cosine >= 0.99999 for every sentence on the CPU and the GPU.

use lfm::gpu::{Gpu, GpuOptions};
use lfm::models::encoder::EncoderGemm;
use lfm::run::embed::{cosine, EmbedOptions, Embedder, Pooling};
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn model_dir() -> PathBuf {
    root().join("samples/models/all-minilm-l6-v2")
}

struct Gold {
    sentences: Vec<String>,
    token_ids: Vec<Vec<u32>>,
    truncated: Vec<bool>,
    st: Vec<u8>,
}

impl Gold {
    fn load() -> Gold {
        let dir = root().join("samples/fixtures/embed");
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("gold.json")).unwrap()).unwrap();
        assert_eq!(meta["format_version"], 1, "gold.json format_version");
        Gold {
            sentences: serde_json::from_value(meta["sentences"].clone()).unwrap(),
            token_ids: serde_json::from_value(meta["token_ids"].clone()).unwrap(),
            truncated: serde_json::from_value(meta["truncated"].clone()).unwrap(),
            st: std::fs::read(dir.join("gold.safetensors")).unwrap(),
        }
    }

    /// [sentences, 384] vectors for one export (`default`, `mean`, `cls`, ...).
    fn vectors(&self, name: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.st).unwrap();
        let t = st.tensor(name).unwrap();
        assert_eq!(t.shape(), [self.sentences.len(), 384]);
        bytemuck::pod_collect_to_vec(t.data())
    }
}

/// Cosine of every sentence's vector to gold: the tests' one acceptance bar.
#[track_caller]
fn assert_matches_gold(what: &str, got: &[f32], want: &[f32], gold: &Gold) {
    assert_matches_gold_at(what, got, want, gold, 0.99999)
}

/// As [`assert_matches_gold`] with the bar `bar`.
#[track_caller]
fn assert_matches_gold_at(what: &str, got: &[f32], want: &[f32], gold: &Gold, bar: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 1.0f32;
    for (i, (g, w)) in got
        .chunks_exact(384)
        .zip(want.chunks_exact(384))
        .enumerate()
    {
        let c = cosine(g, w);
        worst = worst.min(c);
        assert!(
            c >= bar,
            "{what}: sentence {i} ({:?}): cosine to sentence-transformers {c}",
            gold.sentences[i].chars().take(40).collect::<String>()
        );
    }
    eprintln!("{what}: lowest cosine to sentence-transformers {worst}");
}

fn gpu() -> Option<Arc<Gpu>> {
    match Gpu::new(&GpuOptions::default()) {
        Ok(g) => Some(Arc::new(g)),
        Err(e) if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() => {
            eprintln!("SKIPPING GPU embedding parity (LFM_SKIP_GPU_TESTS set): {e}");
            None
        }
        Err(e) => panic!("GPU tests need an adapter ({e}); set LFM_SKIP_GPU_TESTS=1 to skip them"),
    }
}

/// Every pooling mode against its gold export, plus the model's own
/// configuration (mean + Normalize), in ragged batches of mixed lengths.
fn check_all(embedder: &Embedder, gold: &Gold, batch_size: usize) {
    let default = EmbedOptions {
        batch_size,
        ..Default::default()
    };
    let got = embedder.embed(&gold.sentences, &default).unwrap();
    assert_matches_gold("default", &got, &gold.vectors("default"), gold);
    for (mode, name) in [
        (Pooling::Mean, "mean"),
        (Pooling::Cls, "cls"),
        (Pooling::Max, "max"),
        (Pooling::LastToken, "lasttoken"),
        (Pooling::MeanSqrtLen, "mean_sqrt_len_tokens"),
        (Pooling::WeightedMean, "weightedmean"),
    ] {
        let opts = EmbedOptions {
            batch_size,
            pooling: Some(vec![mode]),
            no_normalize: true,
            ..Default::default()
        };
        let got = embedder.embed(&gold.sentences, &opts).unwrap();
        assert_matches_gold(name, &got, &gold.vectors(name), gold);
    }
}

#[test]
fn tokens_match_sentence_transformers() {
    let gold = Gold::load();
    let embedder = Embedder::load(&model_dir(), None).unwrap();
    assert_eq!(embedder.sentence.max_seq_length, 256);
    let tokens = embedder.tokenize(&gold.sentences).unwrap();
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(t.ids, gold.token_ids[i], "sentence {i} token ids");
        assert_eq!(
            t.truncated, gold.truncated[i],
            "sentence {i} truncated flag"
        );
    }
    assert!(
        gold.truncated.iter().any(|&t| t),
        "the fixture has a truncated sentence"
    );
}

#[test]
fn cpu_matches_sentence_transformers() {
    let gold = Gold::load();
    let embedder = Embedder::load(&model_dir(), None).unwrap();
    check_all(&embedder, &gold, 4);
}

/// The GPU runs the encoder only (pooling is the CPU code checked above), so
/// one pass over the fixture in ragged batches of mixed lengths covers it.
#[test]
fn gpu_matches_sentence_transformers() {
    let Some(gpu) = gpu() else { return };
    eprintln!("{}", gpu.describe());
    let gold = Gold::load();
    let embedder = Embedder::load(Path::new(&model_dir()), Some(gpu.clone())).unwrap();
    let opts = EmbedOptions {
        batch_size: 3,
        ..Default::default()
    };
    let got = embedder.embed(&gold.sentences, &opts).unwrap();
    assert_matches_gold("gpu default", &got, &gold.vectors("default"), &gold);
    // The batch path's GEMM (portable on adapters without cooperative
    // matrices, f16 products on those with them).
    let mut embedder = embedder;
    embedder.set_gpu_gemm(EncoderGemm::Gemm);
    let got = embedder.embed(&gold.sentences, &opts).unwrap();
    // Cooperative matrices round both factors of every product to f16
    // (relative 2^-11): a looser bar there until the H200 measures one.
    let bar = if gpu.caps.coop_matrix {
        0.9999
    } else {
        0.99999
    };
    assert_matches_gold_at("gpu gemm", &got, &gold.vectors("default"), &gold, bar);
}
