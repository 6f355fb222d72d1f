//! Silero VAD v6, the voice activity detector faster-whisper ships
//! (`faster_whisper/assets/silero_vad_v6.onnx`), read from its ONNX file:
//! config -> weights -> CPU forward.
//!
//! The graph, checked node by node at load: each 512-sample window of 16 kHz
//! audio, preceded by the last 64 samples of the window before it (zeros for
//! the first), is reflect-padded by 128 on both sides; an STFT spelled as a
//! convolution (258 basis rows: 129 real, 129 imaginary; 256 taps, hop 128)
//! gives 5 frames, of which the magnitudes of the last 4 go through four
//! 1-D convolutions with ReLU (129 -> 128 -> 64 -> 64 -> 128 channels, time
//! 4 -> 4 -> 2 -> 1 -> 1); an LSTM (hidden 128) runs across the windows in
//! order, its state carried from one window to the next; ReLU, a 1x1
//! convolution to one channel and a sigmoid give each window's speech
//! probability. Any other graph is refused with the node that differs.

use crate::cpu;
use crate::error::{Error, Result};
use crate::formats::onnx::{OnnxGraph, OnnxModel, OnnxNode};
use crate::models::whisper::model::im2col_1d;
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// Samples per window at 16 kHz.
pub const WINDOW: usize = 512;
/// Samples of the previous window prepended to each.
pub const CONTEXT: usize = 64;
pub const SAMPLE_RATE: usize = 16_000;

/// The ops of the v6 16 kHz graph, in order.
const GRAPH: [&str; 25] = [
    "Pad",
    "Unsqueeze",
    "Conv",
    "Slice",
    "Slice",
    "Pow",
    "Pow",
    "Add",
    "Sqrt",
    "Conv",
    "Relu",
    "Conv",
    "Relu",
    "Conv",
    "Relu",
    "Conv",
    "Relu",
    "Transpose",
    "LSTM",
    "Squeeze",
    "Relu",
    "Transpose",
    "Conv",
    "Sigmoid",
    "Reshape",
];

/// A 1-D convolution (groups 1, dilation 1) followed by ReLU.
struct Conv1d {
    /// [c_out, c_in * kernel]
    weight: Vec<f32>,
    bias: Vec<f32>,
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
}

impl Conv1d {
    fn t_out(&self, t_in: usize) -> usize {
        (t_in + 2 * self.pad).saturating_sub(self.kernel) / self.stride + 1
    }

    /// x: windows of [t_in, c_in] (time-major), one after another ->
    /// windows of [t_out, c_out], ReLU applied.
    fn forward(&self, x: &[f32], windows: usize, t_in: usize) -> Vec<f32> {
        let t_out = self.t_out(t_in);
        let width = self.c_in * self.kernel;
        let mut cols = vec![0.0; windows * t_out * width];
        cols.par_chunks_mut(t_out * width)
            .zip(x.par_chunks(t_in * self.c_in))
            .for_each(|(c, w)| {
                c.copy_from_slice(&im2col_1d(
                    w,
                    t_in,
                    self.c_in,
                    self.c_in,
                    1,
                    self.kernel,
                    self.stride,
                    self.pad,
                    t_out,
                ))
            });
        let mut y = vec![0.0; windows * t_out * self.c_out];
        cpu::matmul(
            &cols,
            &self.weight,
            Some(&self.bias),
            windows * t_out,
            width,
            self.c_out,
            &mut y,
        );
        y.par_iter_mut().for_each(|v| *v = v.max(0.0));
        y
    }
}

pub struct SileroVad {
    pub path: PathBuf,
    /// STFT basis [2 * bins, n_fft]: real rows, then imaginary rows.
    basis: Vec<f32>,
    bins: usize,
    n_fft: usize,
    hop: usize,
    /// Reflection padding on each side of a window.
    pad: usize,
    /// STFT frames dropped at the start (the graph's Slice).
    skip_frames: usize,
    convs: Vec<Conv1d>,
    hidden: usize,
    /// [4 * hidden, input] and [4 * hidden, hidden], gates i, o, f, c (ONNX order).
    lstm_w: Vec<f32>,
    lstm_r: Vec<f32>,
    /// Input and recurrent biases summed: [4 * hidden].
    lstm_b: Vec<f32>,
    head_w: Vec<f32>,
    head_b: f32,
}

fn int_constant(g: &OnnxGraph, node: &OnnxNode, input: usize) -> Result<Vec<i64>> {
    let name = node.inputs.get(input).map(String::as_str).unwrap_or("");
    g.constant(name)
        .ok_or_else(|| node.unsupported(format!("input {input} ({name}) is not a constant")))?
        .to_i64()
}

fn weights(g: &OnnxGraph, node: &OnnxNode, input: usize, shape: &[usize]) -> Result<Vec<f32>> {
    let name = node.inputs.get(input).map(String::as_str).unwrap_or("");
    let t = g
        .constant(name)
        .ok_or_else(|| node.unsupported(format!("input {input} ({name}) is not a constant")))?;
    if t.shape()? != shape {
        return Err(node.unsupported(format!(
            "{name} has shape {:?}, expected {shape:?}",
            t.shape()?
        )));
    }
    t.to_f32()
}

/// A Conv node's weights and geometry, checked to be 1-D, groups 1.
fn conv(g: &OnnxGraph, node: &OnnxNode, c_in: usize) -> Result<Conv1d> {
    let name = node.inputs.get(1).map(String::as_str).unwrap_or("");
    let shape = g
        .constant(name)
        .ok_or_else(|| node.unsupported("the weight is not a constant"))?
        .shape()?;
    let [c_out, w_in, kernel] = shape[..] else {
        return Err(node.unsupported(format!("weight of shape {shape:?} (expected 1-D)")));
    };
    if w_in != c_in {
        return Err(node.unsupported(format!("{w_in} input channels, expected {c_in}")));
    }
    let pads = node.ints_or("pads", &[0, 0])?;
    let strides = node.ints_or("strides", &[1])?;
    let ok = node.int_or("group", 1)? == 1
        && node.ints_or("dilations", &[1])? == [1]
        && pads.len() == 2
        && pads[0] == pads[1]
        && pads[0] >= 0
        && strides.len() == 1
        && strides[0] > 0
        && node.ints_or("kernel_shape", &[kernel as i64])? == [kernel as i64];
    if !ok {
        return Err(
            node.unsupported("convolution geometry (expected 1-D, groups 1, symmetric pads)")
        );
    }
    let bias = if node.inputs.get(2).is_some_and(|b| !b.is_empty()) {
        weights(g, node, 2, &[c_out])?
    } else {
        vec![0.0; c_out]
    };
    Ok(Conv1d {
        weight: weights(g, node, 1, &[c_out, c_in, kernel])?,
        bias,
        c_in,
        c_out,
        kernel,
        stride: strides[0] as usize,
        pad: pads[0] as usize,
    })
}

impl SileroVad {
    pub fn load(path: &Path) -> Result<SileroVad> {
        let model = OnnxModel::open(path)?;
        let g = &model.graph;
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        if let Some(i) = (0..GRAPH.len().max(ops.len())).find(|&i| ops.get(i) != GRAPH.get(i)) {
            return Err(Error::unsupported(
                path,
                format!(
                    "not the Silero VAD v6 16 kHz graph: node {i} is {}, expected {}",
                    ops.get(i).unwrap_or(&"(none)"),
                    GRAPH.get(i).unwrap_or(&"(none)")
                ),
            ));
        }
        let n = &g.nodes;
        // Pad: reflection on the last axis only.
        let pads = int_constant(g, &n[0], 1)?;
        if n[0].string_or("mode", "constant")? != "reflect"
            || pads.len() != 4
            || pads[0] != 0
            || pads[2] != 0
            || pads[1] != pads[3]
            || pads[1] <= 0
        {
            return Err(n[0].unsupported(format!(
                "padding {pads:?} (expected reflection of the samples)"
            )));
        }
        let pad = pads[1] as usize;
        // The STFT as a convolution without bias, and the real / imaginary Slices.
        let stft = conv(g, &n[2], 1)?;
        if stft.pad != 0 || stft.bias.iter().any(|&b| b != 0.0) || stft.c_out % 2 != 0 {
            return Err(n[2].unsupported("STFT convolution with padding or bias"));
        }
        let bins = stft.c_out / 2;
        let slice = |node: &OnnxNode, first: i64| -> Result<i64> {
            let starts = int_constant(g, node, 1)?;
            let ends = int_constant(g, node, 2)?;
            let axes = int_constant(g, node, 3)?;
            let steps = int_constant(g, node, 4)?;
            let ok = starts.len() == 2
                && starts[0] == first
                && ends.len() == 2
                && ends[0] >= first + bins as i64
                && ends[1] >= i32::MAX as i64
                && axes == [1, 2]
                && steps == [1, 1];
            if !ok {
                return Err(node.unsupported("slice of the STFT (expected real or imaginary half)"));
            }
            Ok(starts[1])
        };
        let skip_re = slice(&n[3], 0)?;
        let skip_im = slice(&n[4], bins as i64)?;
        if skip_re != skip_im || skip_re < 0 {
            return Err(n[4].unsupported("real and imaginary slices start at different frames"));
        }
        let mut convs = Vec::new();
        let mut c_in = bins;
        for i in [9, 11, 13, 15] {
            let c = conv(g, &n[i], c_in)?;
            c_in = c.c_out;
            convs.push(c);
        }
        let lstm = &n[18];
        let hidden = lstm.int("hidden_size")? as usize;
        if lstm.string_or("direction", "forward")? != "forward"
            || lstm.attr("activations").is_some()
            || lstm.attr("clip").is_some()
            || lstm.inputs.get(4).is_some_and(|s| !s.is_empty())
            || lstm.inputs.get(7).is_some_and(|s| !s.is_empty())
            || hidden != c_in
        {
            return Err(lstm.unsupported(
                "LSTM options (expected forward, default activations, no peepholes)",
            ));
        }
        let lstm_w = weights(g, lstm, 1, &[1, 4 * hidden, c_in])?;
        let lstm_r = weights(g, lstm, 2, &[1, 4 * hidden, hidden])?;
        let b = weights(g, lstm, 3, &[1, 8 * hidden])?;
        let lstm_b = (0..4 * hidden).map(|i| b[i] + b[4 * hidden + i]).collect();
        let head = conv(g, &n[22], hidden)?;
        if head.c_out != 1 || head.kernel != 1 {
            return Err(n[22].unsupported("head convolution (expected 1x1 to one channel)"));
        }
        let s = SileroVad {
            path: path.to_path_buf(),
            basis: stft.weight,
            bins,
            n_fft: stft.kernel,
            hop: stft.stride,
            pad,
            skip_frames: skip_re as usize,
            convs,
            hidden,
            lstm_w,
            lstm_r,
            lstm_b,
            head_w: head.weight,
            head_b: head.bias[0],
        };
        // The window must give the frames the convolutions reduce to one.
        let t = s.frames();
        let t = s.convs.iter().fold(t, |t, c| c.t_out(t));
        if s.frames() == 0 || t != 1 || WINDOW + CONTEXT <= pad {
            return Err(Error::unsupported(
                path,
                "the convolutions do not reduce a 576-sample window to one step",
            ));
        }
        Ok(s)
    }

    /// STFT frames kept per window.
    fn frames(&self) -> usize {
        let len = WINDOW + CONTEXT + 2 * self.pad;
        let total = len.saturating_sub(self.n_fft) / self.hop + 1;
        total.saturating_sub(self.skip_frames)
    }

    /// The speech probability of each 512-sample window of 16 kHz `audio`,
    /// zero-padded as faster-whisper pads it (by 512 - len % 512: a whole
    /// window of zeros when the length is a multiple of 512).
    /// Windows are scored 4096 at a time, so memory stays bounded whatever
    /// the length of the audio.
    pub fn speech_probs(&self, audio: &[f32]) -> Vec<f32> {
        self.speech_probs_in_blocks(audio, 4096)
    }

    /// `speech_probs`, scoring `block` windows at a time (the LSTM state
    /// carried from block to block).
    pub fn speech_probs_in_blocks(&self, audio: &[f32], block: usize) -> Vec<f32> {
        let block = block.max(1);
        let windows = audio.len() / WINDOW + 1;
        let h4 = 4 * self.hidden;
        let hd = self.hidden;
        let sigmoid = |v: f32| 1.0 / (1.0 + (-v).exp());
        let mut h = vec![0.0f32; hd];
        let mut c = vec![0.0f32; hd];
        let mut probs = Vec::with_capacity(windows);
        for first in (0..windows).step_by(block) {
            let count = block.min(windows - first);
            let x = self.window_features(audio, first, count);
            // The LSTM's input projections of the block, then its steps in order.
            let mut pre = vec![0.0f32; count * h4];
            cpu::matmul(
                &x,
                &self.lstm_w,
                Some(&self.lstm_b),
                count,
                self.hidden,
                h4,
                &mut pre,
            );
            for g in pre.chunks_exact_mut(h4) {
                for (gate, r) in g.iter_mut().zip(self.lstm_r.chunks_exact(hd)) {
                    *gate += r.iter().zip(&h).map(|(a, b)| a * b).sum::<f32>();
                }
                let mut logit = self.head_b;
                for k in 0..hd {
                    let i = sigmoid(g[k]);
                    let o = sigmoid(g[hd + k]);
                    let f = sigmoid(g[2 * hd + k]);
                    let cand = g[3 * hd + k].tanh();
                    c[k] = f * c[k] + i * cand;
                    h[k] = o * c[k].tanh();
                    logit += self.head_w[k] * h[k].max(0.0);
                }
                probs.push(sigmoid(logit));
            }
        }
        probs
    }

    /// The convolutional encoder's output [count, hidden] for windows
    /// `first..first + count` of `audio` (past its end: zeros).
    fn window_features(&self, audio: &[f32], first: usize, count: usize) -> Vec<f32> {
        let windows = count;
        let len = WINDOW + CONTEXT;
        let padded_len = len + 2 * self.pad;
        let frames = self.frames();
        let total_frames = frames + self.skip_frames;
        // Every window's STFT frames [windows * total_frames, n_fft].
        let mut framed = vec![0.0f32; windows * total_frames * self.n_fft];
        framed
            .par_chunks_mut(total_frames * self.n_fft)
            .enumerate()
            .for_each(|(w, out)| {
                let w = first + w;
                let at = |i: isize| -> f32 {
                    // Window w's samples, the context before it included.
                    let s = (w * WINDOW) as isize - CONTEXT as isize + i;
                    if w == 0 && i < CONTEXT as isize {
                        return 0.0;
                    }
                    audio.get(s as usize).copied().unwrap_or(0.0)
                };
                let mut x = vec![0.0f32; padded_len];
                for (j, v) in x.iter_mut().enumerate() {
                    let mut i = j as isize - self.pad as isize;
                    if i < 0 {
                        i = -i;
                    } else if i >= len as isize {
                        i = 2 * (len as isize - 1) - i;
                    }
                    *v = at(i);
                }
                for (t, row) in out.chunks_exact_mut(self.n_fft).enumerate() {
                    row.copy_from_slice(&x[t * self.hop..t * self.hop + self.n_fft]);
                }
            });
        let mut spec = vec![0.0f32; windows * total_frames * 2 * self.bins];
        cpu::matmul(
            &framed,
            &self.basis,
            None,
            windows * total_frames,
            self.n_fft,
            2 * self.bins,
            &mut spec,
        );
        drop(framed);
        // Magnitudes of the kept frames, time-major [windows * frames, bins].
        let mut x = vec![0.0f32; windows * frames * self.bins];
        x.par_chunks_mut(frames * self.bins)
            .zip(spec.par_chunks(total_frames * 2 * self.bins))
            .for_each(|(out, s)| {
                for t in 0..frames {
                    let row = &s[(t + self.skip_frames) * 2 * self.bins..][..2 * self.bins];
                    for f in 0..self.bins {
                        let (re, im) = (row[f], row[self.bins + f]);
                        out[t * self.bins + f] = (re * re + im * im).sqrt();
                    }
                }
            });
        let mut t = frames;
        for c in &self.convs {
            x = c.forward(&x, windows, t);
            t = c.t_out(t);
        }
        x
    }
}
