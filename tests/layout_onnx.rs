//! The ONNX reader on the real PicoDet layout model (fetched by
//! `scripts/setup`) and on mutated copies of it: every byte sequence must
//! parse or fail with an error naming the file, never panic.

use lfm::formats::onnx::{AttrValue, DataType, Dim, OnnxModel};
use lfm::util::rng::Rng;
use std::collections::HashMap;
use std::path::PathBuf;

fn model_path() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("samples/models/layout-cdla/layout_cdla.onnx");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup to fetch the layout model",
        p.display()
    );
    p
}

#[test]
fn reads_the_layout_model() {
    let m = OnnxModel::open(model_path()).unwrap();
    assert_eq!(m.ir_version, 8);
    assert_eq!(m.opset(""), Some(13));
    assert_eq!(m.opset("Paddle"), Some(1));
    assert_eq!(
        m.metadata("character").unwrap().lines().collect::<Vec<_>>(),
        [
            "text",
            "title",
            "figure",
            "figure_caption",
            "table",
            "table_caption",
            "header",
            "footer",
            "reference",
            "equation"
        ]
    );
    let g = &m.graph;
    // Counts checked with the `onnx` Python package.
    assert_eq!(g.nodes.len(), 1493);
    assert!(g.initializers.is_empty());
    let mut ops: HashMap<&str, usize> = HashMap::new();
    for n in &g.nodes {
        *ops.entry(n.op_type.as_str()).or_default() += 1;
    }
    assert_eq!(ops["Constant"], 878);
    assert_eq!(ops["Conv"], 102);
    assert_eq!(ops["BatchNormalization"], 94);
    assert_eq!(ops["Resize"], 2);

    let input = g.input("image").unwrap().tensor.as_ref().unwrap();
    assert_eq!(input.elem_type, DataType::FLOAT);
    assert_eq!(
        input.shape.as_deref().unwrap(),
        [
            Dim::Value(1),
            Dim::Value(3),
            Dim::Value(800),
            Dim::Value(608)
        ]
    );
    assert_eq!(g.outputs.len(), 8);
    assert_eq!(g.outputs[0].name, "transpose_0.tmp_0");

    // The first convolution: 16 filters of 3x3 over RGB, stride 2.
    let conv = &g.nodes.iter().find(|n| n.op_type == "Conv").unwrap();
    assert_eq!(conv.ints("strides").unwrap(), [2, 2]);
    assert_eq!(conv.int("group").unwrap(), 1);
    let w = g.constant(&conv.inputs[1]).unwrap();
    assert_eq!(w.dims, [16, 3, 3, 3]);
    assert_eq!(w.to_f32().unwrap().len(), 16 * 27);
    assert!(
        g.initializer(&conv.inputs[1]).is_none(),
        "a Constant node, not an initializer"
    );
    let hs = g.nodes.iter().find(|n| n.op_type == "HardSigmoid").unwrap();
    assert!((hs.float("alpha").unwrap() - 1.0 / 6.0).abs() < 1e-6);
    let resize = g.nodes.iter().find(|n| n.op_type == "Resize").unwrap();
    assert_eq!(resize.string("mode").unwrap(), "nearest");
    assert_eq!(
        g.constant(&resize.inputs[2]).unwrap().to_f32().unwrap(),
        [1.0, 1.0, 2.0, 2.0]
    );
    assert!(g
        .constant(&resize.inputs[1])
        .unwrap()
        .to_f32()
        .unwrap()
        .is_empty());

    // Every float constant, summed: numpy gives 1820488 values summing to
    // 16360.225155463597 (f64 sum, so only the order differs).
    let (mut count, mut sum) = (0usize, 0f64);
    for n in g.nodes.iter().filter(|n| n.op_type == "Constant") {
        let t = g.constant(&n.outputs[0]).unwrap();
        if t.data_type == DataType::FLOAT {
            let v = t.to_f32().unwrap();
            count += v.len();
            sum += v.iter().map(|&x| x as f64).sum::<f64>();
        } else {
            assert_eq!(t.data_type, DataType::INT64);
            t.to_i64().unwrap();
        }
    }
    assert_eq!(count, 1_820_488);
    assert!((sum - 16360.225155463597).abs() < 1e-6 * 16360.0, "{sum}");
}

/// Parses `bytes` and, when that succeeds, touches every tensor and
/// attribute the way a model loader would. Errors are fine; panics are not.
fn parse_and_walk(bytes: &[u8]) {
    match OnnxModel::parse("mutant.onnx", bytes) {
        Ok(m) => {
            for n in &m.graph.nodes {
                for a in &n.attributes {
                    let _ = (
                        n.int(&a.name),
                        n.ints(&a.name),
                        n.float(&a.name),
                        n.string(&a.name),
                    );
                    if let AttrValue::Tensor(t) = &a.value {
                        let _ = (t.to_f32(), t.to_i64(), t.numel());
                    }
                }
                for i in &n.inputs {
                    if let Some(t) = m.graph.constant(i) {
                        let _ = (t.to_f32(), t.to_i64(), t.shape());
                    }
                }
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("mutant.onnx: "),
                "error without the file name: {msg}"
            );
        }
    }
}

#[test]
fn truncated_files_are_errors() {
    let bytes = std::fs::read(model_path()).unwrap();
    let mut rng = Rng::new(9);
    let mut cuts: Vec<usize> = (0..200).collect();
    cuts.extend((0..100).map(|_| (rng.next_u64() % bytes.len() as u64) as usize));
    for cut in cuts {
        let e = OnnxModel::parse("cut.onnx", &bytes[..cut])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cut.onnx: "), "{e}");
    }
}

/// Minimal protobuf field walking, to cut the real model down to a small
/// valid one: `(field number, wire type, whole field bytes, payload)`.
fn fields(mut b: &[u8]) -> Vec<(u64, u64, &[u8], &[u8])> {
    fn varint(b: &mut &[u8]) -> u64 {
        let mut v = 0;
        for shift in (0..64).step_by(7) {
            let byte = b[0];
            *b = &b[1..];
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        v
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let whole = b;
        let key = varint(&mut b);
        let payload = match key & 7 {
            0 => {
                let before = b;
                varint(&mut b);
                &before[..before.len() - b.len()]
            }
            2 => {
                let n = varint(&mut b) as usize;
                let (p, rest) = b.split_at(n);
                b = rest;
                p
            }
            5 => {
                let (p, rest) = b.split_at(4);
                b = rest;
                p
            }
            w => panic!("wire type {w} in the real model"),
        };
        out.push((key >> 3, key & 7, &whole[..whole.len() - b.len()], payload));
    }
    out
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The real model with only the nodes that fit in about 128 KiB (the first
/// layers and their weights): mostly protobuf structure, cheap to parse.
fn small_model(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (number, _, whole, payload) in fields(bytes) {
        if number != 7 {
            out.extend_from_slice(whole);
            continue;
        }
        let mut graph = Vec::new();
        for (n, _, w, _) in fields(payload) {
            if n != 1 || graph.len() + w.len() < 128 << 10 {
                graph.extend_from_slice(w);
            }
        }
        put_varint(&mut out, 7 << 3 | 2);
        put_varint(&mut out, graph.len() as u64);
        out.extend_from_slice(&graph);
    }
    out
}

#[test]
fn mutated_files_never_panic() {
    let small = small_model(&std::fs::read(model_path()).unwrap());
    let parsed = OnnxModel::parse("small.onnx", &small).unwrap();
    assert!(
        parsed.graph.nodes.len() > 50,
        "{}",
        parsed.graph.nodes.len()
    );
    let mut rng = Rng::new(17);
    let mut bytes = small.clone();
    for _ in 0..3000 {
        let changed: Vec<usize> = (0..1 + rng.next_u64() % 4)
            .map(|_| (rng.next_u64() % bytes.len() as u64) as usize)
            .collect();
        for &at in &changed {
            bytes[at] = match rng.next_u64() % 4 {
                0 => 0xff,
                1 => 0x00,
                2 => bytes[at] ^ (1 << (rng.next_u64() % 8)),
                _ => rng.next_u64() as u8,
            };
        }
        parse_and_walk(&bytes);
        for at in changed {
            bytes[at] = small[at];
        }
    }
}
