//! GGUF: writer -> reader round trips over every metadata type and several
//! tensor types, and the real SmolLM2 checkpoint read and checked against
//! what gguf-py reports for it (samples/fixtures/formats/smollm2_gguf.json).

use lfm::formats::gguf::{Array, GgufFile, GgufWriter, Value};
use lfm::formats::TensorSource;
use lfm::quant::GgmlType;
use lfm::tensor::Tensor;
use lfm::util::rng::Rng;
use std::path::{Path, PathBuf};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lfm-gguf-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Metadata of every value type, including arrays of each, nested arrays
/// and an empty array.
fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::from("llama")),
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60_000)),
        ("t.i16", Value::I16(-30_000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5e-5)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::from("héllo\nwörld")),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(-2.5e300)),
        ("a.u8", Value::from(vec![1u8, 2, 255])),
        ("a.i8", Value::from(vec![-1i8, 0, 127])),
        ("a.u16", Value::from(vec![1u16, 65535])),
        ("a.i16", Value::from(vec![-1i16, 32767])),
        ("a.u32", Value::from(vec![7u32, 8, 9])),
        ("a.i32", Value::from(vec![-7i32, 0, 3])),
        ("a.f32", Value::from(vec![0.5f32, -0.25, 1e9])),
        ("a.bool", Value::from(vec![true, false, true])),
        (
            "a.string",
            Value::from(vec!["a".to_string(), String::new(), "Ġthe".to_string()]),
        ),
        ("a.u64", Value::from(vec![u64::MAX, 0])),
        ("a.i64", Value::from(vec![i64::MIN, 5])),
        ("a.f64", Value::from(vec![1.0f64, f64::MIN_POSITIVE])),
        ("a.empty", Value::Array(Array::F32(vec![]))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, 2]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::U8(vec![9])]),
            ])),
        ),
    ]
}

fn test_tensors() -> Vec<Tensor> {
    let mut rng = Rng::new(11);
    let mut v = |n| rng.vec(n, -1.0, 1.0);
    vec![
        Tensor::from_f32("norm.weight", vec![7], v(7)),
        Tensor::quantize_f32("f16", vec![3, 5], &v(15), GgmlType::F16).unwrap(),
        Tensor::quantize_f32("bf16", vec![2, 3, 4], &v(24), GgmlType::BF16).unwrap(),
        Tensor::quantize_f32("blk.0.q4_0", vec![3, 64], &v(192), GgmlType::Q4_0).unwrap(),
        Tensor::quantize_f32("blk.0.q4_k", vec![2, 256], &v(512), GgmlType::Q4_K).unwrap(),
        Tensor::quantize_f32("q6_k.4d", vec![2, 1, 3, 256], &v(1536), GgmlType::Q6_K).unwrap(),
        Tensor::quantize_f32("q1_0", vec![1, 128], &v(128), GgmlType::Q1_0).unwrap(),
    ]
}

fn write_test_file(path: &Path, alignment: Option<u32>) {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.set("general.alignment", a).unwrap();
    }
    for (k, v) in every_value() {
        w.set(k, v).unwrap();
    }
    for t in test_tensors() {
        w.add_tensor(t).unwrap();
    }
    w.write(path, true).unwrap();
}

#[test]
fn write_then_read_round_trips_metadata_and_tensors() {
    for alignment in [None, Some(64u32), Some(1)] {
        let dir = temp_dir(&format!("rt{alignment:?}"));
        let path = dir.join("model.gguf");
        write_test_file(&path, alignment);
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.version(), 3);
        let align = alignment.unwrap_or(32) as usize;
        assert_eq!(f.alignment(), align);
        assert_eq!(f.data_offset() % align, 0);
        assert_eq!(f.architecture().unwrap(), "llama");

        let mut want = every_value();
        if let Some(a) = alignment {
            want.insert(0, ("general.alignment", Value::U32(a)));
        }
        let got: Vec<(&str, &Value)> = f.metadata().iter().map(|(k, v)| (k.as_str(), v)).collect();
        let want: Vec<(&str, &Value)> = want.iter().map(|(k, v)| (*k, v)).collect();
        assert_eq!(got, want);

        let tensors = test_tensors();
        assert_eq!(
            f.names(),
            tensors.iter().map(|t| t.name.clone()).collect::<Vec<_>>()
        );
        for t in &tensors {
            let r = f.tensor(&t.name).unwrap();
            assert_eq!((r.dtype, &r.shape), (t.dtype, &t.shape), "{}", t.name);
            assert_eq!(r.bytes(), t.bytes(), "{}", t.name);
            assert_eq!(f.tensor_info(&t.name).unwrap().offset % align, 0);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn typed_getters_convert_and_name_the_key() {
    let dir = temp_dir("getters");
    let path = dir.join("m.gguf");
    write_test_file(&path, None);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.get_u32("t.u8").unwrap(), 200);
    assert_eq!(f.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_i32("t.i8").unwrap(), -100);
    assert_eq!(f.get_usize("t.u16").unwrap(), 60_000);
    assert_eq!(f.get_f32("t.f32").unwrap(), 1.5e-5);
    assert!(f.get_bool("t.bool").unwrap());
    assert_eq!(f.get_str("t.string").unwrap(), "héllo\nwörld");
    assert_eq!(f.get_str_array("a.string").unwrap(), ["a", "", "Ġthe"]);
    assert_eq!(f.get_f32_array("a.f32").unwrap(), [0.5, -0.25, 1e9]);
    assert_eq!(f.get_i32_array("a.i32").unwrap(), [-7, 0, 3]);
    assert_eq!(f.get_usize_array("a.u32").unwrap(), [7, 8, 9]);
    assert_eq!(f.get_array("a.nested").unwrap().len(), 3);
    assert_eq!(f.get_u32_opt("nope").unwrap(), None);
    assert_eq!(f.get_str_opt("nope").unwrap(), None);

    let msg = |e: lfm::Error| e.to_string();
    let p = path.display().to_string();
    let e = msg(f.get_u32("nope").unwrap_err());
    assert!(e.starts_with(&p) && e.contains("'nope' is missing"), "{e}");
    let e = msg(f.get_u32("t.i8").unwrap_err());
    assert!(
        e.starts_with(&p) && e.contains("'t.i8' is -100, which does not fit u32"),
        "{e}"
    );
    let e = msg(f.get_u32("t.string").unwrap_err());
    assert!(e.contains("'t.string' is string, expected u32"), "{e}");
    let e = msg(f.get_str_array("a.i32").unwrap_err());
    assert!(
        e.contains("'a.i32' is array of i32, expected array of string"),
        "{e}"
    );
    let e = msg(f.get_usize_array("a.i32").unwrap_err());
    assert!(e.contains("'a.i32' holds a negative"), "{e}");
    let e = msg(f.tensor("no.such.weight").unwrap_err());
    assert!(
        e.starts_with(&p) && e.contains("tensor 'no.such.weight' not found"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn writer_refuses_bad_input_and_keeps_existing_files() {
    let dir = temp_dir("writer");
    let path = dir.join("m.gguf");
    std::fs::write(&path, b"precious").unwrap();
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama").unwrap();
    assert!(w.set("general.alignment", 3u32).is_err());
    assert!(w.set("general.alignment", 32u64).is_err());
    w.add_tensor(Tensor::from_f32("a", vec![2], vec![1.0, 2.0]))
        .unwrap();
    assert!(w
        .add_tensor(Tensor::from_f32("a", vec![1], vec![1.0]))
        .is_err());
    assert!(w
        .add_tensor(Tensor::from_f32("s", vec![], vec![1.0]))
        .is_err());
    assert!(w
        .add_tensor_bytes("b", GgmlType::Q8_0, vec![1, 32], vec![0; 33])
        .is_err());
    let e = w.write(&path, false).unwrap_err().to_string();
    assert!(e.contains("already exists"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    w.set("general.architecture", "lfm2").unwrap();
    w.write(&path, true).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.architecture().unwrap(), "lfm2");
    assert_eq!(f.metadata().len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn smollm2() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup to fetch the test models",
        p.display()
    );
    p
}

/// Everything gguf-py reports about the SmolLM2 file (keys, value types,
/// scalar values, array lengths and first items; tensor names, types,
/// shapes and offsets) equals what our reader sees.
#[test]
fn smollm2_matches_gguf_py() {
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("samples/fixtures/formats/smollm2_gguf.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let f = GgufFile::open(smollm2()).unwrap();
    assert_eq!(f.version() as u64, fixture["version"].as_u64().unwrap());
    assert_eq!(
        f.data_offset() as u64,
        fixture["data_offset"].as_u64().unwrap()
    );
    assert_eq!(f.architecture().unwrap(), "llama");

    let keys = fixture["metadata"].as_array().unwrap();
    assert_eq!(f.metadata().len(), keys.len());
    for ((key, value), want) in f.metadata().iter().zip(keys) {
        assert_eq!(key, want["key"].as_str().unwrap());
        assert_eq!(value.describe(), want["type"].as_str().unwrap(), "{key}");
        match value {
            Value::Array(a) => {
                assert_eq!(a.len() as u64, want["len"].as_u64().unwrap(), "{key}");
                let first = &want["first"];
                match a {
                    Array::String(v) => assert_eq!(v[0], first.as_str().unwrap(), "{key}"),
                    Array::F32(v) => assert_eq!(v[0] as f64, first.as_f64().unwrap(), "{key}"),
                    Array::I32(v) => assert_eq!(v[0] as i64, first.as_i64().unwrap(), "{key}"),
                    other => panic!("{key}: unexpected array {:?}", other.elem_type()),
                }
            }
            Value::String(s) => assert_eq!(s, want["value"].as_str().unwrap(), "{key}"),
            Value::F32(x) => assert_eq!(*x as f64, want["value"].as_f64().unwrap(), "{key}"),
            Value::Bool(b) => assert_eq!(*b, want["value"].as_bool().unwrap(), "{key}"),
            v => assert_eq!(
                v.as_i128().unwrap(),
                want["value"].as_i64().unwrap() as i128,
                "{key}"
            ),
        }
    }

    let tensors = fixture["tensors"].as_array().unwrap();
    assert_eq!(f.tensor_infos().len(), tensors.len());
    for (info, want) in f.tensor_infos().iter().zip(tensors) {
        assert_eq!(info.name, want["name"].as_str().unwrap());
        assert_eq!(
            info.dtype.id() as u64,
            want["type"].as_u64().unwrap(),
            "{}",
            info.name
        );
        let shape: Vec<usize> = want["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(info.shape, shape, "{}", info.name);
        assert_eq!(
            (f.data_offset() + info.offset) as u64,
            want["file_offset"].as_u64().unwrap(),
            "{}",
            info.name
        );
        assert_eq!(
            info.size as u64,
            want["n_bytes"].as_u64().unwrap(),
            "{}",
            info.name
        );
    }

    // The first row of a few tensors, dequantised by gguf-py.
    for check in fixture["rows"].as_array().unwrap() {
        let t = f.tensor(check["name"].as_str().unwrap()).unwrap();
        let want: Vec<f32> = check["row0"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let mut got = vec![0.0; t.row_len()];
        t.row_to_f32(0, &mut got);
        assert_eq!(got[..want.len()], want[..], "{}", t.name);
    }
}

#[test]
fn smollm2_round_trips_through_the_writer() {
    let src = GgufFile::open(smollm2()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.set(k.clone(), v.clone()).unwrap();
    }
    for name in src.names().iter().take(12) {
        w.add_tensor(src.tensor(name).unwrap()).unwrap();
    }
    let dir = temp_dir("smol");
    let path = dir.join("copy.gguf");
    w.write(&path, false).unwrap();
    let copy = GgufFile::open(&path).unwrap();
    assert_eq!(copy.metadata(), src.metadata());
    for name in copy.names() {
        let (a, b) = (copy.tensor(&name).unwrap(), src.tensor(&name).unwrap());
        assert_eq!(
            (a.dtype, &a.shape, a.bytes()),
            (b.dtype, &b.shape, b.bytes()),
            "{name}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The writer's output for `every_value()` and `test_tensors()` is committed
/// (regenerate with LFM_BLESS=1) and gguf-py's reading of it
/// (scripts/fixtures/gguf_written_by_lfm.py) equals what we wrote.
#[test]
fn writer_output_is_stable_and_gguf_py_reads_it() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/fixtures/formats");
    let golden = fixtures.join("written_by_lfm.gguf");
    let dir = temp_dir("golden");
    let fresh = dir.join("written_by_lfm.gguf");
    write_test_file(&fresh, None);
    if std::env::var_os("LFM_BLESS").is_some() {
        std::fs::copy(&fresh, &golden).unwrap();
    }
    assert!(
        std::fs::read(&fresh).unwrap() == std::fs::read(&golden).unwrap(),
        "GgufWriter output changed: check it with scripts/fixtures/gguf_written_by_lfm.py, \
         then rerun with LFM_BLESS=1"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let seen: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures.join("written_by_lfm.json")).unwrap(),
    )
    .unwrap();
    let f = GgufFile::open(&golden).unwrap();
    assert_eq!(seen["version"], 3);
    assert_eq!(seen["alignment"], 32);
    assert_eq!(
        seen["data_offset"].as_u64().unwrap() as usize,
        f.data_offset()
    );
    let keys = seen["metadata"].as_array().unwrap();
    let want = every_value();
    assert_eq!(keys.len(), want.len());
    for ((key, value), entry) in want.iter().zip(keys) {
        assert_eq!(entry["key"], *key);
        let types: Vec<&str> = entry["types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(types[0], gguf_py_type_name(value), "{key}");
        if let Value::Array(Array::Array(_)) = value {
            assert_eq!(types[1], "array", "{key}");
            continue;
        }
        assert_eq!(entry["value"], to_json(value), "{key}");
    }
    let tensors = seen["tensors"].as_array().unwrap();
    for (t, entry) in test_tensors().iter().zip(tensors) {
        assert_eq!(entry["name"], t.name.as_str());
        assert_eq!(entry["type"], t.dtype.id());
        assert_eq!(entry["shape"], serde_json::json!(t.shape));
        if let Some(bytes) = entry.get("bytes") {
            assert_eq!(*bytes, serde_json::json!(t.bytes()), "{}", t.name);
            continue;
        }
        let values: Vec<f32> = entry["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(values, t.to_f32(), "{}", t.name);
    }
}

/// gguf-py's `GGUFValueType` names, lower-cased.
fn gguf_py_type_name(v: &Value) -> &'static str {
    match v {
        Value::U8(_) => "uint8",
        Value::I8(_) => "int8",
        Value::U16(_) => "uint16",
        Value::I16(_) => "int16",
        Value::U32(_) => "uint32",
        Value::I32(_) => "int32",
        Value::F32(_) => "float32",
        Value::Bool(_) => "bool",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::U64(_) => "uint64",
        Value::I64(_) => "int64",
        Value::F64(_) => "float64",
    }
}

/// A value as the fixture script writes it (JSON numbers are f64).
fn to_json(v: &Value) -> serde_json::Value {
    use serde_json::json;
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(*x as f64),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Array(a) => match a {
            Array::U8(v) => json!(v),
            Array::I8(v) => json!(v),
            Array::U16(v) => json!(v),
            Array::I16(v) => json!(v),
            Array::U32(v) => json!(v),
            Array::I32(v) => json!(v),
            Array::F32(v) => json!(v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
            Array::Bool(v) => json!(v),
            Array::String(v) => json!(v),
            Array::U64(v) => json!(v),
            Array::I64(v) => json!(v),
            Array::F64(v) => json!(v),
            Array::Array(_) => unreachable!("nested arrays are compared by type only"),
        },
    }
}
