//! From head outputs to boxes, the GFL way, with rapid-layout's defaults:
//! per level, each cell's box side distances are the expectation of a
//! softmax over `bins` distance bins (in strides); the best `nms_top_k`
//! cells by top class score are kept; then per class, scores above the
//! threshold go through greedy NMS; boxes are clipped to the model input
//! and scaled back to the original image.

/// rapid-layout 1.2.1's PicoDet post-processing parameters.
#[derive(Clone, Debug)]
pub struct PostProcess {
    /// Keep class scores strictly above this (rapid-layout `conf_thresh`).
    pub score_threshold: f32,
    /// Drop a box whose IoU with a kept box of its class is above this.
    pub iou_threshold: f32,
    /// Cells kept per level, by their best class score.
    pub nms_top_k: usize,
    /// Highest-scoring candidates per class that NMS looks at.
    pub nms_candidates: usize,
    /// Boxes kept per class.
    pub keep_top_k: usize,
}

impl Default for PostProcess {
    fn default() -> Self {
        PostProcess {
            score_threshold: 0.5,
            iou_threshold: 0.5,
            nms_top_k: 1000,
            nms_candidates: 200,
            keep_top_k: 100,
        }
    }
}

/// One head level's outputs for one image.
pub struct Level<'a> {
    pub stride: usize,
    /// [cells, classes], after the sigmoid.
    pub scores: &'a [f32],
    /// [cells, 4 * bins]: left, top, right, bottom distributions (logits).
    pub distributions: &'a [f32],
}

/// A detected region in original image pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Detection {
    pub class: usize,
    pub score: f32,
    pub x0: f32,
    pub y0: f32,
    pub x1: f32,
    pub y1: f32,
}

impl Detection {
    pub fn iou(&self, other: &Detection) -> f32 {
        iou(
            [
                self.x0 as f64,
                self.y0 as f64,
                self.x1 as f64,
                self.y1 as f64,
            ],
            [
                other.x0 as f64,
                other.y0 as f64,
                other.x1 as f64,
                other.y1 as f64,
            ],
        ) as f32
    }
}

/// rapid-layout's IoU: areas from corners clipped at zero, 1e-5 added to
/// the union.
fn iou(a: [f64; 4], b: [f64; 4]) -> f64 {
    let area = |x0: f64, y0: f64, x1: f64, y1: f64| (x1 - x0).max(0.0) * (y1 - y0).max(0.0);
    let inter = area(
        a[0].max(b[0]),
        a[1].max(b[1]),
        a[2].min(b[2]),
        a[3].min(b[3]),
    );
    inter / (area(a[0], a[1], a[2], a[3]) + area(b[0], b[1], b[2], b[3]) - inter + 1e-5)
}

/// Decodes every level and runs NMS. `input` is the model input's
/// [height, width], `original` the image's. Detections come per class in
/// class order, best first within a class (rapid-layout's order).
pub fn decode(
    levels: &[Level<'_>],
    classes: usize,
    bins: usize,
    input: [usize; 2],
    original: [usize; 2],
    p: &PostProcess,
) -> Vec<Detection> {
    let mut boxes: Vec<[f64; 4]> = Vec::new();
    // [boxes, classes]
    let mut scores: Vec<f32> = Vec::new();
    for level in levels {
        let s = level.stride;
        let cols = input[1].div_ceil(s);
        let cells = level.scores.len() / classes;
        assert_eq!(
            level.scores.len(),
            cells * classes,
            "scores are not [cells, classes]"
        );
        assert_eq!(
            level.distributions.len(),
            cells * 4 * bins,
            "distributions are not [cells, 4 * bins]"
        );
        let best = |k: usize| {
            level.scores[k * classes..(k + 1) * classes]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max)
        };
        let mut order: Vec<usize> = (0..cells).collect();
        order.sort_by(|&a, &b| best(b).total_cmp(&best(a)).then(a.cmp(&b)));
        order.truncate(p.nms_top_k);
        for k in order {
            let cx = ((k % cols) as f64 + 0.5) * s as f64;
            let cy = ((k / cols) as f64 + 0.5) * s as f64;
            let d = |side: usize| {
                expected_bin(&level.distributions[(k * 4 + side) * bins..(k * 4 + side + 1) * bins])
                    * s as f64
            };
            boxes.push([cx - d(0), cy - d(1), cx + d(2), cy + d(3)]);
            scores.extend_from_slice(&level.scores[k * classes..(k + 1) * classes]);
        }
    }
    // Boxes are clipped to the model input, then scaled by the f32 factors
    // rapid-layout computes.
    let sx = (input[1] as f64 / original[1] as f64) as f32 as f64;
    let sy = (input[0] as f64 / original[0] as f64) as f32 as f64;
    let (w, h) = (input[1] as f64, input[0] as f64);
    let mut out = Vec::new();
    for class in 0..classes {
        let score = |i: usize| scores[i * classes + class];
        for i in nms(&boxes, score, p) {
            let b = boxes[i];
            // Clipped in f32 as rapid-layout's warp_boxes returns float32.
            let clip = |v: f64, hi: f64| v.clamp(0.0, hi) as f32 as f64;
            out.push(Detection {
                class,
                score: score(i),
                x0: (clip(b[0], w) / sx) as f32,
                y0: (clip(b[1], h) / sy) as f32,
                x1: (clip(b[2], w) / sx) as f32,
                y1: (clip(b[3], h) / sy) as f32,
            });
        }
    }
    out
}

/// Greedy NMS over the boxes whose `score` is above the threshold: the
/// indices kept, best first.
fn nms(boxes: &[[f64; 4]], score: impl Fn(usize) -> f32, p: &PostProcess) -> Vec<usize> {
    let mut cand: Vec<usize> = (0..boxes.len())
        .filter(|&i| score(i) > p.score_threshold)
        .collect();
    cand.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
    cand.truncate(p.nms_candidates);
    let mut kept: Vec<usize> = Vec::new();
    for i in cand {
        if kept.len() == p.keep_top_k {
            break;
        }
        if kept
            .iter()
            .all(|&j| iou(boxes[i], boxes[j]) <= p.iou_threshold as f64)
        {
            kept.push(i);
        }
    }
    kept
}

/// The expected bin index under a softmax over `logits`.
fn expected_bin(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = logits.iter().map(|&v| ((v - max) as f64).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter()
        .enumerate()
        .map(|(i, &v)| i as f64 * v)
        .sum::<f64>()
        / sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_confident_cell_becomes_one_box() {
        // A 2x2 grid at stride 8 on a 16x16 input, 2 classes, 2 bins.
        let mut scores = vec![0.1f32; 4 * 2];
        scores[3 * 2 + 1] = 0.9; // cell 3 (row 1, col 1), class 1
        scores[2 * 2 + 1] = 0.8; // cell 2 overlaps it heavily: suppressed
        let mut dist = vec![0.0f32; 4 * 4 * 2];
        // Cell 3: every side puts all its mass on bin 1 -> distance 1 stride.
        for side in 0..4 {
            dist[(3 * 4 + side) * 2 + 1] = 50.0;
            dist[(2 * 4 + side) * 2 + 1] = 50.0;
        }
        let level = Level {
            stride: 8,
            scores: &scores,
            distributions: &dist,
        };
        let p = PostProcess {
            iou_threshold: 0.1,
            ..PostProcess::default()
        };
        let d = decode(&[level], 2, 2, [16, 16], [32, 64], &p);
        assert_eq!(d.len(), 1, "{d:?}");
        let d = d[0];
        assert_eq!((d.class, d.score), (1, 0.9));
        // Centre (12, 12), sides 8: [4, 4, 20, 20] clipped to 16, then
        // scaled by 64/16 in x and 32/16 in y.
        assert!(
            (d.x0 - 16.0).abs() < 1e-3 && (d.x1 - 64.0).abs() < 1e-3,
            "{d:?}"
        );
        assert!(
            (d.y0 - 8.0).abs() < 1e-3 && (d.y1 - 32.0).abs() < 1e-3,
            "{d:?}"
        );
    }

    #[test]
    fn iou_of_identical_and_disjoint_boxes() {
        let a = [0.0, 0.0, 10.0, 10.0];
        assert!((iou(a, a) - 1.0).abs() < 1e-6);
        assert_eq!(iou(a, [20.0, 20.0, 30.0, 30.0]), 0.0);
    }
}
