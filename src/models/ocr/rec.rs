//! Line direction and recognition: the mobile 0/180 classifier and
//! PP-OCRv4's SVTR recogniser with CTC decoding, with RapidOCR's
//! `TextClassifier` and `TextRecognizer` pre- and post-processing.

use super::gpu::Network;
use super::net::{Net, Tensor};
use super::Crop;
use crate::error::{Error, Result};
use crate::run::image::resize_linear;
use rayon::prelude::*;
use std::path::Path;

/// The networks' input height.
pub const LINE_HEIGHT: usize = 48;
/// The classifier's input width; the recogniser's narrowest.
pub const CLS_WIDTH: usize = 192;
pub const REC_WIDTH: usize = 320;
/// Lines per recognition group (RapidOCR's `rec_batch_num`): a group is
/// padded to its widest line.
pub const REC_GROUP: usize = 6;
/// A line is turned when the classifier says "180" with more than this.
pub const CLS_THRESH: f32 = 0.9;
/// The widest recogniser input accepted (in pixels at height 48): a longer
/// line is still read, squeezed to this width.
pub const MAX_REC_WIDTH: usize = 48 * 200;

/// `resize_norm_img`: the crop resized to height 48 and at most
/// `width` wide (keeping its ratio, rounded up), scaled to [-1, 1] in
/// float32, zero-padded on the right to `width`: [3, 48, width] planes.
pub fn line_input(crop: &Crop, width: usize) -> Vec<f32> {
    let ratio = crop.width as f64 / crop.height as f64;
    let rw = ((LINE_HEIGHT as f64 * ratio).ceil() as usize).clamp(1, width);
    let resized = resize_linear(&crop.data, crop.width, crop.height, 3, rw, LINE_HEIGHT);
    let mut out = vec![0.0f32; 3 * LINE_HEIGHT * width];
    for y in 0..LINE_HEIGHT {
        for x in 0..rw {
            for c in 0..3 {
                let v = resized[(y * rw + x) * 3 + c] as f32 / 255.0;
                out[(c * LINE_HEIGHT + y) * width + x] = (v - 0.5) / 0.5;
            }
        }
    }
    out
}

pub struct Classifier {
    pub net: Network,
}

impl Classifier {
    pub fn open(path: &Path) -> Result<Classifier> {
        Ok(Classifier {
            net: Network::cpu(Net::open(path)?.0),
        })
    }

    /// Each crop, turned 180 degrees where the classifier says it is
    /// upside down. On the CPU, crops go through the network in batches of
    /// [`REC_GROUP`] (RapidOCR's `cls_batch_num`); a crop's scores are the
    /// same in any batch.
    pub fn orient(&self, crops: Vec<Crop>) -> Result<Vec<Crop>> {
        let batch = if self.net.gpu().is_some() {
            1
        } else {
            REC_GROUP
        };
        let mut scores = Vec::with_capacity(crops.len());
        for group in crops.chunks(batch) {
            let input: Vec<f32> = group
                .iter()
                .flat_map(|c| line_input(c, CLS_WIDTH))
                .collect();
            let y = self.net.run(Tensor::F32(
                input,
                vec![group.len(), 3, LINE_HEIGHT, CLS_WIDTH],
            ))?;
            match &y[0] {
                Tensor::F32(d, s) if s == &[group.len(), 2] => {
                    scores.extend(d.chunks_exact(2).map(|p| [p[0], p[1]]))
                }
                t => {
                    return Err(Error::format(
                        &self.net.path,
                        format!(
                            "not a 0/180 direction classifier: output shape {:?}",
                            t.shape()
                        ),
                    ))
                }
            }
        }
        Ok(crops
            .into_iter()
            .zip(scores)
            .map(|(crop, [up, down])| {
                // argmax picks the first of equal scores, as numpy does.
                if down > up && down > CLS_THRESH {
                    crop.rot180()
                } else {
                    crop
                }
            })
            .collect())
    }
}

pub struct Recognizer {
    pub net: Network,
    /// Index 0 is the CTC blank; the model's characters follow, then a space.
    pub charset: Vec<String>,
}

impl Recognizer {
    pub fn open(path: &Path) -> Result<Recognizer> {
        let (net, onnx) = Net::open(path)?;
        let dict = onnx.metadata("character").ok_or_else(|| {
            Error::unsupported(
                path,
                "not a PaddleOCR recogniser: no 'character' dictionary in its metadata",
            )
        })?;
        let mut charset = vec![String::new()];
        charset.extend(dict.lines().map(str::to_string));
        charset.push(" ".to_string());
        Ok(Recognizer {
            net: Network::cpu(net),
            charset,
        })
    }

    /// (text, mean confidence) for each crop, recognised in RapidOCR's
    /// groups: sorted by aspect ratio, 6 at a time, each padded to the
    /// widest of its group (a line's result depends on its group's width).
    pub fn recognize(&self, crops: &[Crop]) -> Result<Vec<(String, f64)>> {
        let ratio = |c: &Crop| c.width as f64 / c.height as f64;
        let mut order: Vec<usize> = (0..crops.len()).collect();
        order.sort_by(|&a, &b| ratio(&crops[a]).total_cmp(&ratio(&crops[b])));
        let mut out = vec![(String::new(), 0.0); crops.len()];
        for group in order.chunks(REC_GROUP) {
            let max_ratio = group
                .iter()
                .map(|&i| ratio(&crops[i]))
                .fold(REC_WIDTH as f64 / LINE_HEIGHT as f64, f64::max);
            let width = ((LINE_HEIGHT as f64 * max_ratio) as usize).min(MAX_REC_WIDTH);
            if self.net.gpu().is_some() {
                // The device plans take one line at a time.
                for &i in group {
                    let input = line_input(&crops[i], width);
                    let y = self
                        .net
                        .run(Tensor::F32(input, vec![1, 3, LINE_HEIGHT, width]))?;
                    out[i] = self.decode(&y[0])?;
                }
                continue;
            }
            // On the CPU the lines of a group run side by side, each alone:
            // a line's outputs are the same in any batch (bit for bit), and
            // one line's tensors stay in cache where a wide group's (tens of
            // megabytes) would not.
            let probs: Vec<Result<Vec<Tensor>>> = group
                .par_iter()
                .map(|&i| {
                    let input = line_input(&crops[i], width);
                    self.net
                        .net
                        .run(Tensor::F32(input, vec![1, 3, LINE_HEIGHT, width]))
                })
                .collect();
            for (&i, y) in group.iter().zip(probs) {
                out[i] = self.decode(&y?[0])?;
            }
        }
        Ok(out)
    }

    /// CTC greedy decoding of one line's [1, steps, classes] probabilities.
    pub fn decode(&self, probs: &Tensor) -> Result<(String, f64)> {
        let (data, classes) = match probs {
            Tensor::F32(d, s) if s.len() == 3 && s[2] == self.charset.len() => (d, s[2]),
            t => {
                return Err(Error::format(
                    &self.net.path,
                    format!(
                        "not a CTC recogniser for its {} characters: output shape {:?}",
                        self.charset.len(),
                        t.shape()
                    ),
                ))
            }
        };
        let (mut text, mut confs) = (String::new(), Vec::new());
        let mut prev = usize::MAX;
        for row in data.chunks_exact(classes) {
            let (best, p) = row
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |a, (i, &v)| if v > a.1 { (i, v) } else { a },
                );
            if !p.is_finite() {
                return Err(Error::format(
                    &self.net.path,
                    "the recogniser produced NaN or infinite values (damaged weights?)",
                ));
            }
            if best != prev && best != 0 {
                text.push_str(&self.charset[best]);
                confs.push(p as f64);
            }
            prev = best;
        }
        let score = if confs.is_empty() {
            0.0
        } else {
            confs.iter().sum::<f64>() / confs.len() as f64
        };
        Ok((text, score))
    }
}
