//! Text detection, direction classification and recognition with
//! PaddleOCR's PP-OCRv4 networks, run from their ONNX exports as RapidOCR
//! 1.4.4 runs them (its default configuration):
//!
//! - the page is scaled down to at most 2000 pixels on its long side (to a
//!   multiple of 32), up to 30 on its short side, and letterboxed when very
//!   flat;
//! - detection ([`det`]): resized so the short side is at least 736 (both
//!   sides multiples of 32), BGR planes normalised to [-1, 1]; the DB
//!   probability map thresholded at 0.3, dilated 2x2, each region's
//!   minimum-area box kept when its mean probability is at least 0.5,
//!   expanded by area * 1.6 / perimeter, scaled back to the page;
//! - lines ordered top to bottom, then left to right within 10 pixels;
//! - each line cropped by a perspective warp (bicubic), turned upright when
//!   it is 1.5 times taller than wide;
//! - direction ([`rec::Classifier`]): 48 x 192 inputs, a line turned 180
//!   degrees when the classifier says so with more than 0.9;
//! - recognition ([`rec::Recognizer`]): lines sorted by aspect ratio, in
//!   groups of 6 padded to the group's widest (48 high), CTC greedy
//!   decoding with the dictionary the model carries; lines whose mean
//!   confidence is below 0.5 are dropped.

pub mod det;
pub mod document;
pub mod geometry;
pub mod gpu;
pub mod net;
pub mod rec;

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::run::image::{resize_linear, Rgb8};
use geometry::Point;
use gpu::GpuNet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where `scripts/setup` puts the models, relative to the checkout.
pub const MODEL_DIR: &str = "samples/models/ppocr-v4";
pub const DET_FILE: &str = "ch_PP-OCRv4_det_infer.onnx";
pub const REC_FILE: &str = "ch_PP-OCRv4_rec_infer.onnx";
pub const CLS_FILE: &str = "ch_ppocr_mobile_v2.0_cls_infer.onnx";

/// RapidOCR's global limits.
const MAX_SIDE: usize = 2000;
const MIN_SIDE: usize = 30;
const MIN_HEIGHT: usize = 30;
const WIDTH_HEIGHT_RATIO: f64 = 8.0;
/// Lines below this mean confidence are dropped.
pub const TEXT_SCORE: f64 = 0.5;

/// One recognised line: its box (corners top-left, top-right,
/// bottom-right, bottom-left, in page pixels), text and confidence.
#[derive(Clone, Debug, PartialEq)]
pub struct TextLine {
    pub corners: [Point; 4],
    pub text: String,
    pub score: f64,
}

impl TextLine {
    /// (x0, y0, x1, y1): the axis-aligned bounds of the box.
    pub fn bounds(&self) -> [f64; 4] {
        let xs = self.corners.iter().map(|p| p[0]);
        let ys = self.corners.iter().map(|p| p[1]);
        [
            xs.clone().fold(f64::MAX, f64::min),
            ys.clone().fold(f64::MAX, f64::min),
            xs.fold(f64::MIN, f64::max),
            ys.fold(f64::MIN, f64::max),
        ]
    }
}

/// The three networks.
pub struct OcrModels {
    pub det: det::Detector,
    pub cls: rec::Classifier,
    pub rec: rec::Recognizer,
    /// Summed over every [`OcrModels::read`].
    times: Mutex<StageTimes>,
}

/// Where reading time went, summed over pages: the three stages, and (on
/// the GPU) how much of the networks' time was the device part (upload,
/// dispatches, read-back) and how much the CPU part after it.
#[derive(Clone, Copy, Debug, Default)]
pub struct StageTimes {
    pub detect: Duration,
    pub direction: Duration,
    pub recognise: Duration,
    pub device: Duration,
    pub cpu_tail: Duration,
}

impl OcrModels {
    /// Opens the three files in `dir` (the names RapidOCR ships).
    pub fn open(dir: &Path) -> Result<OcrModels> {
        let file = |name: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(Error::invalid(format!(
                    "{}: no such model file (run scripts/setup, or pass --text-models DIR)",
                    p.display()
                )))
            }
        };
        Ok(OcrModels {
            det: det::Detector::open(&file(DET_FILE)?)?,
            cls: rec::Classifier::open(&file(CLS_FILE)?)?,
            rec: rec::Recognizer::open(&file(REC_FILE)?)?,
            times: Mutex::default(),
        })
    }

    /// Runs the three networks on `gpu` from now on (all three, or none
    /// when an upload fails).
    pub fn use_gpu(&mut self, gpu: Arc<Gpu>) -> Result<()> {
        let det = GpuNet::new(gpu.clone(), &self.det.net)?;
        let cls = GpuNet::new(gpu.clone(), &self.cls.net)?;
        let rec = GpuNet::new(gpu, &self.rec.net)?;
        self.det.net.gpu = Some(det);
        self.cls.net.gpu = Some(cls);
        self.rec.net.gpu = Some(rec);
        Ok(())
    }

    /// The stage times so far.
    pub fn stage_times(&self) -> StageTimes {
        let mut times = *self.times.lock().expect("the times are not poisoned");
        for net in [&self.det.net, &self.cls.net, &self.rec.net] {
            if let Some(g) = net.gpu() {
                let (device, cpu_tail) = g.times();
                times.device += device;
                times.cpu_tail += cpu_tail;
            }
        }
        times
    }

    /// True when the networks run on a GPU.
    pub fn on_gpu(&self) -> bool {
        self.det.net.gpu().is_some()
    }

    /// The detected line boxes of `img` (RGB) in RapidOCR's order, in the
    /// coordinates of the page the detector saw, their crops (before the
    /// direction classifier), the ratios [h, w] back to `img` and the
    /// letterbox band's height.
    #[allow(clippy::type_complexity)]
    fn detect(&self, img: &Rgb8) -> Result<(Vec<[Point; 4]>, Vec<Crop>, [f64; 2], usize)> {
        let bgr = to_bgr(img);
        let (page, ratio) = limit_sides(&bgr, img.width, img.height);
        let (pw, ph) = (page.1, page.2);
        let (page, top) = letterbox(page.0, pw, ph);
        let page_h = ph + 2 * top;
        let boxes = self.det.detect(&page, pw, page_h)?;
        let boxes = det::sorted_boxes(boxes);
        let planes = geometry::Planes {
            data: &page,
            width: pw,
            height: page_h,
        };
        let crops = boxes.iter().map(|b| crop_line(&planes, b)).collect();
        Ok((boxes, crops, ratio, top))
    }

    /// The line crops of `img` (RGB), as the direction classifier gets
    /// them.
    pub fn crops(&self, img: &Rgb8) -> Result<Vec<Crop>> {
        Ok(self.detect(img)?.1)
    }

    /// Every text line of `img` (RGB), in RapidOCR's order, with RapidOCR's
    /// filters.
    pub fn read(&self, img: &Rgb8) -> Result<Vec<TextLine>> {
        let t0 = Instant::now();
        let (boxes, crops, ratio, top) = self.detect(img)?;
        let t1 = Instant::now();
        let crops = self.cls.orient(crops)?;
        let t2 = Instant::now();
        let texts = self.rec.recognize(&crops)?;
        {
            let mut times = self.times.lock().expect("the times are not poisoned");
            times.detect += t1 - t0;
            times.direction += t2 - t1;
            times.recognise += t2.elapsed();
        }
        let mut lines = Vec::new();
        for (b, (text, score)) in boxes.iter().zip(texts) {
            if score < TEXT_SCORE {
                continue;
            }
            // Back to the page: undo the letterbox, then the resize, clipped.
            let corners = b.map(|p| {
                let x = (p[0] as f32 * ratio[1] as f32) as f64;
                let y = ((p[1] - top as f64) as f32 * ratio[0] as f32) as f64;
                [
                    x.clamp(0.0, img.width as f64),
                    y.clamp(0.0, img.height as f64),
                ]
            });
            lines.push(TextLine {
                corners,
                text,
                score,
            });
        }
        Ok(lines)
    }
}

/// A line crop: [h, w, 3] BGR.
#[derive(Clone, Debug, PartialEq)]
pub struct Crop {
    pub data: Vec<u8>,
    pub width: usize,
    pub height: usize,
}

impl Crop {
    /// The crop turned 90 degrees counter-clockwise (`np.rot90`).
    fn rot90(&self) -> Crop {
        let (w, h) = (self.width, self.height);
        let mut data = vec![0u8; w * h * 3];
        for y in 0..w {
            for x in 0..h {
                // Output (x, y) of size [w rows, h cols] reads input (w-1-y, x).
                let src = (x * w + (w - 1 - y)) * 3;
                let dst = (y * h + x) * 3;
                data[dst..dst + 3].copy_from_slice(&self.data[src..src + 3]);
            }
        }
        Crop {
            data,
            width: h,
            height: w,
        }
    }

    /// The crop turned 180 degrees.
    fn rot180(&self) -> Crop {
        let mut data = Vec::with_capacity(self.data.len());
        for px in self.data.chunks_exact(3).rev() {
            data.extend_from_slice(px);
        }
        Crop {
            data,
            width: self.width,
            height: self.height,
        }
    }
}

fn to_bgr(img: &Rgb8) -> Vec<u8> {
    let mut out = img.data.clone();
    for px in out.chunks_exact_mut(3) {
        px.swap(0, 2);
    }
    out
}

fn dist(a: Point, b: Point) -> f64 {
    ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2)).sqrt()
}

/// RapidOCR's `get_rotate_crop_image`.
fn crop_line(page: &geometry::Planes<'_>, corners: &[Point; 4]) -> Crop {
    let pts = corners.map(|p| [p[0] as f32 as f64, p[1] as f32 as f64]);
    let w = (dist(pts[0], pts[1]).max(dist(pts[2], pts[3])) as usize).max(1);
    let h = (dist(pts[0], pts[3]).max(dist(pts[1], pts[2])) as usize).max(1);
    let dst = [
        [0.0, 0.0],
        [w as f64, 0.0],
        [w as f64, h as f64],
        [0.0, h as f64],
    ];
    let data = geometry::perspective_transform(&pts, &dst)
        .and_then(|m| geometry::warp_perspective_cubic(page, &m, w, h))
        .unwrap_or_else(|| vec![0u8; w * h * 3]);
    let crop = Crop {
        data,
        width: w,
        height: h,
    };
    if h as f64 / w as f64 >= 1.5 {
        crop.rot90()
    } else {
        crop
    }
}

/// `int(round(v / 32) * 32)` with Python's round (half to even).
fn multiple_of_32(v: usize) -> usize {
    ((v as f64 / 32.0).round_ties_even() * 32.0) as usize
}

/// RapidOCR's `reduce_max_side` / `increase_min_side`: the page, its
/// width and height, and the ratios [h, w] back to the original.
fn limit_sides(bgr: &[u8], w: usize, h: usize) -> ((Vec<u8>, usize, usize), [f64; 2]) {
    let resize = |ratio: f64| {
        let rh = multiple_of_32((h as f64 * ratio) as usize).max(32);
        let rw = multiple_of_32((w as f64 * ratio) as usize).max(32);
        (
            (resize_linear(bgr, w, h, 3, rw, rh), rw, rh),
            [h as f64 / rh as f64, w as f64 / rw as f64],
        )
    };
    if w.max(h) > MAX_SIDE {
        return resize(MAX_SIDE as f64 / w.max(h) as f64);
    }
    if w.min(h) < MIN_SIDE {
        return resize(MIN_SIDE as f64 / w.min(h) as f64);
    }
    ((bgr.to_vec(), w, h), [1.0, 1.0])
}

/// RapidOCR's `maybe_add_letterbox`: black bands above and below a page
/// that is very short or very flat. Returns the page and the band height.
fn letterbox(page: Vec<u8>, w: usize, h: usize) -> (Vec<u8>, usize) {
    if h > MIN_HEIGHT && (w as f64 / h as f64) <= WIDTH_HEIGHT_RATIO {
        return (page, 0);
    }
    let new_h = ((w as f64 / WIDTH_HEIGHT_RATIO) as usize).max(MIN_HEIGHT) * 2;
    let pad = (new_h as i64 - h as i64).unsigned_abs() as usize / 2;
    let mut out = vec![0u8; w * 3 * pad];
    out.extend_from_slice(&page);
    out.extend(std::iter::repeat_n(0u8, w * 3 * pad));
    (out, pad)
}
