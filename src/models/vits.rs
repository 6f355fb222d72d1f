//! VITS (Kim et al. 2021) as Piper trains and exports it: phoneme ids ->
//! waveform. The voice is Piper's ONNX file; its initialisers keep their
//! PyTorch names (`enc_p.encoder.attn_layers.0.conv_q.weight`, ...), so this
//! is a port of the model that reads its weights out of the file, not an
//! ONNX executor: the graph's ~3,900 nodes are mostly shape arithmetic around
//! a few dozen convolutions, which read more clearly as the modules they came
//! from. Convolution hyper-parameters (kernel, dilation, padding, groups,
//! stride) are read from the graph's `Conv`/`ConvTranspose` nodes, found by
//! their weight or bias name, so nothing about the voice's size is assumed.
//!
//! Inference (`SynthesizerTrn.infer` in Piper's `vits/models.py`):
//! 1. text encoder: embedding * sqrt(hidden), transformer layers with
//!    relative-position self-attention (window 4, keys and values) and a
//!    conv FFN, post-norm; a 1x1 projection gives the prior mean and log-std
//!    per phoneme;
//! 2. stochastic duration predictor run in reverse on noise scaled by
//!    `noise_w`: log-durations -> frames per phoneme = ceil(exp(logw) *
//!    length_scale);
//! 3. the prior expanded to frames, `z_p = m + eps * exp(logs) * noise_scale`;
//! 4. the normalising flow (4 mean-only affine couplings with WaveNet
//!    blocks, channel flips between) run in reverse;
//! 5. the HiFi-GAN generator: conv, then per stage leaky ReLU, transposed
//!    convolution (upsampling) and the average of multi-receptive-field
//!    residual blocks of dilated convolutions; leaky ReLU, conv, tanh.
//!
//! Activations are `[channels, time]` (PyTorch's layout without the batch).

mod gpu;
mod gpu_prior;

pub use gpu::{GpuFlow, GpuGenerator, GpuVoice};
pub use gpu_prior::GpuPrior;

use crate::cpu::{self, Conv1dShape, ConvTranspose1dShape};
use crate::device::DeviceChoice;
use crate::error::{Error, Result};
use crate::formats::onnx::{OnnxGraph, OnnxModel, OnnxNode};
use crate::util::par;
use crate::util::rng::Rng;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `modules.LayerNorm` epsilon.
const LN_EPS: f32 = 1e-5;
/// Leaky ReLU slope inside the generator (`LRELU_SLOPE`).
const LRELU_SLOPE: f32 = 0.1;
/// `F.leaky_relu`'s default slope, used once before `conv_post`.
const LRELU_SLOPE_POST: f32 = 0.01;

/// How a voice turns text into phonemes (`phoneme_type` in its config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhonemeType {
    /// espeak-ng's IPA phonemes, sentence by sentence (Piper's default).
    Espeak,
    /// The text's own code points after NFD decomposition, the whole text
    /// as one sentence (Piper's `text`).
    Text,
}

/// What the voice's `.onnx.json` says about synthesis.
#[derive(Clone, Debug)]
pub struct VoiceConfig {
    pub sample_rate: u32,
    pub espeak_voice: String,
    pub phoneme_type: PhonemeType,
    /// 1 for a single-speaker voice.
    pub num_speakers: usize,
    /// `speaker_id_map` as (name, id), sorted by id.
    pub speakers: Vec<(String, u32)>,
    /// The speaker used when none is asked for (`default_speaker_id`, else 0).
    pub default_speaker: u32,
    pub noise_scale: f32,
    pub length_scale: f32,
    pub noise_w: f32,
    /// The whole parsed config (phoneme maps are read from it).
    pub json: serde_json::Value,
    pub path: PathBuf,
}

impl VoiceConfig {
    pub fn open(path: &Path) -> Result<VoiceConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::format(path, format!("not JSON: {e}")))?;
        let bad = |what: &str| Error::format(path, what.to_string());
        let phoneme_type = match json.get("phoneme_type") {
            None => PhonemeType::Espeak,
            Some(v) => match v.as_str() {
                Some("espeak") => PhonemeType::Espeak,
                Some("text") => PhonemeType::Text,
                // Piper's other types need its own phonemizers (g2pW,
                // Nakdimon, OpenJTalk, TLTK), which espeak-ng does not replace.
                Some(t @ ("pinyin" | "hebrew" | "japanese" | "thai")) => {
                    return Err(Error::unsupported(
                        path,
                        format!(
                            "phoneme_type '{t}' (Piper phonemizes it with its own model, not \
                             espeak-ng; this engine reads 'espeak' and 'text' voices; \
                             --phoneme-ids still works)"
                        ),
                    ))
                }
                _ => {
                    return Err(bad(&format!(
                        "unknown phoneme_type {v} (Piper's are espeak, text, pinyin, hebrew, \
                         japanese, thai)"
                    )))
                }
            },
        };
        if json.get("vowel_clusters").is_some_and(|v| !v.is_null()) {
            return Err(Error::unsupported(path, "vowel_clusters"));
        }
        let num_speakers = match json.get("num_speakers") {
            None => 1,
            Some(v) => v
                .as_u64()
                .filter(|&n| (1..=1_000_000).contains(&n))
                .ok_or_else(|| bad("num_speakers is not a count from 1 to 1000000"))?
                as usize,
        };
        let mut speakers = Vec::new();
        if let Some(map) = json.get("speaker_id_map").filter(|v| !v.is_null()) {
            let map = map
                .as_object()
                .ok_or_else(|| bad("speaker_id_map is not an object"))?;
            for (name, id) in map {
                let id = id
                    .as_u64()
                    .filter(|&i| i < num_speakers as u64)
                    .ok_or_else(|| {
                        bad(&format!(
                            "speaker_id_map: '{name}' has id {id}, not one of the voice's \
                             {num_speakers} speakers"
                        ))
                    })?;
                speakers.push((name.clone(), id as u32));
            }
        }
        speakers.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        let default_speaker = match json.get("default_speaker_id") {
            None => 0,
            Some(v) => v
                .as_u64()
                .filter(|&i| i < num_speakers as u64)
                .ok_or_else(|| bad("default_speaker_id is not one of the voice's speakers"))?
                as u32,
        };
        let sample_rate = json
            .pointer("/audio/sample_rate")
            .and_then(|v| v.as_u64())
            .filter(|&r| (1000..=192_000).contains(&r))
            .ok_or_else(|| bad("audio.sample_rate is missing or out of range"))?
            as u32;
        let espeak_voice = match json.pointer("/espeak/voice").and_then(|v| v.as_str()) {
            Some(v) => v.to_string(),
            // A `text` voice does not call espeak-ng.
            None if phoneme_type == PhonemeType::Text => String::new(),
            None => return Err(bad("espeak.voice is missing")),
        };
        let scale = |key: &str, default: f32| -> Result<f32> {
            match json.pointer(&format!("/inference/{key}")) {
                None => Ok(default),
                Some(v) => v
                    .as_f64()
                    .map(|v| v as f32)
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| bad(&format!("inference.{key} is not a number"))),
            }
        };
        // Piper's defaults when the config does not say.
        Ok(VoiceConfig {
            sample_rate,
            espeak_voice,
            phoneme_type,
            num_speakers,
            speakers,
            default_speaker,
            noise_scale: scale("noise_scale", 0.667)?,
            length_scale: scale("length_scale", 1.0)?,
            noise_w: scale("noise_w", 0.8)?,
            json,
            path: path.to_path_buf(),
        })
    }
}

impl VoiceConfig {
    /// A speaker named on the command line: a name from `speaker_id_map`, or
    /// an id below `num_speakers`.
    pub fn speaker(&self, name_or_id: &str) -> Result<u32> {
        if let Some((_, id)) = self.speakers.iter().find(|(n, _)| n == name_or_id) {
            return Ok(*id);
        }
        if let Ok(id) = name_or_id.trim().parse::<u64>() {
            if id < self.num_speakers as u64 {
                return Ok(id as u32);
            }
        }
        let known = if self.num_speakers == 1 {
            "it has one speaker, 0".to_string()
        } else if self.speakers.is_empty() {
            format!("its speakers are ids 0 to {}", self.num_speakers - 1)
        } else {
            let names: Vec<&str> = self
                .speakers
                .iter()
                .take(10)
                .map(|(n, _)| n.as_str())
                .collect();
            format!(
                "its speakers are ids 0 to {} or names such as {}{} (--list-speakers)",
                self.num_speakers - 1,
                names.join(", "),
                if self.speakers.len() > 10 {
                    ", ..."
                } else {
                    ""
                }
            )
        };
        Err(Error::invalid(format!(
            "{}: no speaker '{name_or_id}': {known}",
            self.path.display()
        )))
    }
}

/// A convolution read from the graph: weights and the node's hyper-parameters.
#[derive(Clone, Debug)]
pub struct Conv {
    pub w: Vec<f32>,
    pub b: Option<Vec<f32>>,
    pub shape: Conv1dShape,
    /// w in the CPU tile's order, made on the first CPU call (groups 1).
    packed: OnceLock<cpu::PackedConv1d>,
}

impl Conv {
    fn new(w: Vec<f32>, b: Option<Vec<f32>>, shape: Conv1dShape) -> Conv {
        Conv {
            w,
            b,
            shape,
            packed: OnceLock::new(),
        }
    }

    fn packed(&self) -> &cpu::PackedConv1d {
        self.packed
            .get_or_init(|| cpu::PackedConv1d::new(&self.w, &self.shape))
    }

    /// x: [c_in, t] -> [c_out, t_out]
    pub fn forward(&self, x: &[f32], t: usize) -> Vec<f32> {
        if self.shape.groups != 1 {
            let mut y = vec![0.0; self.shape.c_out * self.shape.t_out(t)];
            cpu::conv1d(x, t, &self.w, self.b.as_deref(), &self.shape, &mut y);
            return y;
        }
        self.forward_into(x, t, None)
    }

    /// conv(leaky_relu(x, slope)), the activation fused into the
    /// convolution's input copy (groups 1).
    pub fn forward_act(&self, x: &[f32], t: usize, slope: f32) -> Vec<f32> {
        self.forward_into(x, t, Some(slope))
    }

    fn forward_into(&self, x: &[f32], t: usize, act: Option<f32>) -> Vec<f32> {
        let t_out = self.shape.t_out(t);
        let mut y = vec![0.0; self.shape.c_out * t_out];
        let layout = cpu::OutLayout {
            row: t_out,
            step: 1,
            offset: 0,
            count: t_out,
        };
        let (w, b) = (self.packed(), self.b.as_deref());
        cpu::conv1d_into(x, t, w, b, &self.shape, act, &mut y, layout);
        y
    }

    /// y = x + conv(leaky_relu(x, slope)) (HiFi-GAN's residual step).
    pub fn residual(&self, x: &[f32], t: usize, slope: f32, y: &mut [f32]) {
        let (w, b) = (self.packed(), self.b.as_deref());
        cpu::conv1d_residual(x, t, w, b, &self.shape, slope, y);
    }
}

/// A transposed convolution read from the graph.
#[derive(Clone, Debug)]
pub struct ConvT {
    pub w: Vec<f32>,
    pub b: Option<Vec<f32>>,
    pub shape: ConvTranspose1dShape,
    /// The same weights as one convolution per output phase (empty: the
    /// plain gather of `cpu::conv_transpose1d`).
    phases: Vec<Phase>,
}

/// One output phase of a transposed convolution as a plain convolution:
/// the outputs p = m * stride + r are reached only by the taps k = k0 +
/// j * stride, from inputs m + q - j (`ConvT::phases`).
#[derive(Clone, Debug)]
struct Phase {
    /// The weights [c_out, c_in, taps] (taps in reverse order of j),
    /// packed for the CPU tile.
    packed: cpu::PackedConv1d,
    taps: usize,
    /// How many inputs before m the first (reversed) tap reads.
    pad_left: usize,
}

impl ConvT {
    fn new(w: Vec<f32>, b: Option<Vec<f32>>, shape: ConvTranspose1dShape) -> ConvT {
        let phases = Self::split_phases(&w, &shape).unwrap_or_default();
        ConvT {
            w,
            b,
            shape,
            phases,
        }
    }

    /// The stride's phases as convolutions, so the upsampling runs on the
    /// register-blocked `cpu::conv1d` (the scatter of `cpu::conv_transpose1d`
    /// writes strided rows and vectorises poorly). `None` where a phase would
    /// need an input after the output it feeds (then the plain path runs).
    fn split_phases(w: &[f32], s: &ConvTranspose1dShape) -> Option<Vec<Phase>> {
        let (c_in, c_out, k, st) = (s.c_in, s.c_out, s.kernel, s.stride);
        let mut phases = Vec::with_capacity(st);
        for r in 0..st {
            let k0 = (r + s.pad) % st;
            let q = (r + s.pad) / st;
            let taps = k.saturating_sub(k0).div_ceil(st);
            if taps == 0 || q > taps - 1 {
                return None;
            }
            let mut pw = vec![0.0f32; c_out * c_in * taps];
            for o in 0..c_out {
                for i in 0..c_in {
                    for j in 0..taps {
                        pw[(o * c_in + i) * taps + (taps - 1 - j)] =
                            w[(i * c_out + o) * k + k0 + j * st];
                    }
                }
            }
            let shape = Conv1dShape {
                c_in,
                c_out,
                kernel: taps,
                dilation: 1,
                pad_left: 0,
                pad_right: 0,
                groups: 1,
            };
            phases.push(Phase {
                packed: cpu::PackedConv1d::new(&pw, &shape),
                taps,
                pad_left: taps - 1 - q,
            });
        }
        Some(phases)
    }

    pub fn forward(&self, x: &[f32], t: usize) -> Vec<f32> {
        self.forward_impl(x, t, None)
    }

    /// The transposed convolution of leaky_relu(x, slope), the activation
    /// fused into the input copies.
    pub fn forward_act(&self, x: &[f32], t: usize, slope: f32) -> Vec<f32> {
        self.forward_impl(x, t, Some(slope))
    }

    fn forward_impl(&self, x: &[f32], t: usize, act: Option<f32>) -> Vec<f32> {
        let s = &self.shape;
        let t_out = s.t_out(t);
        let mut y = vec![0.0; s.c_out * t_out];
        if self.phases.is_empty() || t == 0 {
            let mut xa;
            let x = match act {
                Some(slope) => {
                    xa = x.to_vec();
                    cpu::leaky_relu(&mut xa, slope);
                    &xa[..]
                }
                None => x,
            };
            cpu::conv_transpose1d(x, t, &self.w, self.b.as_deref(), s, &mut y);
            return y;
        }
        for (r, ph) in self.phases.iter().enumerate() {
            // Outputs r, r + stride, ... below t_out, written in place.
            let m = t_out.saturating_sub(r).div_ceil(s.stride);
            if m == 0 {
                continue;
            }
            let pad_right = (m + ph.taps - 1).saturating_sub(t + ph.pad_left);
            let shape = Conv1dShape {
                c_in: s.c_in,
                c_out: s.c_out,
                kernel: ph.taps,
                dilation: 1,
                pad_left: ph.pad_left,
                pad_right,
                groups: 1,
            };
            let layout = cpu::OutLayout {
                row: t_out,
                step: s.stride,
                offset: r,
                count: m,
            };
            cpu::conv1d_into(
                x,
                t,
                &ph.packed,
                self.b.as_deref(),
                &shape,
                act,
                &mut y,
                layout,
            );
        }
        y
    }
}

/// Reads tensors and convolution nodes out of the ONNX graph by name.
struct Loader<'a> {
    path: &'a Path,
    graph: &'a OnnxGraph,
    /// Weight or bias name -> the Conv / ConvTranspose node that uses it.
    conv_by_input: HashMap<&'a str, &'a OnnxNode>,
}

impl<'a> Loader<'a> {
    fn new(path: &'a Path, graph: &'a OnnxGraph) -> Self {
        let mut conv_by_input = HashMap::new();
        for n in &graph.nodes {
            if n.op_type == "Conv" || n.op_type == "ConvTranspose" {
                for i in n.inputs.iter().skip(1) {
                    conv_by_input.insert(i.as_str(), n);
                }
            }
        }
        Loader {
            path,
            graph,
            conv_by_input,
        }
    }

    fn missing(&self, name: &str) -> Error {
        Error::format(
            self.path,
            format!("no tensor '{name}' (not a Piper VITS voice?)"),
        )
    }

    fn has(&self, name: &str) -> bool {
        self.graph.constant(name).is_some()
    }

    /// A float tensor and its dims.
    fn tensor(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let t = self
            .graph
            .constant(name)
            .ok_or_else(|| self.missing(name))?;
        let dims = t.dims.iter().map(|&d| d as usize).collect();
        Ok((t.to_f32()?, dims))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let (v, _) = self.tensor(name)?;
        if v.len() != len {
            return Err(Error::format(
                self.path,
                format!("tensor '{name}' has {} values, expected {len}", v.len()),
            ));
        }
        Ok(v)
    }

    /// The node using `key` (a weight or bias name) as an input.
    fn node(&self, key: &str, op: &str) -> Result<&'a OnnxNode> {
        match self.conv_by_input.get(key) {
            Some(n) if n.op_type == op => Ok(n),
            _ => Err(Error::format(
                self.path,
                format!("no {op} node using '{key}'"),
            )),
        }
    }

    /// A `Conv` found by `key`, its weight or bias name (exports that fold
    /// weight norm give the weight a generated name, but keep the bias's).
    fn conv(&self, key: &str) -> Result<Conv> {
        let n = self.node(key, "Conv")?;
        let (w, dims) = self.tensor(&n.inputs[1])?;
        let b = match n.inputs.get(2).filter(|s| !s.is_empty()) {
            Some(name) => Some(self.tensor(name)?.0),
            None => None,
        };
        if dims.len() != 3 {
            return Err(n.error(format!("weight has shape {dims:?}, expected [out, in, k]")));
        }
        let groups = n.int_or("group", 1)? as usize;
        let dilations = n.ints_or("dilations", &[1])?;
        let dilation = dilations.first().copied().unwrap_or(1);
        let pads = n.ints_or("pads", &[0, 0])?;
        let strides = n.ints_or("strides", &[1])?;
        if dilations.len() != 1 || dilation < 1 || n.attr("auto_pad").is_some() {
            return Err(n.unsupported(format!("Conv dilations {dilations:?} / auto_pad")));
        }
        if strides.iter().any(|&s| s != 1) {
            return Err(n.unsupported("strided Conv"));
        }
        let (pad_left, pad_right) = match pads.as_slice() {
            [] => (0, 0),
            [l, r] if *l >= 0 && *r >= 0 => (*l as usize, *r as usize),
            other => return Err(n.error(format!("pads {other:?}"))),
        };
        let shape = Conv1dShape {
            c_in: dims[1] * groups,
            c_out: dims[0],
            kernel: dims[2],
            dilation: dilation as usize,
            pad_left,
            pad_right,
            groups: groups.max(1),
        };
        if b.as_ref().is_some_and(|b| b.len() != shape.c_out)
            || dims[2] == 0
            || dims[0] % shape.groups != 0
        {
            return Err(n.error("bias or weight shape is inconsistent"));
        }
        Ok(Conv::new(w, b, shape))
    }

    /// A Conv whose padding the module applies itself (an explicit `Pad`
    /// before the node), e.g. the FFN's "same" padding.
    fn conv_padded(&self, key: &str, pad_left: usize, pad_right: usize) -> Result<Conv> {
        let mut c = self.conv(key)?;
        if c.shape.pad_left != 0 || c.shape.pad_right != 0 {
            return Err(Error::format(
                self.path,
                format!("Conv using '{key}' already pads"),
            ));
        }
        c.shape.pad_left = pad_left;
        c.shape.pad_right = pad_right;
        Ok(c)
    }

    fn conv_transpose(&self, weight: &str) -> Result<ConvT> {
        let n = self.node(weight, "ConvTranspose")?;
        let (w, dims) = self.tensor(weight)?;
        let b = match n.inputs.get(2).filter(|s| !s.is_empty()) {
            Some(name) => Some(self.tensor(name)?.0),
            None => None,
        };
        if dims.len() != 3 || n.int_or("group", 1)? != 1 {
            return Err(n.unsupported(format!("ConvTranspose weight {dims:?} / groups")));
        }
        let stride = n.ints_or("strides", &[1])?.first().copied().unwrap_or(1);
        let pads = n.ints_or("pads", &[0, 0])?;
        let pad = pads.first().copied().unwrap_or(0);
        if pads.iter().any(|&p| p != pad)
            || stride < 1
            || pad < 0
            || n.attr("output_padding").is_some()
        {
            return Err(n.unsupported(format!("ConvTranspose pads {pads:?} stride {stride}")));
        }
        if n.ints_or("dilations", &[1])?.iter().any(|&d| d != 1) {
            return Err(n.unsupported("dilated ConvTranspose"));
        }
        let shape = ConvTranspose1dShape {
            c_in: dims[0],
            c_out: dims[1],
            kernel: dims[2],
            stride: stride as usize,
            pad: pad as usize,
        };
        if b.as_ref().is_some_and(|b| b.len() != shape.c_out) {
            return Err(n.error("bias shape"));
        }
        Ok(ConvT::new(w, b, shape))
    }

    fn layer_norm(&self, prefix: &str, c: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            gamma: self.vector(&format!("{prefix}.gamma"), c)?,
            beta: self.vector(&format!("{prefix}.beta"), c)?,
        })
    }

    /// How many `{prefix}{i}{suffix}` tensors exist for i = 0, step, 2 step, ...
    fn count(&self, prefix: &str, suffix: &str, first: usize, step: usize) -> usize {
        let mut n = 0;
        while self.has(&format!("{prefix}{}{suffix}", first + n * step)) {
            n += 1;
        }
        n
    }
}

/// Layer norm over channels at every time step (`modules.LayerNorm`).
#[derive(Clone, Debug)]
struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

impl LayerNorm {
    /// x: [c, t] -> act(norm(x)) + res, with GELU as act when `gelu`.
    fn forward(&self, x: &[f32], t: usize, gelu: bool, res: Option<&[f32]>) -> Vec<f32> {
        let mut y = vec![0.0; x.len()];
        cpu::layer_norm_channels(x, &self.gamma, &self.beta, LN_EPS, t, gelu, res, &mut y);
        y
    }
}

/// [rows, cols] -> [cols, rows]
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            y[c * rows + r] = x[r * cols + c];
        }
    }
    y
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    cpu::add_assign(x, y);
}

/// The chunk of a long elementwise pass of the generator one thread takes
/// at a time.
const PASS_CHUNK: usize = 1 << 14;

/// Multi-head self-attention with relative-position keys and values shared
/// by all heads (`attentions.MultiHeadAttention`, window_size set).
#[derive(Clone, Debug)]
struct Attention {
    q: Conv,
    k: Conv,
    v: Conv,
    o: Conv,
    /// [2 window + 1, k_channels]
    rel_k: Vec<f32>,
    rel_v: Vec<f32>,
    window: usize,
    k_channels: usize,
}

impl Attention {
    /// x: [c, t] -> [c, t]
    fn forward(&self, x: &[f32], t: usize) -> Vec<f32> {
        let c = self.q.shape.c_out;
        let heads = c / self.k_channels;
        let (q, k, v) = (
            transpose(&self.q.forward(x, t), c, t),
            transpose(&self.k.forward(x, t), c, t),
            transpose(&self.v.forward(x, t), c, t),
        );
        let out = cpu::rel_position_attention(&q, &k, &v, &self.rel_k, &self.rel_v, heads, t);
        self.o.forward(&transpose(&out, t, c), t)
    }
}

#[derive(Clone, Debug)]
struct EncoderLayer {
    attn: Attention,
    norm1: LayerNorm,
    ffn1: Conv,
    ffn2: Conv,
    norm2: LayerNorm,
}

/// `models.TextEncoder`: ids -> (hidden x, prior mean m, prior log-std logs).
#[derive(Clone, Debug)]
struct TextEncoder {
    /// [vocab, hidden]
    emb: Vec<f32>,
    hidden: usize,
    layers: Vec<EncoderLayer>,
    proj: Conv,
}

/// Text encoder outputs, each [channels, phonemes].
pub struct Encoded {
    pub x: Vec<f32>,
    pub m: Vec<f32>,
    pub logs: Vec<f32>,
    pub len: usize,
}

impl TextEncoder {
    fn load(l: &Loader) -> Result<TextEncoder> {
        let (emb, dims) = l.tensor("enc_p.emb.weight").or_else(|_| {
            // Piper's export names the embedding after the Gather that uses it.
            let n = l
                .graph
                .nodes
                .iter()
                .find(|n| n.name == "/enc_p/emb/Gather")
                .ok_or_else(|| l.missing("enc_p.emb.weight"))?;
            l.tensor(&n.inputs[0])
        })?;
        if dims.len() != 2 {
            return Err(Error::format(l.path, format!("embedding shape {dims:?}")));
        }
        let hidden = dims[1];
        let n_layers = l.count("enc_p.encoder.attn_layers.", ".conv_q.weight", 0, 1);
        if n_layers == 0 {
            return Err(l.missing("enc_p.encoder.attn_layers.0.conv_q.weight"));
        }
        let mut layers = Vec::new();
        for i in 0..n_layers {
            let p = format!("enc_p.encoder.attn_layers.{i}");
            let (rel_k, rk) = l.tensor(&format!("{p}.emb_rel_k"))?;
            let (rel_v, rv) = l.tensor(&format!("{p}.emb_rel_v"))?;
            if rk.len() != 3 || rk[0] != 1 || rk[1] % 2 == 0 || rk != rv || hidden % rk[2] != 0 {
                return Err(Error::format(
                    l.path,
                    format!("{p}.emb_rel_k has shape {rk:?}; expected [1, 2 window + 1, hidden / heads]"),
                ));
            }
            let ffn = format!("enc_p.encoder.ffn_layers.{i}");
            let k1 = l.conv(&format!("{ffn}.conv_1.weight"))?.shape.kernel;
            layers.push(EncoderLayer {
                attn: Attention {
                    q: l.conv(&format!("{p}.conv_q.weight"))?,
                    k: l.conv(&format!("{p}.conv_k.weight"))?,
                    v: l.conv(&format!("{p}.conv_v.weight"))?,
                    o: l.conv(&format!("{p}.conv_o.weight"))?,
                    rel_k,
                    rel_v,
                    window: (rk[1] - 1) / 2,
                    k_channels: rk[2],
                },
                norm1: l.layer_norm(&format!("enc_p.encoder.norm_layers_1.{i}"), hidden)?,
                // "Same" padding, applied by FFN._same_padding.
                ffn1: l.conv_padded(&format!("{ffn}.conv_1.weight"), (k1 - 1) / 2, k1 / 2)?,
                ffn2: l.conv_padded(&format!("{ffn}.conv_2.weight"), (k1 - 1) / 2, k1 / 2)?,
                norm2: l.layer_norm(&format!("enc_p.encoder.norm_layers_2.{i}"), hidden)?,
            });
        }
        Ok(TextEncoder {
            emb,
            hidden,
            layers,
            proj: l.conv("enc_p.proj.weight")?,
        })
    }

    fn vocab(&self) -> usize {
        self.emb.len() / self.hidden
    }

    /// The embeddings' scale, sqrt(hidden).
    fn embed_scale(&self) -> f32 {
        (self.hidden as f32).sqrt()
    }

    /// ids -> their embeddings * sqrt(hidden): [hidden, t].
    fn embed(&self, ids: &[usize]) -> Vec<f32> {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        cpu::embed_channels(&self.emb, self.hidden, &ids, self.embed_scale())
    }

    fn forward(&self, ids: &[usize]) -> Encoded {
        let t = ids.len();
        let mut x = self.embed(ids);
        for layer in &self.layers {
            let y = layer.attn.forward(&x, t);
            add_in_place(&mut x, &y);
            x = layer.norm1.forward(&x, t, false, None);
            let mut y = layer.ffn1.forward(&x, t);
            y.iter_mut().for_each(|v| *v = v.max(0.0));
            let y = layer.ffn2.forward(&y, t);
            add_in_place(&mut x, &y);
            x = layer.norm2.forward(&x, t, false, None);
        }
        let stats = self.proj.forward(&x, t);
        let half = stats.len() / 2;
        Encoded {
            m: stats[..half].to_vec(),
            logs: stats[half..].to_vec(),
            x,
            len: t,
        }
    }
}

/// Dilated depth-separable convolutions (`modules.DDSConv`).
#[derive(Clone, Debug)]
struct DdsConv {
    sep: Vec<Conv>,
    pointwise: Vec<Conv>,
    norms1: Vec<LayerNorm>,
    norms2: Vec<LayerNorm>,
}

impl DdsConv {
    fn load(l: &Loader, prefix: &str, c: usize) -> Result<DdsConv> {
        let n = l.count(&format!("{prefix}.convs_sep."), ".weight", 0, 1);
        let mut d = DdsConv {
            sep: Vec::new(),
            pointwise: Vec::new(),
            norms1: Vec::new(),
            norms2: Vec::new(),
        };
        for i in 0..n {
            d.sep
                .push(l.conv(&format!("{prefix}.convs_sep.{i}.weight"))?);
            d.pointwise
                .push(l.conv(&format!("{prefix}.convs_1x1.{i}.weight"))?);
            d.norms1
                .push(l.layer_norm(&format!("{prefix}.norms_1.{i}"), c)?);
            d.norms2
                .push(l.layer_norm(&format!("{prefix}.norms_2.{i}"), c)?);
        }
        Ok(d)
    }

    /// x: [c, t] in place (masks are all ones for one unpadded sequence).
    fn forward(&self, x: &mut [f32], t: usize) {
        for i in 0..self.sep.len() {
            let y = self.sep[i].forward(x, t);
            let y = self.norms1[i].forward(&y, t, true, None);
            let y = self.pointwise[i].forward(&y, t);
            let y = self.norms2[i].forward(&y, t, true, Some(x));
            x.copy_from_slice(&y);
        }
    }
}

/// A rational-quadratic spline coupling (`modules.ConvFlow`) on 2 channels.
#[derive(Clone, Debug)]
struct ConvFlow {
    pre: Conv,
    dds: DdsConv,
    proj: Conv,
    filter_channels: usize,
}

impl ConvFlow {
    /// What the widths and heights are scaled by (1 / sqrt(filter channels)).
    fn norm(&self) -> f32 {
        1.0 / (self.filter_channels as f32).sqrt()
    }

    /// Inverse transform of z: [2, t] in place, conditioned on g: [c, t].
    fn reverse(&self, z: &mut [f32], g: &[f32], t: usize) {
        let (z0, z1) = z.split_at_mut(t);
        let mut h = self.pre.forward(z0, t);
        add_in_place(&mut h, g);
        self.dds.forward(&mut h, t);
        let h = self.proj.forward(&h, t);
        let x1 = z1.to_vec();
        cpu::spline_inverse_rows(&x1, &h, self.norm(), z1);
    }
}

/// The stochastic duration predictor, reverse direction only.
#[derive(Clone, Debug)]
struct DurationPredictor {
    pre: Conv,
    dds: DdsConv,
    proj: Conv,
    /// Spline flows in the order inference applies them (flows 7, 5, 3).
    flows: Vec<ConvFlow>,
    /// ElementwiseAffine(2): mean and exp(-logs) (folded by the export).
    affine_m: Vec<f32>,
    affine_inv_scale: Vec<f32>,
}

impl DurationPredictor {
    fn load(l: &Loader, hidden: usize) -> Result<DurationPredictor> {
        let filter = l.conv("dp.pre.weight")?.shape.c_out;
        // flows = [affine, (convflow, flip) x n]; inference skips flows.1.
        let n = l.count("dp.flows.", ".pre.weight", 3, 2);
        if n == 0 {
            return Err(l.missing("dp.flows.3.pre.weight"));
        }
        let mut flows = Vec::new();
        for i in (0..n).rev() {
            let p = format!("dp.flows.{}", 3 + 2 * i);
            flows.push(ConvFlow {
                pre: l.conv(&format!("{p}.pre.weight"))?,
                dds: DdsConv::load(l, &format!("{p}.convs"), filter)?,
                proj: l.conv(&format!("{p}.proj.weight"))?,
                filter_channels: filter,
            });
        }
        let affine_m = l.vector("dp.flows.0.m", 2)?;
        // exp(-logs) is what the Mul after (z - m) multiplies by: a constant
        // the export folded, or an Exp of the constant -logs.
        let inv_scale_name = l
            .graph
            .nodes
            .iter()
            .find(|n| n.name == "/dp/flows.0/Mul")
            .and_then(|n| n.inputs.get(1))
            .ok_or_else(|| l.missing("dp.flows.0.logs"))?;
        let affine_inv_scale = if l.has(inv_scale_name) {
            l.vector(inv_scale_name, 2)?
        } else {
            let exp = l
                .graph
                .nodes
                .iter()
                .find(|n| n.op_type == "Exp" && n.outputs.first() == Some(inv_scale_name))
                .and_then(|n| n.inputs.first())
                .ok_or_else(|| l.missing("dp.flows.0.logs"))?;
            l.vector(exp, 2)?.iter().map(|v| v.exp()).collect()
        };
        let pre = l.conv("dp.pre.weight")?;
        if pre.shape.c_in != hidden {
            return Err(Error::format(
                l.path,
                "dp.pre does not take the encoder's channels",
            ));
        }
        Ok(DurationPredictor {
            pre,
            dds: DdsConv::load(l, "dp.convs", filter)?,
            proj: l.conv("dp.proj.weight")?,
            flows,
            affine_m,
            affine_inv_scale,
        })
    }

    /// Log-durations [t] from the encoder's x: [hidden, t] and noise z: [2, t];
    /// `speaker` is the speaker's offset to `pre`'s output ([filter]).
    fn reverse(&self, x: &[f32], t: usize, mut z: Vec<f32>, speaker: Option<&[f32]>) -> Vec<f32> {
        let mut g = self.pre.forward(x, t);
        if let Some(s) = speaker {
            add_per_channel(&mut g, s, t);
        }
        self.dds.forward(&mut g, t);
        let g = self.proj.forward(&g, t);
        for flow in &self.flows {
            // Flip (channel reversal) precedes each spline flow in reverse order.
            let (a, b) = z.split_at_mut(t);
            a.swap_with_slice(b);
            flow.reverse(&mut z, &g, t);
        }
        // The last flip before the affine flow, then the affine flow.
        let (a, b) = z.split_at_mut(t);
        a.swap_with_slice(b);
        for ch in 0..2 {
            for v in &mut z[ch * t..(ch + 1) * t] {
                *v = (*v - self.affine_m[ch]) * self.affine_inv_scale[ch];
            }
        }
        z.truncate(t);
        z
    }
}

/// A mean-only affine coupling with a WaveNet block (`ResidualCouplingLayer`).
#[derive(Clone, Debug)]
struct Coupling {
    pre: Conv,
    in_layers: Vec<Conv>,
    res_skip: Vec<Conv>,
    post: Conv,
}

impl Coupling {
    /// Inverse of the coupling on z: [channels, t] in place; `speaker` is
    /// the speaker's offset to every WaveNet layer's gate input
    /// ([2 hidden * layers], the cond layer's output).
    fn reverse(&self, z: &mut [f32], t: usize, speaker: Option<&[f32]>) {
        let half = self.pre.shape.c_in;
        let hidden = self.pre.shape.c_out;
        let (x0, x1) = z.split_at_mut(half * t);
        let mut h = self.pre.forward(x0, t);
        let mut out = vec![0.0f32; hidden * t];
        let n = self.in_layers.len();
        for (i, (inl, rs)) in self.in_layers.iter().zip(&self.res_skip).enumerate() {
            let x_in = inl.forward(&h, t);
            let mut acts = vec![0.0f32; hidden * t];
            let g = speaker.map(|s| &s[i * 2 * hidden..(i + 1) * 2 * hidden]);
            cpu::wavenet_gate(&x_in, g, hidden, t, &mut acts);
            let r = rs.forward(&acts, t);
            if i + 1 < n {
                add_in_place(&mut h, &r[..hidden * t]);
                add_in_place(&mut out, &r[hidden * t..]);
            } else {
                add_in_place(&mut out, &r);
            }
        }
        let m = self.post.forward(&out, t);
        for (x, m) in x1.iter_mut().zip(&m) {
            *x -= m;
        }
    }
}

/// x: [c, t] += offset[c] at every time step.
fn add_per_channel(x: &mut [f32], offset: &[f32], t: usize) {
    for (row, o) in x.chunks_mut(t).zip(offset) {
        row.iter_mut().for_each(|v| *v += o);
    }
}

/// Reverses the channel order of x: [c, t] (`modules.Flip`).
fn flip_channels(x: &mut [f32], c: usize, t: usize) {
    for i in 0..c / 2 {
        let (a, b) = x.split_at_mut((c - 1 - i) * t);
        a[i * t..(i + 1) * t].swap_with_slice(&mut b[..t]);
    }
}

/// The HiFi-GAN generator (`models.Generator`, ResBlock2).
#[derive(Clone, Debug)]
pub struct Generator {
    pub conv_pre: Conv,
    pub ups: Vec<ConvT>,
    /// `resblocks[stage][kernel]` = the block's dilated convolutions in order.
    pub resblocks: Vec<Vec<Vec<Conv>>>,
    pub conv_post: Conv,
}

impl Generator {
    fn load(l: &Loader) -> Result<Generator> {
        let n_ups = l.count("dec.ups.", ".weight", 0, 1);
        let n_blocks = l.count("dec.resblocks.", ".convs.0.weight", 0, 1);
        if n_ups == 0 || n_blocks == 0 || !n_blocks.is_multiple_of(n_ups) {
            return Err(Error::format(
                l.path,
                "dec.ups / dec.resblocks are missing or uneven",
            ));
        }
        if l.has("dec.resblocks.0.convs1.0.weight") {
            return Err(Error::unsupported(
                l.path,
                "HiFi-GAN ResBlock1 (high-quality voices)",
            ));
        }
        let per_stage = n_blocks / n_ups;
        let mut resblocks = Vec::new();
        for s in 0..n_ups {
            let mut stage = Vec::new();
            for j in 0..per_stage {
                let b = s * per_stage + j;
                let n_convs = l.count(&format!("dec.resblocks.{b}.convs."), ".weight", 0, 1);
                let convs = (0..n_convs)
                    .map(|c| l.conv(&format!("dec.resblocks.{b}.convs.{c}.weight")))
                    .collect::<Result<Vec<_>>>()?;
                stage.push(convs);
            }
            resblocks.push(stage);
        }
        Ok(Generator {
            conv_pre: l.conv("dec.conv_pre.weight")?,
            ups: (0..n_ups)
                .map(|i| l.conv_transpose(&format!("dec.ups.{i}.weight")))
                .collect::<Result<_>>()?,
            resblocks,
            conv_post: l.conv("dec.conv_post.weight")?,
        })
    }

    /// Samples per frame (the product of the upsampling strides).
    pub fn hop(&self) -> usize {
        self.ups.iter().map(|u| u.shape.stride).product()
    }

    /// The length of each upsampling stage's activations ([channels, t])
    /// for `frames` input frames.
    fn stage_sizes(&self, frames: usize) -> Vec<usize> {
        let mut t = frames;
        self.ups
            .iter()
            .map(|up| {
                t = up.shape.t_out(t);
                up.shape.c_out * t
            })
            .collect()
    }

    /// z: [inter_channels, frames] -> audio [frames * hop] in [-1, 1];
    /// `speaker` is the speaker's offset to `conv_pre`'s output.
    pub fn forward(&self, z: &[f32], frames: usize, speaker: Option<&[f32]>) -> Vec<f32> {
        let mut t = frames;
        let mut x = self.conv_pre.forward(z, t);
        if let Some(s) = speaker {
            add_per_channel(&mut x, s, t);
        }
        // The residual steps write two buffers in turn and the blocks'
        // average a third, each sized once for the largest stage and zeroed
        // lazily by the system (a fresh buffer a step costs page faults, a
        // zeroing pass a memory pass on one thread).
        let size = self.stage_sizes(frames).into_iter().max().unwrap_or(0);
        let [mut cur, mut next, mut sum] = [(); 3].map(|_| vec![0.0f32; size]);
        let mut stage_out: Option<usize> = None;
        for (up, blocks) in self.ups.iter().zip(&self.resblocks) {
            let input = match stage_out {
                Some(n) => &sum[..n],
                None => &x[..],
            };
            let up_x = up.forward_act(input, t, LRELU_SLOPE);
            t = up.shape.t_out(t);
            let n = up_x.len();
            // The blocks' average.
            let k = blocks.len() as f32;
            for (j, convs) in blocks.iter().enumerate() {
                let mut src: &[f32] = &up_x;
                for c in convs {
                    c.residual(src, t, LRELU_SLOPE, &mut next[..n]);
                    std::mem::swap(&mut cur, &mut next);
                    src = &cur[..n];
                }
                // (A single block is its own average: x / 1 is x.)
                let last = j + 1 == blocks.len();
                if j == 0 {
                    std::mem::swap(&mut sum, &mut cur);
                } else {
                    sum[..n]
                        .par_chunks_mut(PASS_CHUNK)
                        .zip(cur[..n].par_chunks(PASS_CHUNK))
                        .for_each(|(s, b)| {
                            for (s, &b) in s.iter_mut().zip(b) {
                                *s += b;
                                if last {
                                    *s /= k;
                                }
                            }
                        });
                }
            }
            stage_out = Some(n);
        }
        let x = match stage_out {
            Some(n) => &sum[..n],
            None => &x[..],
        };
        let mut y = self.conv_post.forward_act(x, t, LRELU_SLOPE_POST);
        y.par_chunks_mut(PASS_CHUNK)
            .for_each(|c| c.iter_mut().for_each(|v| *v = v.tanh()));
        y
    }
}

/// Synthesis settings (Piper's `scales` input).
#[derive(Clone, Copy, Debug)]
pub struct Scales {
    /// Noise added to the prior before the flow.
    pub noise_scale: f32,
    /// Multiplies every phoneme's duration (> 1 is slower).
    pub length_scale: f32,
    /// Noise fed to the duration predictor.
    pub noise_w: f32,
}

/// A Piper VITS voice.
pub struct Vits {
    pub config: VoiceConfig,
    enc: TextEncoder,
    dp: DurationPredictor,
    /// Couplings in file order (flows 0, 2, 4, 6); reverse runs them backwards.
    flows: Vec<Coupling>,
    pub dec: Generator,
    inter_channels: usize,
    speakers: Option<SpeakerCond>,
}

/// A multi-speaker voice's speaker embeddings (`emb_g`) and the 1x1
/// convolutions that condition the duration predictor, the flow's WaveNet
/// layers and the decoder on them (`dp.cond`, `flow.flows.N.enc.cond_layer`,
/// `dec.cond`). Piper's text encoder takes no speaker.
struct SpeakerCond {
    /// [speakers, gin]
    emb: Vec<f32>,
    gin: usize,
    dp: Conv,
    /// Per coupling, in file order.
    flows: Vec<Conv>,
    dec: Conv,
}

/// What one speaker adds. The embedding is constant in time, so each
/// conditioning convolution's output is a per-channel offset, added where
/// Piper's graph adds it.
#[derive(Clone, Debug)]
pub struct SpeakerOffsets {
    /// To `dp.pre`'s output.
    dp: Vec<f32>,
    /// Per coupling (file order): to the WaveNet layers' gate inputs.
    flows: Vec<Vec<f32>>,
    /// To `dec.conv_pre`'s output.
    pub dec: Vec<f32>,
}

impl SpeakerCond {
    fn load(
        l: &Loader,
        config: &VoiceConfig,
        dp: &DurationPredictor,
        flows: &[Coupling],
        dec: &Generator,
    ) -> Result<Option<SpeakerCond>> {
        if !l.has("emb_g.weight") {
            if config.num_speakers > 1 {
                return Err(Error::format(
                    &config.path,
                    format!(
                        "says {} speakers, but the graph has no speaker embedding (emb_g)",
                        config.num_speakers
                    ),
                ));
            }
            return Ok(None);
        }
        let (emb, dims) = l.tensor("emb_g.weight")?;
        if dims.len() != 2 || dims[0] == 0 || dims[1] == 0 {
            return Err(Error::format(
                l.path,
                format!("emb_g.weight has shape {dims:?}"),
            ));
        }
        if dims[0] != config.num_speakers {
            return Err(Error::format(
                &config.path,
                format!(
                    "num_speakers is {}, but the graph's speaker embedding has {}",
                    config.num_speakers, dims[0]
                ),
            ));
        }
        let gin = dims[1];
        let cond = SpeakerCond {
            emb,
            gin,
            dp: l.conv("dp.cond.bias")?,
            flows: (0..flows.len())
                .map(|i| l.conv(&format!("flow.flows.{}.enc.cond_layer.bias", 2 * i)))
                .collect::<Result<_>>()?,
            dec: l.conv("dec.cond.bias")?,
        };
        let fits = |c: &Conv, c_out: usize| {
            c.shape.c_in == gin && c.shape.kernel == 1 && c.shape.c_out == c_out
        };
        let flows_fit = cond
            .flows
            .iter()
            .zip(flows)
            .all(|(c, f)| fits(c, f.in_layers.iter().map(|l| l.shape.c_out).sum()));
        if !fits(&cond.dp, dp.pre.shape.c_out)
            || !flows_fit
            || !fits(&cond.dec, dec.conv_pre.shape.c_out)
        {
            return Err(Error::format(
                l.path,
                "speaker conditioning layers do not fit the embedding or the layers they condition",
            ));
        }
        Ok(Some(cond))
    }

    fn offsets(&self, speaker: usize) -> SpeakerOffsets {
        let g = &self.emb[speaker * self.gin..(speaker + 1) * self.gin];
        SpeakerOffsets {
            dp: self.dp.forward(g, 1),
            flows: self.flows.iter().map(|c| c.forward(g, 1)).collect(),
            dec: self.dec.forward(g, 1),
        }
    }
}

/// The duration predictor's noise, [2, t] standard normal * noise_w: the
/// first draws of a sentence.
fn duration_noise(t: usize, scales: &Scales, rng: &mut Rng) -> Vec<f32> {
    rng.normals(2 * t)
        .into_iter()
        .map(|v| v * scales.noise_w)
        .collect()
}

/// The most frames a sentence may last (12 minutes of a 22050 Hz voice
/// with 256 samples a frame); a longer one is refused, not allocated.
pub const MAX_SENTENCE_FRAMES: usize = 1 << 16;

/// A sentence's frames from its durations, or the error for one past
/// `max` frames (`max_what` says whose limit).
fn sentence_frames(durations: &[u32], max: usize, max_what: &str) -> Result<usize> {
    let total: u64 = durations.iter().map(|&d| d as u64).sum();
    if total > max as u64 {
        return Err(too_many_frames(durations.len(), total, max, max_what));
    }
    Ok(total as usize)
}

fn too_many_frames(ids: usize, frames: u64, max: usize, max_what: &str) -> Error {
    Error::invalid(format!(
        "a sentence of {ids} phoneme ids would last {frames} frames, more than the {max} \
         {max_what} takes; split the text into shorter sentences"
    ))
}

/// Each frame's phoneme and the prior's standard normal noise, [c,
/// frames], drawn after the duration noise in z's order. A sentence whose
/// phonemes all last 0 frames still gets one frame (of a zero prior).
fn prior_noise(durations: &[u32], c: usize, rng: &mut Rng) -> (Vec<u32>, Vec<f32>) {
    let idx = cpu::frame_phonemes(durations);
    let noise = rng.normals(c * idx.len().max(1));
    (idx, noise)
}

/// The one frame of a sentence without frames: mean 0, log-std 0.
fn no_frames_prior(noise: &[f32], noise_scale: f32) -> Vec<f32> {
    noise.iter().map(|n| 0.0 + n * noise_scale).collect()
}

/// The latent a voice decodes, with what produced it.
pub struct Latent {
    /// [inter_channels, frames]
    pub z: Vec<f32>,
    pub frames: usize,
    /// Frames per phoneme id.
    pub durations: Vec<usize>,
}

impl Vits {
    /// Opens `model.onnx` and its `model.onnx.json`.
    pub fn open(onnx_path: &Path) -> Result<Vits> {
        let mut json = onnx_path.as_os_str().to_owned();
        json.push(".json");
        let config = VoiceConfig::open(Path::new(&json))?;
        Vits::open_with_config(onnx_path, config)
    }

    /// Opens `model.onnx` with its config already read.
    pub fn open_with_config(onnx_path: &Path, config: VoiceConfig) -> Result<Vits> {
        let model = OnnxModel::open(onnx_path)?;
        Vits::from_onnx(&model, config)
    }

    pub fn from_onnx(model: &OnnxModel, config: VoiceConfig) -> Result<Vits> {
        let l = Loader::new(&model.path, &model.graph);
        let enc = TextEncoder::load(&l)?;
        let dp = DurationPredictor::load(&l, enc.hidden)?;
        let n_flows = l.count("flow.flows.", ".pre.weight", 0, 2);
        if n_flows == 0 {
            return Err(l.missing("flow.flows.0.pre.weight"));
        }
        let mut flows = Vec::new();
        for i in 0..n_flows {
            let p = format!("flow.flows.{}", 2 * i);
            let n_layers = l.count(&format!("{p}.enc.in_layers."), ".bias", 0, 1);
            flows.push(Coupling {
                pre: l.conv(&format!("{p}.pre.weight"))?,
                in_layers: (0..n_layers)
                    .map(|j| l.conv(&format!("{p}.enc.in_layers.{j}.bias")))
                    .collect::<Result<_>>()?,
                res_skip: (0..n_layers)
                    .map(|j| l.conv(&format!("{p}.enc.res_skip_layers.{j}.bias")))
                    .collect::<Result<_>>()?,
                post: l.conv(&format!("{p}.post.weight"))?,
            });
        }
        let inter_channels = 2 * flows[0].pre.shape.c_in;
        let dec = Generator::load(&l)?;
        let speakers = SpeakerCond::load(&l, &config, &dp, &flows, &dec)?;
        if enc.proj.shape.c_out != 2 * inter_channels || dec.conv_pre.shape.c_in != inter_channels {
            return Err(Error::format(
                &model.path,
                "encoder, flow and decoder channels disagree",
            ));
        }
        Ok(Vits {
            config,
            enc,
            dp,
            flows,
            dec,
            inter_channels,
            speakers,
        })
    }

    /// How many speakers the graph has (1 without a speaker embedding).
    pub fn num_speakers(&self) -> usize {
        self.speakers.as_ref().map_or(1, |s| s.emb.len() / s.gin)
    }

    /// Speaker `speaker`'s offsets; `None` for a single-speaker voice
    /// (whose only speaker is 0).
    pub fn speaker_offsets(&self, speaker: u32) -> Result<Option<SpeakerOffsets>> {
        let n = self.num_speakers();
        if speaker as usize >= n {
            return Err(Error::invalid(format!(
                "speaker {speaker} is not one of the voice's {n} (ids 0 to {})",
                n - 1
            )));
        }
        Ok(self.speakers.as_ref().map(|s| s.offsets(speaker as usize)))
    }

    pub fn vocab(&self) -> usize {
        self.enc.vocab()
    }

    pub fn inter_channels(&self) -> usize {
        self.inter_channels
    }

    /// The ids as rows of the embedding, or an error naming the first one
    /// outside the voice's symbols.
    fn check_ids(&self, ids: &[i64]) -> Result<Vec<usize>> {
        if ids.is_empty() {
            return Err(Error::invalid("no phoneme ids to synthesise"));
        }
        let vocab = self.vocab();
        ids.iter()
            .map(|&id| {
                usize::try_from(id)
                    .ok()
                    .filter(|&i| i < vocab)
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "phoneme id {id} is outside the voice's {vocab} symbols"
                        ))
                    })
            })
            .collect()
    }

    /// The first half of [`Vits::prior`]: the text encoder's statistics
    /// ([2 inter_channels, t]: the prior's mean, then its log-std) and the
    /// duration predictor's log-durations [t] on duration noise `noise`
    /// ([2, t], standard normal * noise_w).
    pub fn encode(
        &self,
        ids: &[i64],
        speaker: Option<&SpeakerOffsets>,
        noise: Vec<f32>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let ids = self.check_ids(ids)?;
        let t = ids.len();
        assert_eq!(noise.len(), 2 * t, "Vits::encode: noise shape");
        let enc = self.enc.forward(&ids);
        let logw = self
            .dp
            .reverse(&enc.x, t, noise, speaker.map(|s| s.dp.as_slice()));
        Ok(([enc.m, enc.logs].concat(), logw))
    }

    /// Phoneme ids -> the prior sample z_p ([inter_channels, frames]) the
    /// flow starts from: text encoder, duration predictor, length
    /// regulation, noise. Noise is drawn from `rng` (duration noise first,
    /// then the prior's), so a seed fixes the result.
    pub fn prior(
        &self,
        ids: &[i64],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
    ) -> Result<Latent> {
        let t = self.check_ids(ids)?.len();
        let (stats, logw) = self.encode(ids, speaker, duration_noise(t, scales, rng))?;
        let durations = cpu::durations(&logw, scales.length_scale);
        sentence_frames(&durations, MAX_SENTENCE_FRAMES, "the voice")?;
        let (idx, noise) = prior_noise(&durations, self.inter_channels, rng);
        let z = if idx.is_empty() {
            no_frames_prior(&noise, scales.noise_scale)
        } else {
            cpu::expand_prior(&stats, t, &idx, &noise, scales.noise_scale)
        };
        let frames = idx.len().max(1);
        Ok(Latent {
            z,
            frames,
            durations: durations.iter().map(|&d| d as usize).collect(),
        })
    }

    /// The normalising flow in reverse on z: [inter_channels, frames] in
    /// place (z_p -> the decoder's input).
    pub fn flow_reverse(&self, z: &mut [f32], frames: usize, speaker: Option<&SpeakerOffsets>) {
        for (i, flow) in self.flows.iter().enumerate().rev() {
            flip_channels(z, self.inter_channels, frames);
            flow.reverse(z, frames, speaker.map(|s| s.flows[i].as_slice()));
        }
    }

    /// Phoneme ids -> the latent the decoder turns into audio: the prior
    /// ([`Vits::prior`]) through the flow.
    pub fn latent(
        &self,
        ids: &[i64],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
    ) -> Result<Latent> {
        let mut lat = self.prior(ids, speaker, scales, rng)?;
        self.flow_reverse(&mut lat.z, lat.frames, speaker);
        Ok(lat)
    }

    /// Phoneme ids -> audio samples in [-1, 1] at the voice's rate (CPU).
    pub fn synthesize(
        &self,
        ids: &[i64],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
    ) -> Result<Vec<f32>> {
        let lat = self.latent(ids, speaker, scales, rng)?;
        Ok(self
            .dec
            .forward(&lat.z, lat.frames, speaker.map(|s| s.dec.as_slice())))
    }
}

/// A voice on the device the user chose: the CPU reference, or the whole
/// graph on the GPU.
pub enum Synthesizer {
    Cpu(Vits),
    Gpu(Vits, Box<GpuVoice>),
}

impl Synthesizer {
    /// Opens `device`; without an explicit GPU request, a machine with no
    /// usable adapter falls back to the CPU (see [`DeviceChoice::build`]).
    pub fn new(vits: Vits, device: &DeviceChoice) -> Result<Synthesizer> {
        let (dec, _) = device.build(|| Ok(None), |g| Ok(Some(GpuVoice::new(g, &vits)?)))?;
        Ok(match dec {
            Some(dec) => Synthesizer::Gpu(vits, Box::new(dec)),
            None => Synthesizer::Cpu(vits),
        })
    }

    pub fn vits(&self) -> &Vits {
        match self {
            Synthesizer::Cpu(v) | Synthesizer::Gpu(v, _) => v,
        }
    }

    pub fn backend_name(&self) -> String {
        match self {
            Synthesizer::Cpu(_) => "cpu".to_string(),
            Synthesizer::Gpu(_, g) => format!("gpu ({})", g.gpu().info.name),
        }
    }

    /// Speaks `sentences` (phoneme ids) in order in the voice of `speaker`
    /// (see [`Vits::speaker_offsets`]), handing each one's audio (samples in
    /// [-1, 1] at the voice's rate) to `emit` as soon as it is ready. Each
    /// sentence draws its noise from a generator of its own
    /// ([`sentence_rng`]), so the audio is the same on either backend and
    /// however far ahead the GPU path works.
    pub fn speak<T: AsRef<[i64]> + Sync>(
        &self,
        sentences: impl IntoIterator<Item = Result<T>>,
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
        emit: &mut dyn FnMut(T, Vec<f32>, StageSeconds) -> Result<()>,
    ) -> Result<()> {
        let mut sentences = sentences.into_iter();
        let v = match self {
            Synthesizer::Cpu(v) => v,
            Synthesizer::Gpu(v, g) => {
                return g.speak(v, &mut sentences, speaker, scales, rng, emit)
            }
        };
        // Two stages, one sentence apart: the decoder of a sentence runs
        // beside the prior and flow of the next, whose many short parallel
        // loops would leave threads idle on their own.
        let spk_dec = speaker.map(|s| s.dec.as_slice());
        let Some(first) = sentences.next() else {
            return Ok(());
        };
        let first = first?;
        let mut own = sentence_rng(rng);
        let front = par::in_pool(|| v.front(first.as_ref(), speaker, scales, &mut own))?;
        let mut current = (first, front);
        loop {
            let (item, front) = current;
            let (next, failed) = match sentences.next() {
                Some(Ok(next)) => (Some((next, sentence_rng(rng))), None),
                Some(Err(e)) => (None, Some(e)),
                None => (None, None),
            };
            let (next, mut own) = next.unzip();
            let ids = next.as_ref().map(|n| n.as_ref());
            let ((audio, decoder), ahead) = par::in_pool(|| {
                rayon::join(
                    || {
                        let t0 = std::time::Instant::now();
                        let audio = v.dec.forward(&front.lat.z, front.lat.frames, spk_dec);
                        (audio, t0.elapsed().as_secs_f64())
                    },
                    || {
                        ids.zip(own.as_mut())
                            .map(|(ids, own)| v.front(ids, speaker, scales, own))
                    },
                )
            });
            let stages = StageSeconds {
                prior: front.prior,
                flow_and_decoder: front.flow + decoder,
                device: None,
            };
            emit(item, audio, stages)?;
            if let Some(e) = failed {
                return Err(e);
            }
            match (next, ahead) {
                (Some(next), Some(front)) => current = (next, front?),
                _ => return Ok(()),
            }
        }
    }
}

/// A sentence through the prior and the flow, on the CPU, with the time
/// of each.
struct Front {
    lat: Latent,
    prior: f64,
    flow: f64,
}

impl Vits {
    fn front(
        &self,
        ids: &[i64],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
    ) -> Result<Front> {
        let t0 = std::time::Instant::now();
        let mut lat = self.prior(ids, speaker, scales, rng)?;
        let prior = t0.elapsed().as_secs_f64();
        self.flow_reverse(&mut lat.z, lat.frames, speaker);
        Ok(Front {
            lat,
            prior,
            flow: t0.elapsed().as_secs_f64() - prior,
        })
    }
}

/// The noise generator of the next sentence of a text, seeded from the
/// text's generator: a sentence's noise does not depend on when it is
/// drawn (the GPU path draws a sentence's duration noise before the prior
/// noise of the sentences before it).
pub fn sentence_rng(rng: &mut Rng) -> Rng {
    Rng::new(rng.next_u64())
}

/// Where a sentence's synthesis time went.
#[derive(Clone, Copy, Debug)]
pub struct StageSeconds {
    /// On the CPU: text encoder, duration predictor, length regulation and
    /// the noise. On the GPU, where a sentence is one submission: the host's
    /// part, drawing the noise and recording the whole sentence.
    pub prior: f64,
    /// On the CPU: the flow and the generator. On the GPU: from the
    /// sentence's submission to its audio read back (the device may be
    /// working on the sentences before it meanwhile).
    pub flow_and_decoder: f64,
    /// On a GPU with timestamps: the device's time in each stage.
    pub device: Option<DeviceSeconds>,
}

/// The device's time in each stage of a sentence (between timestamps
/// written at the stages' ends, so the gaps between dispatches count).
#[derive(Clone, Copy, Debug)]
pub struct DeviceSeconds {
    /// Text encoder and duration predictor.
    pub prior: f64,
    /// The durations, the frame count and the length regulation.
    pub regulation: f64,
    pub flow: f64,
    pub decoder: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> Result<VoiceConfig> {
        let path = std::env::temp_dir().join(format!(
            "lfm-vits-config-{}-{}.json",
            std::process::id(),
            json.to_string().len()
        ));
        std::fs::write(&path, json.to_string()).unwrap();
        let c = VoiceConfig::open(&path);
        std::fs::remove_file(&path).unwrap();
        c
    }

    #[test]
    fn configs_name_their_speakers_and_phoneme_types() {
        let base = || {
            serde_json::json!({
                "audio": {"sample_rate": 22050},
                "espeak": {"voice": "en-us"},
            })
        };
        let c = config(base()).unwrap();
        assert_eq!(
            (c.phoneme_type, c.num_speakers, c.default_speaker),
            (PhonemeType::Espeak, 1, 0)
        );
        assert!(c.speaker("0").is_ok() && c.speaker("1").is_err());
        let mut j = base();
        j["num_speakers"] = 4.into();
        j["speaker_id_map"] = serde_json::json!({"b": 1, "a": 0, "c": 3});
        j["default_speaker_id"] = 3.into();
        let c = config(j).unwrap();
        assert_eq!(
            c.speakers,
            [("a".into(), 0), ("b".into(), 1), ("c".into(), 3)]
        );
        assert_eq!(
            (
                c.speaker("c").unwrap(),
                c.speaker("2").unwrap(),
                c.default_speaker
            ),
            (3, 2, 3)
        );
        let e = c.speaker("zed").unwrap_err().to_string();
        assert!(
            e.contains("'zed'") && e.contains("0 to 3") && e.contains("a, b, c"),
            "{e}"
        );
        for (key, value, want) in [
            ("phoneme_type", serde_json::json!("pinyin"), "pinyin"),
            (
                "phoneme_type",
                serde_json::json!("klingon"),
                "unknown phoneme_type",
            ),
            ("num_speakers", serde_json::json!(0), "num_speakers"),
            (
                "speaker_id_map",
                serde_json::json!({"x": 1}),
                "'x' has id 1",
            ),
        ] {
            let mut j = base();
            j[key] = value;
            let e = config(j).unwrap_err().to_string();
            assert!(
                e.contains(want) && e.contains("lfm-vits-config"),
                "{key}: {e}"
            );
        }
        let mut j = base();
        j["phoneme_type"] = "text".into();
        j.as_object_mut().unwrap().remove("espeak");
        assert_eq!(config(j).unwrap().phoneme_type, PhonemeType::Text);
    }

    #[test]
    fn transposed_convolution_by_phases_is_the_plain_one() {
        let mut rng = Rng::new(5);
        // (c_in, c_out, kernel, stride, pad): HiFi-GAN's upsampling, odd
        // kernels, no padding, padding past a stride.
        for (c_in, c_out, kernel, stride, pad) in [
            (6, 5, 16, 8, 4),
            (4, 3, 8, 4, 2),
            (3, 2, 3, 2, 0),
            (2, 3, 5, 2, 1),
            (3, 3, 7, 3, 3),
            (2, 2, 4, 1, 1),
        ] {
            let shape = ConvTranspose1dShape {
                c_in,
                c_out,
                kernel,
                stride,
                pad,
            };
            let w = rng.vec(c_in * c_out * kernel, -1.0, 1.0);
            let b = rng.vec(c_out, -1.0, 1.0);
            let c = ConvT::new(w.clone(), Some(b.clone()), shape);
            if kernel == 2 * stride {
                // HiFi-GAN's geometry takes the fast path.
                assert_eq!(c.phases.len(), stride, "{shape:?}");
            }
            for t in [1, 2, 3, 7, 40] {
                let x = rng.vec(c_in * t, -1.0, 1.0);
                let mut want = vec![0.0; c_out * shape.t_out(t)];
                cpu::conv_transpose1d(&x, t, &w, Some(&b), &shape, &mut want);
                let got = c.forward(&x, t);
                assert_eq!(got.len(), want.len(), "{shape:?} t={t}");
                let max = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(
                    max < 1e-5,
                    "{shape:?} t={t}: max abs err {max} (phases: {})",
                    c.phases.len()
                );
            }
        }
    }

    #[test]
    fn flip_reverses_channels() {
        let mut x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        flip_channels(&mut x, 3, 2);
        assert_eq!(x, [4.0, 5.0, 2.0, 3.0, 0.0, 1.0]);
    }
}
