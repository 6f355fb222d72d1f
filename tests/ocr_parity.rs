//! Text reading against the outside world: RapidOCR 1.4.4 (onnxruntime) on
//! a page rendered from a real PDF (fixtures made by
//! scripts/fixtures/ocr_gold.py).
//!
//! - the ONNX interpreter: the detector's probability map, the recogniser's
//!   per-step best characters and the classifier's scores equal
//!   onnxruntime's on the same inputs;
//! - end to end on the CPU: the text boxes equal RapidOCR's (corner by
//!   corner, within a pixel), the strings identical where the boxes
//!   are. (The text networks have no GPU path yet.)

mod common;

use lfm::models::ocr::net::{Net, Tensor};
use lfm::models::ocr::OcrModels;
use lfm::run::image;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

fn fixture_dir() -> PathBuf {
    common::repo().join("samples/fixtures/ocr")
}

struct NetGold {
    tensors: Vec<(String, Vec<usize>, Vec<u8>, safetensors::Dtype)>,
}

impl NetGold {
    fn load() -> NetGold {
        let bytes = std::fs::read(fixture_dir().join("net.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        NetGold {
            tensors: st
                .tensors()
                .into_iter()
                .map(|(n, v)| (n, v.shape().to_vec(), v.data().to_vec(), v.dtype()))
                .collect(),
        }
    }

    fn get(&self, name: &str) -> (&[usize], &[u8]) {
        let t = self.tensors.iter().find(|t| t.0 == name).unwrap();
        (&t.1, &t.2)
    }

    fn f32(&self, name: &str) -> Tensor {
        let (shape, data) = self.get(name);
        Tensor::F32(bytemuck::pod_collect_to_vec(data), shape.to_vec())
    }

    fn i64(&self, name: &str) -> Vec<i64> {
        bytemuck::pod_collect_to_vec(self.get(name).1)
    }
}

fn floats(t: &Tensor) -> &[f32] {
    match t {
        Tensor::F32(d, _) => d,
        Tensor::I64(..) => panic!("integer output"),
    }
}

fn net(file: &str) -> Net {
    Net::open(common::model(&format!("ppocr-v4/{file}")))
        .unwrap()
        .0
}

/// Largest absolute difference between two float slices of one length.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn detector_probability_map_matches_onnxruntime() {
    let g = NetGold::load();
    let out = net("ch_PP-OCRv4_det_infer.onnx")
        .run(g.f32("det_input"))
        .unwrap();
    let want = g.f32("det_output");
    assert_eq!(out[0].shape(), want.shape());
    // Probabilities in [0, 1] after a sigmoid; onnxruntime fuses and
    // reorders the sums of 60 convolutions, so agreement is to float
    // rounding accumulated over the depth, far below the 0.3 threshold's
    // sensitivity.
    let d = max_diff(floats(&out[0]), floats(&want));
    assert!(d < 2e-3, "max |ours - onnxruntime| = {d}");
}

#[test]
fn recogniser_steps_match_onnxruntime() {
    let g = NetGold::load();
    let out = net("ch_PP-OCRv4_rec_infer.onnx")
        .run(g.f32("rec_input"))
        .unwrap();
    let probs = floats(&out[0]);
    let shape = out[0].shape().to_vec();
    let classes = shape[2];
    assert_eq!(classes, 6625);
    let want_idx = g.i64("rec_argmax");
    let want_max = g.f32("rec_max");
    assert_eq!(shape[1], want_idx.len());
    for (t, row) in probs.chunks_exact(classes).enumerate() {
        let (best, p) =
            row.iter()
                .enumerate()
                .fold((0, f32::MIN), |a, (i, &v)| if v > a.1 { (i, v) } else { a });
        assert_eq!(best as i64, want_idx[t], "step {t}");
        // Softmax outputs: within 1e-3 of onnxruntime's probability.
        assert!((p - floats(&want_max)[t]).abs() < 1e-3, "step {t}: {p}");
    }
    let d = max_diff(&probs[..classes], floats(&g.f32("rec_step0")));
    assert!(d < 1e-3, "step 0 distribution differs by {d}");
}

#[test]
fn classifier_scores_match_onnxruntime() {
    let g = NetGold::load();
    let out = net("ch_ppocr_mobile_v2.0_cls_infer.onnx")
        .run(g.f32("cls_input"))
        .unwrap();
    let want = g.f32("cls_output");
    assert_eq!(out[0].shape(), want.shape());
    let d = max_diff(floats(&out[0]), floats(&want));
    assert!(d < 1e-3, "max |ours - onnxruntime| = {d}");
}

fn gold() -> &'static Value {
    static GOLD: OnceLock<Value> = OnceLock::new();
    GOLD.get_or_init(|| {
        let text = std::fs::read_to_string(fixture_dir().join("gold.json")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["format_version"], 1);
        v
    })
}

fn models() -> &'static OcrModels {
    static MODELS: OnceLock<OcrModels> = OnceLock::new();
    MODELS.get_or_init(|| OcrModels::open(&common::model("ppocr-v4")).unwrap())
}

fn corners(v: &Value) -> Vec<[f64; 2]> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| [p[0].as_f64().unwrap(), p[1].as_f64().unwrap()])
        .collect()
}

/// Asserts `got` boxes equal `want` corner by corner.
#[track_caller]
fn assert_boxes(got: &[[[f64; 2]; 4]], want: &[Value]) {
    assert_eq!(got.len(), want.len(), "box count");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        for (a, b) in g.iter().zip(corners(w)) {
            assert!(*a == b, "box {k}: ours {g:?}, RapidOCR {w}");
        }
    }
}

#[test]
fn cpu_reads_the_page_as_rapidocr_does() {
    let g = gold();
    let img = image::load(&fixture_dir().join(g["image"].as_str().unwrap())).unwrap();
    let lines = models().read(&img).unwrap();
    let want = g["final"].as_array().unwrap();
    let got: Vec<[[f64; 2]; 4]> = lines.iter().map(|l| l.corners).collect();
    // Boxes: integers in both, identical (the minimum-area rectangles are
    // OpenCV's float32 ones, so pyclipper's truncation lands alike).
    let want_boxes: Vec<Value> = want.iter().map(|l| l[0].clone()).collect();
    assert_boxes(&got, &want_boxes);
    for (l, w) in lines.iter().zip(want) {
        assert_eq!(l.text, w[1].as_str().unwrap());
        // Mean softmax confidences. Axis-aligned boxes crop to exact pixel
        // copies and agree to 1e-4; a slanted one goes through the bicubic
        // warp, whose inverse homography (ours vs OpenCV's solver) can land
        // a sample in the next 1/32 sub-pixel cell: 2.3e-3 on this page's
        // one slanted line.
        let d = (l.score - w[2].as_f64().unwrap()).abs();
        assert!(d < 5e-3, "{}: confidence differs by {d}", l.text);
    }
}

/// Runs `file` on three inputs 48 x `width` as one batch and alone: a
/// line's outputs must not depend on the others in its batch (bit for bit).
fn assert_batch_invariant(file: &str, width: usize) {
    let net = net(file);
    let line = |seed: usize| -> Vec<f32> {
        (0..3 * 48 * width)
            .map(|i| (((i * 7919 + seed * 104729) % 2003) as f32 / 1001.5) - 1.0)
            .collect()
    };
    let lines: Vec<Vec<f32>> = (0..3).map(line).collect();
    let batch = net
        .run(Tensor::F32(lines.concat(), vec![3, 3, 48, width]))
        .unwrap();
    let (out, shape) = (floats(&batch[0]), batch[0].shape().to_vec());
    assert_eq!(shape[0], 3, "{file}");
    let per_line = out.len() / 3;
    for (j, input) in lines.into_iter().enumerate() {
        let alone = net.run(Tensor::F32(input, vec![1, 3, 48, width])).unwrap();
        assert_eq!(alone[0].shape()[1..], shape[1..], "{file}");
        assert!(
            floats(&alone[0]) == &out[j * per_line..(j + 1) * per_line],
            "{file}: line {j} differs in the batch"
        );
    }
}

#[test]
fn recogniser_and_classifier_batches_give_each_line_its_own_result() {
    // RapidOCR recognises and classifies lines six at a time.
    assert_batch_invariant("ch_PP-OCRv4_rec_infer.onnx", 200);
    assert_batch_invariant("ch_ppocr_mobile_v2.0_cls_infer.onnx", 192);
}
