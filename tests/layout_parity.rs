//! The layout detector against the outside world: rapid-layout 1.2.1 and
//! onnxruntime on two pages rendered from real PDFs (fixtures made by
//! scripts/fixtures/layout_gold.py).
//!
//! - preprocessing is bit-identical to rapid-layout's (OpenCV resize, BGR,
//!   mean/std), checked by checksums of the resized image and the input;
//! - the raw head outputs of our CPU and GPU forward passes match
//!   onnxruntime's within 1e-4 of each output's largest magnitude;
//! - our post-processing on onnxruntime's outputs gives rapid-layout's boxes;
//! - end to end, the boxes match rapid-layout's: same count and classes,
//!   IoU >= 0.98.

use lfm::gpu::{Gpu, GpuOptions};
use lfm::models::layout::{Detection, Detector, HeadOutputs, LayoutModel, PostProcess};
use lfm::run::image;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture_dir() -> PathBuf {
    root().join("samples/fixtures/layout")
}

fn model() -> &'static LayoutModel {
    static MODEL: OnceLock<LayoutModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let p = root().join("samples/models/layout-cdla/layout_cdla.onnx");
        assert!(p.exists(), "{} is missing: run scripts/setup", p.display());
        LayoutModel::open(&p).unwrap()
    })
}

fn gold() -> &'static Value {
    static GOLD: OnceLock<Value> = OnceLock::new();
    GOLD.get_or_init(|| {
        let text = std::fs::read_to_string(fixture_dir().join("layout.json")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["format_version"], 1);
        v
    })
}

fn pages() -> &'static [Value] {
    gold()["pages"].as_array().unwrap()
}

fn fnv1a64(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn load_page(page: &Value) -> image::Rgb8 {
    image::load(&fixture_dir().join(page["image"].as_str().unwrap())).unwrap()
}

/// The fixture's onnxruntime outputs for `page`: every `raw_stride`-th value
/// of each output, in graph output order.
fn gold_raw(page: &Value) -> (Vec<Vec<f32>>, usize) {
    let bytes = std::fs::read(fixture_dir().join(page["raw"].as_str().unwrap())).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let outs = gold()["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| {
            let t = st.tensor(name.as_str().unwrap()).unwrap();
            assert_eq!(t.dtype(), safetensors::Dtype::F32);
            bytemuck::pod_collect_to_vec(t.data())
        })
        .collect();
    (outs, page["raw_stride"].as_u64().unwrap() as usize)
}

fn gold_boxes(page: &Value) -> Vec<Detection> {
    let labels = &model().labels;
    page["boxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| Detection {
            class: labels
                .iter()
                .position(|l| l == b["class"].as_str().unwrap())
                .unwrap(),
            score: b["score"].as_f64().unwrap() as f32,
            x0: b["x0"].as_f64().unwrap() as f32,
            y0: b["y0"].as_f64().unwrap() as f32,
            x1: b["x1"].as_f64().unwrap() as f32,
            y1: b["y1"].as_f64().unwrap() as f32,
        })
        .collect()
}

/// Every output within `tol` of the largest magnitude in onnxruntime's.
fn assert_head_close(what: &str, got: &HeadOutputs, want: &[Vec<f32>], stride: usize, tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let g: Vec<f32> = g.iter().step_by(stride).copied().collect();
        assert_eq!(g.len(), w.len(), "{what}: output {k} length");
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (i, err) = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .enumerate()
            .fold((0, 0f32), |best, (i, e)| {
                if e > best.1 || e.is_nan() {
                    (i, e)
                } else {
                    best
                }
            });
        eprintln!("{what}: output {k}: max |diff| {err:.2e} of scale {scale:.3}");
        assert!(
            err <= tol * scale,
            "{what}: output {k} element {i}: {} vs onnxruntime {} (|diff| {err:.2e} > {tol:.0e} x {scale})",
            g[i],
            w[i]
        );
    }
}

/// Same count, and a one-to-one matching of boxes with the same class and
/// IoU >= `min_iou`.
fn assert_same_boxes(what: &str, got: &[Detection], want: &[Detection], min_iou: f32) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: box count\n ours {got:?}\n gold {want:?}"
    );
    let mut used = vec![false; got.len()];
    for w in want {
        let best = got
            .iter()
            .enumerate()
            .filter(|(i, g)| !used[*i] && g.class == w.class)
            .map(|(i, g)| (i, g.iou(w)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((i, iou)) if iou >= min_iou => used[i] = true,
            _ => panic!(
                "{what}: no box of class {} with IoU >= {min_iou} for {w:?}\n ours {got:?}",
                w.class
            ),
        }
    }
}

#[test]
fn preprocessing_is_bit_identical() {
    let m = model();
    for page in pages() {
        let img = load_page(page);
        assert_eq!(
            (img.width as u64, img.height as u64),
            (
                page["width"].as_u64().unwrap(),
                page["height"].as_u64().unwrap()
            )
        );
        let [h, w] = m.input_hw;
        let mut resized = image::resize_linear(&img.data, img.width, img.height, 3, w, h);
        for px in resized.chunks_exact_mut(3) {
            px.swap(0, 2); // BGR, as OpenCV holds it
        }
        assert_eq!(
            fnv1a64(&resized),
            page["resized_bgr_fnv1a64"].as_str().unwrap(),
            "{}: resized image",
            page["image"]
        );
        let input = m.preprocess(&img);
        assert_eq!(
            fnv1a64(bytemuck::cast_slice(&input)),
            page["input_fnv1a64"].as_str().unwrap(),
            "{}: input tensor",
            page["image"]
        );
    }
}

#[test]
fn postprocessing_matches_rapid_layout() {
    // Our decoding and NMS on onnxruntime's own outputs (the fully stored
    // page): rapid-layout's boxes, to float rounding.
    let m = model();
    let page = &pages()[0];
    let (raw, stride) = gold_raw(page);
    assert_eq!(stride, 1);
    let original = [
        page["height"].as_u64().unwrap() as usize,
        page["width"].as_u64().unwrap() as usize,
    ];
    let got = m.postprocess(&raw, original, &PostProcess::default());
    let want = gold_boxes(page);
    assert_same_boxes("post-processing", &got, &want, 0.9999);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            g.class, w.class,
            "rapid-layout's order: by class, best first"
        );
        assert!((g.score - w.score).abs() < 1e-6);
    }
}

fn check_forward(what: &str, pages: &[Value], mut forward: impl FnMut(&[f32]) -> HeadOutputs) {
    let m = model();
    for page in pages {
        let img = load_page(page);
        let head = forward(&m.preprocess(&img));
        let (raw, stride) = gold_raw(page);
        let name = format!("{what} {}", page["image"]);
        assert_head_close(&name, &head, &raw, stride, 1e-4);
        let got = m.postprocess(&head, [img.height, img.width], &PostProcess::default());
        assert_same_boxes(&name, &got, &gold_boxes(page), 0.98);
    }
}

#[test]
fn cpu_matches_onnxruntime_and_rapid_layout() {
    check_forward("cpu", pages(), |x| model().forward_cpu(x));
}

#[test]
fn gpu_matches_onnxruntime_and_rapid_layout() {
    let gpu = match Gpu::new(&GpuOptions::default()) {
        Ok(g) => g,
        Err(e) if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() => {
            eprintln!("SKIPPING the GPU layout test (LFM_SKIP_GPU_TESTS set): {e}");
            return;
        }
        Err(e) => panic!("GPU tests need an adapter ({e}); set LFM_SKIP_GPU_TESTS=1 to skip them"),
    };
    let model =
        LayoutModel::open(root().join("samples/models/layout-cdla/layout_cdla.onnx")).unwrap();
    let mut det = Detector::gpu(model, std::sync::Arc::new(gpu)).unwrap();
    eprintln!("{}", det.describe());
    // One page: a forward pass takes ~20 s on lavapipe (CI's software
    // Vulkan); the second page runs through the same kernels on the CPU.
    check_forward("gpu", &pages()[..1], |x| det.forward(x).unwrap());
}
