//! The PP-OCRv4 text networks on the GPU against the CPU interpreter (the
//! oracle, itself checked against onnxruntime in `ocr_parity`), on crops
//! of the fixture page so that lavapipe gets through in CI: the detector's
//! probability map and boxes on a 256 x 96 corner of the page, then the
//! direction classifier and the recogniser on three of the page's lines
//! (two headings and a long line).

mod common;

use lfm::gpu::{Gpu, GpuOptions};
use lfm::models::ocr::det::{self, boxes_from_map, filter_boxes};
use lfm::models::ocr::net::Tensor;
use lfm::models::ocr::{rec, OcrModels};
use lfm::run::image;
use std::sync::Arc;

fn gpu() -> Option<Arc<Gpu>> {
    match Gpu::new(&GpuOptions::default()) {
        Ok(g) => Some(Arc::new(g)),
        Err(e) if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() => {
            eprintln!("SKIPPING GPU OCR parity (LFM_SKIP_GPU_TESTS set): {e}");
            None
        }
        Err(e) => panic!("GPU tests need an adapter ({e}); set LFM_SKIP_GPU_TESTS=1 to skip them"),
    }
}

fn page() -> image::Rgb8 {
    image::load(&common::repo().join("samples/fixtures/ocr/page.png")).unwrap()
}

fn floats(t: &Tensor) -> &[f32] {
    match t {
        Tensor::F32(d, _) => d,
        Tensor::I64(..) => panic!("float output expected"),
    }
}

#[test]
fn text_networks_on_the_gpu_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let dir = common::model("ppocr-v4");
    let cpu = OcrModels::open(&dir).unwrap();
    let mut dev = OcrModels::open(&dir).unwrap();
    dev.use_gpu(gpu).unwrap();
    let img = page();

    // Detection on the page's top-left corner (the title and a heading):
    // a 256 x 96 model input, BGR planes as the detector normalises them.
    let (x0, y0, w, h) = (16, 16, 256, 96);
    let mut bgr = Vec::with_capacity(w * h * 3);
    for y in y0..y0 + h {
        for x in x0..x0 + w {
            let p = &img.data[(y * img.width + x) * 3..][..3];
            bgr.extend_from_slice(&[p[2], p[1], p[0]]);
        }
    }
    let input = Tensor::F32(det::normalize_planes(&bgr, w * h), vec![1, 3, h, w]);
    let want = cpu.det.net.run(input.clone()).unwrap();
    let gpu_net = dev.det.net.gpu().expect("the detector is on the GPU");
    let on_device = gpu_net.device_nodes(&dev.det.net, &[1, 3, h, w]).unwrap();
    let got = dev.det.net.run(input).unwrap();
    let (pw, pg) = (floats(&want[0]), floats(&got[0]));
    let worst = pw
        .iter()
        .zip(pg)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!(
        "detector: {on_device} nodes on the device; largest probability difference {worst:.2e}"
    );
    // Every node of DBNet runs on the device.
    assert_eq!(on_device, dev.det.net.node_count());
    // Sums in another order over ~60 layers: probabilities (0..1) agree
    // to 1e-4; the boxes, thresholded at 0.3 and rounded, are the same.
    assert!(worst < 1e-4, "probability maps differ by {worst}");
    let boxes = |p: &[f32]| filter_boxes(boxes_from_map(p, w, h, w, h), w, h);
    let (bw, bg) = (boxes(pw), boxes(pg));
    assert!(!bw.is_empty(), "the corner has text lines");
    assert_eq!(bg.len(), bw.len(), "box count");
    for (a, b) in bw.iter().zip(&bg) {
        for (p, q) in a.iter().zip(b) {
            assert!(
                (p[0] - q[0]).abs() <= 1.0 && (p[1] - q[1]).abs() <= 1.0,
                "boxes {a:?} (cpu) and {b:?} (gpu)"
            );
        }
    }

    // Direction and recognition on three of the page's lines, cropped by
    // the CPU path.
    let crops: Vec<_> = cpu.crops(&img).unwrap().into_iter().take(3).collect();
    assert_eq!(crops.len(), 3);
    // The classifier's backbone runs on the device, its SE blocks' biases
    // (added through a Reshape of a constant) folded into their
    // convolutions; its head (max pooling, flatten, MatMul, softmax) on
    // the CPU.
    let cls_net = &dev.cls.net;
    let cls_gpu = cls_net.gpu().expect("the classifier is on the GPU");
    let cls_on_device = cls_gpu
        .device_nodes(cls_net, &[1, 3, rec::LINE_HEIGHT, rec::CLS_WIDTH])
        .unwrap();
    eprintln!(
        "classifier: {cls_on_device} of {} nodes on the device",
        cls_net.node_count()
    );
    assert!(
        cls_net.node_count() - cls_on_device <= 12,
        "only {cls_on_device} of the classifier's {} nodes run on the device",
        cls_net.node_count()
    );
    let (oc, og) = (
        cpu.cls.orient(crops.clone()).unwrap(),
        dev.cls.orient(crops).unwrap(),
    );
    assert_eq!(oc, og, "the classifier turned different lines");
    let (tc, tg) = (
        cpu.rec.recognize(&oc).unwrap(),
        dev.rec.recognize(&og).unwrap(),
    );
    for ((sc, cc), (sg, cg)) in tc.iter().zip(&tg) {
        eprintln!("{sc:?} cpu {cc:.6} gpu {cg:.6}");
        assert_eq!(sc, sg);
        // Mean softmax confidences of the same characters: 1e-4.
        assert!((cc - cg).abs() < 1e-4, "{sc}: confidence {cc} vs {cg}");
    }
}
