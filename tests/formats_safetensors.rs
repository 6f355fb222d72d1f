//! safetensors and HF directories: files written by the `safetensors` crate
//! (single and sharded) read back through our header parser, the real
//! all-MiniLM-L6-v2 checkpoint compared tensor by tensor with the crate's own
//! reader, and `config.json` getters.

use lfm::formats::hf::{open_checkpoint, HfCheckpoint, HfConfig};
use lfm::formats::safetensors::{Safetensors, SafetensorsFile};
use lfm::formats::TensorSource;
use lfm::quant::GgmlType;
use safetensors::tensor::{Dtype, TensorView};
use std::path::{Path, PathBuf};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lfm-st-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_st(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn single_file_reads_float_dtypes_and_refuses_others() {
    let dir = temp_dir("single");
    let path = dir.join("model.safetensors");
    let f16: Vec<u8> = [1.0f32, -2.0, 0.5]
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    let bf16: Vec<u8> = [3.0f32, 0.25]
        .iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect();
    write_st(
        &path,
        &[
            (
                "w",
                Dtype::F32,
                vec![2, 3],
                f32_bytes(&[1., 2., 3., 4., 5., 6.]),
            ),
            ("h", Dtype::F16, vec![3], f16),
            ("b", Dtype::BF16, vec![1, 2], bf16),
            ("ids", Dtype::I64, vec![2], vec![0; 16]),
            ("scalar", Dtype::F32, vec![], f32_bytes(&[7.5])),
        ],
    );
    let st = Safetensors::open(&path).unwrap();
    let mut names = st.names();
    names.sort();
    assert_eq!(names, ["b", "h", "ids", "scalar", "w"]);
    let w = st.tensor("w").unwrap();
    assert_eq!((w.dtype, w.shape.clone()), (GgmlType::F32, vec![2, 3]));
    assert_eq!(w.to_f32(), [1., 2., 3., 4., 5., 6.]);
    assert_eq!(st.tensor("h").unwrap().to_f32(), [1.0, -2.0, 0.5]);
    let b = st.tensor("b").unwrap();
    assert_eq!((b.dtype, b.to_f32()), (GgmlType::BF16, vec![3.0, 0.25]));
    assert_eq!(st.tensor("scalar").unwrap().to_f32(), [7.5]);
    let e = st.tensor("ids").unwrap_err().to_string();
    assert!(
        e.starts_with(&path.display().to_string()) && e.contains("'ids' has dtype I64"),
        "{e}"
    );
    let e = st.tensor("nope").unwrap_err().to_string();
    assert!(e.contains("tensor 'nope' not found"), "{e}");
    // The directory form finds model.safetensors.
    assert!(open_checkpoint(&dir).unwrap().has("w"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sharded_checkpoint_reads_as_one_source() {
    let dir = temp_dir("sharded");
    write_st(
        &dir.join("model-00001-of-00002.safetensors"),
        &[("a", Dtype::F32, vec![2], f32_bytes(&[1., 2.]))],
    );
    write_st(
        &dir.join("model-00002-of-00002.safetensors"),
        &[
            ("b", Dtype::F32, vec![1], f32_bytes(&[3.])),
            ("c", Dtype::F32, vec![1], f32_bytes(&[4.])),
        ],
    );
    let index = r#"{"metadata": {"total_size": 16}, "weight_map": {
        "a": "model-00001-of-00002.safetensors",
        "b": "model-00002-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors"}}"#;
    std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
    std::fs::write(dir.join("config.json"), r#"{"hidden_size": 2}"#).unwrap();
    let ck = HfCheckpoint::open(&dir).unwrap();
    assert_eq!(ck.config.get_usize("hidden_size").unwrap(), 2);
    assert_eq!(ck.weights.tensor("a").unwrap().to_f32(), [1., 2.]);
    assert_eq!(ck.weights.tensor("c").unwrap().to_f32(), [4.]);
    assert_eq!(ck.weights.names().len(), 3);

    // An index that sends a tensor to the wrong shard, or outside the directory.
    let idx = dir.join("model.safetensors.index.json");
    std::fs::write(
        &idx,
        index.replace("\"c\": \"model-00002", "\"c\": \"model-00001"),
    )
    .unwrap();
    let e = open_checkpoint(&dir).err().unwrap().to_string();
    assert!(e.contains("'c'") && e.contains("does not hold it"), "{e}");
    std::fs::write(
        &idx,
        index.replace("\"c\": \"model-00002", "\"c\": \"../model-00002"),
    )
    .unwrap();
    let e = open_checkpoint(&dir).err().unwrap().to_string();
    assert!(e.contains("is not a file name"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn hf_directory_errors_name_the_path() {
    let dir = temp_dir("hf-missing");
    let msg = |r: lfm::Result<HfConfig>| r.err().unwrap().to_string();
    let missing = dir.join("no-such-model");
    let e = msg(HfConfig::open(&missing));
    assert!(
        e.contains(&missing.display().to_string()) && e.contains("no such"),
        "{e}"
    );
    let e = msg(HfConfig::open(&dir));
    assert!(e.contains("config.json") && e.contains("missing"), "{e}");
    let e = open_checkpoint(&dir).err().unwrap().to_string();
    assert!(
        e.contains(&dir.display().to_string()) && e.contains("no weights"),
        "{e}"
    );
    std::fs::write(dir.join("config.json"), "{not json").unwrap();
    let e = msg(HfConfig::open(&dir));
    assert!(
        e.contains("config.json") && e.contains("not valid JSON"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_getters_name_the_file_and_key() {
    let path = Path::new("/models/x/config.json");
    let c = HfConfig::from_value(
        path,
        serde_json::json!({"n": 4, "eps": 1e-5, "act": "silu", "tie": true, "neg": -1,
            "types": ["conv", "attention"], "idx": [2, 5], "none": null,
            "text_config": {"hidden_size": 64}}),
    );
    assert_eq!(c.get_usize("n").unwrap(), 4);
    assert_eq!(c.get_f32("eps").unwrap(), 1e-5);
    assert_eq!(c.get_f32("n").unwrap(), 4.0);
    assert_eq!(c.get_str("act").unwrap(), "silu");
    assert!(c.get_bool("tie").unwrap());
    assert_eq!(c.get_i64("neg").unwrap(), -1);
    assert_eq!(c.get_str_array("types").unwrap(), ["conv", "attention"]);
    assert_eq!(c.get_usize_array("idx").unwrap(), [2, 5]);
    assert_eq!(c.get_usize("text_config.hidden_size").unwrap(), 64);
    assert_eq!(c.get_usize_opt("absent").unwrap(), None);
    assert_eq!(
        c.get_usize_opt("none").unwrap(),
        None,
        "null counts as absent"
    );
    let e = c.get_usize("absent").unwrap_err().to_string();
    assert_eq!(e, "/models/x/config.json: key 'absent' is missing");
    let e = c.get_usize("neg").unwrap_err().to_string();
    assert_eq!(
        e,
        "/models/x/config.json: key 'neg' is -1, expected a non-negative integer"
    );
    let e = c.get_str("n").unwrap_err().to_string();
    assert!(e.contains("key 'n' is 4, expected a string"), "{e}");
}

/// Every tensor of the real all-MiniLM-L6-v2 checkpoint (F32 plus one I64
/// buffer) as the `safetensors` crate itself reads it.
#[test]
fn minilm_matches_the_safetensors_crate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/models/all-minilm-l6-v2");
    assert!(
        dir.is_dir(),
        "{} is missing: run scripts/setup to fetch the test models",
        dir.display()
    );
    let ck = HfCheckpoint::open(&dir).unwrap();
    assert_eq!(ck.config.get_usize("hidden_size").unwrap(), 384);
    assert_eq!(ck.config.get_usize("num_hidden_layers").unwrap(), 6);
    assert_eq!(ck.config.get_f32("layer_norm_eps").unwrap(), 1e-12);
    assert_eq!(ck.config.get_str("hidden_act").unwrap(), "gelu");

    let file = SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    assert_eq!(
        file.metadata().get("format").map(String::as_str),
        Some("pt")
    );
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let reference = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = ck.weights.names();
    names.sort();
    let mut ref_names: Vec<String> = reference.names().into_iter().map(String::from).collect();
    ref_names.sort();
    assert_eq!(names, ref_names);
    for name in &names {
        let view = reference.tensor(name).unwrap();
        match view.dtype() {
            Dtype::F32 => {
                let t = ck.weights.tensor(name).unwrap();
                assert_eq!(t.dtype, GgmlType::F32);
                assert_eq!(t.shape, view.shape(), "{name}");
                assert_eq!(t.bytes(), view.data(), "{name}");
            }
            other => {
                assert_eq!(other, Dtype::I64, "{name}");
                assert!(ck.weights.tensor(name).is_err());
            }
        }
    }
}
