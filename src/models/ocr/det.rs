//! Text detection: PP-OCRv4's DBNet with RapidOCR's `DetPreProcess`,
//! `DBPostProcess` and `filter_tag_det_res`.

use super::geometry::{self, Point};
use super::gpu::Network;
use super::net::{Net, Tensor};
use crate::error::{Error, Result};
use crate::run::image::resize_linear;
use std::path::Path;

/// RapidOCR's detection settings (config.yaml, `Det`).
pub const LIMIT_SIDE: usize = 736;
pub const THRESH: f32 = 0.3;
pub const BOX_THRESH: f64 = 0.5;
pub const MAX_CANDIDATES: usize = 1000;
pub const UNCLIP_RATIO: f64 = 1.6;
const MIN_SIZE: f64 = 3.0;

/// The model input is at most this many pixels (a 20000 x 20000 page is
/// scaled to 2000 on its long side before this; the bound keeps memory
/// in check for anything that slips past).
pub const MAX_INPUT_PIXELS: usize = 4096 * 4096;

pub struct Detector {
    pub net: Network,
}

impl Detector {
    pub fn open(path: &Path) -> Result<Detector> {
        let (net, onnx) = Net::open(path)?;
        if onnx.graph.outputs.len() != 1 {
            return Err(Error::unsupported(
                path,
                format!(
                    "not a DB text detector: {} outputs, expected one probability map",
                    onnx.graph.outputs.len()
                ),
            ));
        }
        Ok(Detector {
            net: Network::cpu(net),
        })
    }

    /// The model input for a BGR page: its size and the [1, 3, h, w] planes.
    pub fn preprocess(bgr: &[u8], w: usize, h: usize) -> Option<(usize, usize, Vec<f32>)> {
        let ratio = if w.min(h) < LIMIT_SIDE {
            LIMIT_SIDE as f64 / w.min(h) as f64
        } else {
            1.0
        };
        let rh = super::multiple_of_32((h as f64 * ratio) as usize);
        let rw = super::multiple_of_32((w as f64 * ratio) as usize);
        if rw == 0 || rh == 0 || rw * rh > MAX_INPUT_PIXELS {
            return None;
        }
        let resized = resize_linear(bgr, w, h, 3, rw, rh);
        Some((rw, rh, normalize_planes(&resized, rw * rh)))
    }

    /// Text boxes of a BGR page, corners top-left, top-right, bottom-right,
    /// bottom-left in page pixels (integers), in the detector's order.
    pub fn detect(&self, bgr: &[u8], w: usize, h: usize) -> Result<Vec<[Point; 4]>> {
        let Some((rw, rh, input)) = Self::preprocess(bgr, w, h) else {
            return Err(Error::invalid(format!(
                "a {w} x {h} page is outside what the text detector takes"
            )));
        };
        let out = self.net.run(Tensor::F32(input, vec![1, 3, rh, rw]))?;
        let prob = match &out[0] {
            Tensor::F32(d, s) if s.iter().product::<usize>() == rw * rh => d,
            t => {
                return Err(Error::format(
                    &self.net.path,
                    format!(
                        "not a DB text detector: output shape {:?} for input {rh} x {rw}",
                        t.shape()
                    ),
                ))
            }
        };
        if prob.iter().any(|v| !v.is_finite()) {
            return Err(Error::format(
                &self.net.path,
                "the detector produced NaN or infinite values (damaged weights?)",
            ));
        }
        let boxes = boxes_from_map(prob, rw, rh, w, h);
        Ok(filter_boxes(boxes, w, h))
    }
}

/// `(v * (1 / 255) - 0.5) / 0.5` per channel, as RapidOCR's float32 and
/// float64 mix computes it, into [3, n] planes (channel order kept).
pub fn normalize_planes(pixels: &[u8], n: usize) -> Vec<f32> {
    let scale = (1.0f64 / 255.0) as f32;
    let mut out = vec![0.0f32; 3 * n];
    for (p, px) in pixels.chunks_exact(3).enumerate() {
        for c in 0..3 {
            let v = (px[c] as f32 * scale) as f64;
            out[c * n + p] = ((v - 0.5) / 0.5) as f32;
        }
    }
    out
}

/// `DBPostProcess.boxes_from_bitmap` on the probability map ([h, w]):
/// boxes in page coordinates (`dest_w` x `dest_h`), integers.
pub fn boxes_from_map(
    prob: &[f32],
    w: usize,
    h: usize,
    dest_w: usize,
    dest_h: usize,
) -> Vec<[Point; 4]> {
    // Threshold, then dilate with a 2x2 kernel anchored at its centre:
    // a pixel is set when it or its left, upper or upper-left neighbour is.
    let seg: Vec<bool> = prob.iter().map(|&p| p > THRESH).collect();
    let mut mask = vec![0u8; w * h];
    for y in 0..h {
        for x in 0..w {
            let at = |dx: usize, dy: usize| x >= dx && y >= dy && seg[(y - dy) * w + x - dx];
            mask[y * w + x] = (at(0, 0) || at(1, 0) || at(0, 1) || at(1, 1)) as u8;
        }
    }
    let mut boxes = Vec::new();
    for border in geometry::region_borders(&mask, w, h)
        .iter()
        .take(MAX_CANDIDATES)
    {
        let Some((corners, short)) = geometry::mini_box(border, geometry::PointOrder::Contour)
        else {
            continue;
        };
        if short < MIN_SIZE {
            continue;
        }
        if geometry::box_score(prob, w, h, &corners) < BOX_THRESH {
            continue;
        }
        let (area, perimeter) = geometry::area_and_perimeter(&corners);
        if perimeter == 0.0 {
            continue;
        }
        let grown = geometry::offset_round(&corners, area * UNCLIP_RATIO / perimeter);
        let Some((corners, short)) = geometry::mini_box(&grown, geometry::PointOrder::Polygon)
        else {
            continue;
        };
        if short < MIN_SIZE + 2.0 {
            continue;
        }
        let scale = |v: f64, n: usize, dn: usize| {
            ((v / n as f64 * dn as f64).round_ties_even()).clamp(0.0, dn as f64) as i32 as f64
        };
        boxes.push(corners.map(|p| [scale(p[0], w, dest_w), scale(p[1], h, dest_h)]));
    }
    boxes
}

/// `filter_tag_det_res`: corners ordered clockwise from the top-left,
/// clipped to the page, boxes 3 pixels or less on a side dropped.
pub fn filter_boxes(boxes: Vec<[Point; 4]>, w: usize, h: usize) -> Vec<[Point; 4]> {
    let mut out = Vec::new();
    for b in boxes {
        let mut p = b.to_vec();
        p.sort_by(|a, c| a[0].total_cmp(&c[0]));
        let (mut left, mut right) = ([p[0], p[1]], [p[2], p[3]]);
        left.sort_by(|a, c| a[1].total_cmp(&c[1]));
        right.sort_by(|a, c| a[1].total_cmp(&c[1]));
        let clip = |q: Point| {
            [
                q[0].clamp(0.0, w as f64 - 1.0).trunc(),
                q[1].clamp(0.0, h as f64 - 1.0).trunc(),
            ]
        };
        let r = [clip(left[0]), clip(right[0]), clip(right[1]), clip(left[1])];
        let width = super::dist(r[0], r[1]) as i64;
        let height = super::dist(r[0], r[3]) as i64;
        if width <= 3 || height <= 3 {
            continue;
        }
        out.push(r);
    }
    out
}

/// RapidOCR's `sorted_boxes`: by the top-left corner's y then x, then
/// neighbours less than 10 pixels apart vertically put left to right.
pub fn sorted_boxes(mut boxes: Vec<[Point; 4]>) -> Vec<[Point; 4]> {
    boxes.sort_by(|a, b| {
        (a[0][1], a[0][0])
            .partial_cmp(&(b[0][1], b[0][0]))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    for i in 0..boxes.len().saturating_sub(1) {
        for j in (0..=i).rev() {
            if (boxes[j + 1][0][1] - boxes[j][0][1]).abs() < 10.0
                && boxes[j + 1][0][0] < boxes[j][0][0]
            {
                boxes.swap(j, j + 1);
            } else {
                break;
            }
        }
    }
    boxes
}
