//! The GPU plan for VITS: the normalising flow (per frame) and the HiFi-GAN
//! generator (per audio sample; together nearly all of the work), after the
//! prior (`gpu_prior`) and the length regulation. A sentence, or a group of
//! them whose flow and generator run in the same dispatches (a batch, one
//! slice of workgroups a sentence), is one submission that reads back only
//! the frame counts and the audio: the durations, their sums and the sizes
//! of every later dispatch are computed on the device (`speech::durations`;
//! the flow's and the decoder's dispatches are indirect, their buffers made
//! for a bounded number of frames, the kernels reading the counts from the
//! device). The prior's noise is drawn on the host from the seeded CPU
//! generator for that bound, of which the kernels use the start, the values
//! the CPU path draws for the sentence's frames: a seed gives the same noise
//! on both backends. The groups of a text are pipelined
//! ([`GpuVoice::speak`]).
//!
//! The latent is kept as its two channel halves, the couplings' x0 and x1,
//! in separate buffers. The flips between couplings are never done: a flip
//! swaps the halves and reverses each one's channel order, which is folded
//! into the weights of the layers that read and write them (`pre` reads a
//! half with its input channels reversed, `post` writes one with its output
//! channels reversed); after an even number of flips the halves are back in
//! order. `x1 -= post(out)` is `post` with negated weights and the residual
//! add, and the decoder's first convolution reads the two halves as two
//! convolutions over its input channels.

use super::{
    duration_noise, too_many_frames, Conv, ConvT, Coupling, DeviceSeconds, Generator, GpuPrior,
    Latent, Scales, SpeakerOffsets, StageSeconds, Vits, LRELU_SLOPE, LRELU_SLOPE_POST,
    MAX_SENTENCE_FRAMES,
};
use crate::cpu::Conv1dShape;
use crate::error::{Error, Result};
use crate::gpu::ops::{self, Dispatch};
use crate::gpu::profile::PassTimer;
use crate::gpu::speech::{self, Conv1dExtras, FrameCount, InputAct, Steps};
use crate::gpu::Gpu;
use crate::util::rng::Rng;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use web_time::{Duration, Instant};

/// A convolution's weights on the device.
pub(super) struct GpuConv {
    pub(super) w: wgpu::Buffer,
    pub(super) b: wgpu::Buffer,
}

impl GpuConv {
    pub(super) fn upload(
        gpu: &Gpu,
        name: &str,
        w: &[f32],
        b: Option<&[f32]>,
        c_out: usize,
    ) -> Result<GpuConv> {
        let zeros;
        let b = match b {
            Some(b) => b,
            None => {
                zeros = vec![0.0; c_out];
                &zeros
            }
        };
        Ok(GpuConv {
            w: gpu.upload_f32(&format!("{name}.weight"), w)?,
            b: gpu.upload_f32(&format!("{name}.bias"), b)?,
        })
    }

    pub(super) fn conv(gpu: &Gpu, name: &str, c: &Conv) -> Result<GpuConv> {
        let w = speech::pack_conv1d_weights(&c.w, &c.shape);
        GpuConv::upload(gpu, name, &w, c.b.as_deref(), c.shape.c_out)
    }

    fn conv_t(gpu: &Gpu, name: &str, c: &ConvT) -> Result<GpuConv> {
        let w = speech::pack_conv_transpose1d_weights(&c.w, &c.shape);
        GpuConv::upload(gpu, name, &w, c.b.as_deref(), c.shape.c_out)
    }
}

/// The generator's weights on the device, with the CPU copy for shapes.
pub struct GpuGenerator {
    gpu: Arc<Gpu>,
    cpu: Generator,
    /// conv_pre over the latent's first and second halves of channels.
    conv_pre: [(GpuConv, Conv1dShape); 2],
    /// conv_pre's bias (the speaker's offset is added to it per call).
    conv_pre_bias: Vec<f32>,
    ups: Vec<GpuConv>,
    resblocks: Vec<Vec<Vec<GpuConv>>>,
    conv_post: GpuConv,
}

impl GpuGenerator {
    pub fn new(gpu: Arc<Gpu>, g: &Generator) -> Result<GpuGenerator> {
        // A block's last convolution adds the blocks before it.
        if g.resblocks.iter().flatten().any(|b| b.is_empty()) {
            return Err(Error::gpu("a decoder residual block without convolutions"));
        }
        let ups = g
            .ups
            .iter()
            .enumerate()
            .map(|(i, u)| GpuConv::conv_t(&gpu, &format!("dec.ups.{i}"), u))
            .collect::<Result<_>>()?;
        let mut resblocks = Vec::new();
        for stage in &g.resblocks {
            let mut s = Vec::new();
            for block in stage {
                s.push(
                    block
                        .iter()
                        .map(|c| GpuConv::conv(&gpu, "dec.resblock", c))
                        .collect::<Result<Vec<_>>>()?,
                );
            }
            resblocks.push(s);
        }
        let half = g.conv_pre.shape.c_in / 2;
        let conv_pre_bias = g
            .conv_pre
            .b
            .clone()
            .unwrap_or_else(|| vec![0.0; g.conv_pre.shape.c_out]);
        let first = in_channels(&g.conv_pre, 0..half);
        let mut second = in_channels(&g.conv_pre, half..2 * half);
        second.b = None;
        Ok(GpuGenerator {
            conv_pre: [
                (GpuConv::conv(&gpu, "dec.conv_pre.0", &first)?, first.shape),
                (
                    GpuConv::conv(&gpu, "dec.conv_pre.1", &second)?,
                    second.shape,
                ),
            ],
            conv_pre_bias,
            conv_post: GpuConv::conv(&gpu, "dec.conv_post", &g.conv_post)?,
            ups,
            resblocks,
            cpu: g.clone(),
            gpu,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// z: [inter_channels, frames] -> audio [frames * hop], as
    /// [`Generator::forward`] computes it (`speaker`: the speaker's offset to
    /// `conv_pre`'s output, folded into its bias).
    pub fn forward(&self, z: &[f32], frames: usize, speaker: Option<&[f32]>) -> Result<Vec<f32>> {
        let gpu = &*self.gpu;
        let half = z.len() / 2;
        let a = gpu.upload_f32("dec.z.0", &z[..half])?;
        let b = gpu.upload_f32("dec.z.1", &z[half..])?;
        let mut work = Vec::new();
        let (out, _) = self.record(&a, &b, Steps::fixed(frames), speaker, &mut work)?;
        gpu.run_all(&work.iter().collect::<Vec<_>>())?;
        let mut audio = gpu.read_f32(&out)?;
        audio.truncate(frames * self.cpu.hop());
        Ok(audio)
    }

    /// Records the generator on the latent's halves a, b: [inter / 2,
    /// frames] each (a sentence after another for a batch's steps); returns
    /// the buffer the audio will be in and how many samples apart its
    /// sentences start there.
    fn record(
        &self,
        a: &wgpu::Buffer,
        b: &wgpu::Buffer,
        frames: Steps<'_>,
        speaker: Option<&[f32]>,
        work: &mut Vec<Dispatch>,
    ) -> Result<(wgpu::Buffer, usize)> {
        let gpu = &*self.gpu;
        let g = &self.cpu;
        let mut t = frames;
        let mut bias = self.conv_pre_bias.clone();
        if let Some(offset) = speaker {
            for (b, o) in bias.iter_mut().zip(offset) {
                *b += o;
            }
        }
        let bias = gpu.upload_f32("dec.conv_pre.bias", &bias)?;
        let bytes = t.bytes(g.conv_pre.shape.c_out);
        let x0 = gpu.scratch("dec.x0", bytes)?;
        let [(w0, s0), (w1, s1)] = &self.conv_pre;
        work.push(speech::conv1d(
            gpu,
            a,
            &w0.w,
            &bias,
            &x0,
            s0,
            t,
            InputAct::NONE,
            Conv1dExtras::default(),
        )?);
        let mut x = gpu.scratch("dec.x", bytes)?;
        work.push(speech::conv1d(
            gpu,
            b,
            &w1.w,
            &w1.b,
            &x,
            s1,
            t,
            InputAct::NONE,
            Conv1dExtras {
                residual: Some(&x0),
                ..Default::default()
            },
        )?);
        // The average over a stage's residual blocks is folded into the next
        // layer's input scale: leaky_relu(s * v) = s * leaky_relu(v) for s > 0.
        let mut in_scale = 1.0f32;
        for (si, (up, blocks)) in g.ups.iter().zip(&g.resblocks).enumerate() {
            let t_up = t.conv_transpose(&up.shape);
            let bytes = t_up.bytes(up.shape.c_out);
            let u = gpu.scratch("dec.up", bytes)?;
            work.push(speech::conv_transpose1d(
                gpu,
                &x,
                &self.ups[si].w,
                &self.ups[si].b,
                &u,
                &up.shape,
                t,
                InputAct {
                    scale: in_scale,
                    slope: LRELU_SLOPE,
                },
            )?);
            t = t_up;
            // x_b = x_b + conv(leaky(x_b)) for each conv of a block, starting
            // from u; the last conv of a block also adds the blocks before it.
            // A block's steps take two buffers in turn, and the running sums
            // two others (a dispatch cannot read and write one buffer).
            let (mut steps, mut sums) = ([None, None], [None, None]);
            let mut sum: Option<wgpu::Buffer> = None;
            for (bi, convs) in blocks.iter().enumerate() {
                let mut cur = u.clone();
                for (ci, c) in convs.iter().enumerate() {
                    let w = &self.resblocks[si][bi][ci];
                    let last = ci + 1 == convs.len();
                    let out = if last {
                        reuse(gpu, &mut sums[bi % 2], "dec.sum", bytes)?
                    } else {
                        reuse(gpu, &mut steps[ci % 2], "dec.block", bytes)?
                    };
                    work.push(speech::conv1d(
                        gpu,
                        &cur,
                        &w.w,
                        &w.b,
                        &out,
                        &c.shape,
                        t,
                        InputAct::leaky(LRELU_SLOPE),
                        Conv1dExtras {
                            residual: Some(&cur),
                            sum: sum.as_ref().filter(|_| last),
                            tanh: false,
                        },
                    )?);
                    cur = out;
                }
                sum = Some(cur);
            }
            in_scale = 1.0 / blocks.len() as f32;
            x = sum.unwrap_or(u);
        }
        let out = gpu.scratch("dec.audio", t.bytes(1))?;
        work.push(speech::conv1d(
            gpu,
            &x,
            &self.conv_post.w,
            &self.conv_post.b,
            &out,
            &g.conv_post.shape,
            t,
            InputAct {
                scale: in_scale,
                slope: LRELU_SLOPE_POST,
            },
            Conv1dExtras {
                tanh: true,
                ..Default::default()
            },
        )?);
        Ok((out, t.stride(1)))
    }

    /// Whether the generator's buffers and dispatches take `batch`
    /// sentences of `frames` frames on this adapter (its activations grow
    /// with the frames times the upsampling so far).
    fn fits(&self, frames: usize, batch: usize) -> bool {
        let gpu = &*self.gpu;
        let limit = gpu.caps.max_binding.min(gpu.caps.max_buffer);
        let g = &self.cpu;
        let ok = |c: usize, t: usize| {
            (c as u64 * t as u64 * batch as u64 * 4) <= limit
                && t.div_ceil(64) <= speech::MAX_GROUPS
        };
        let mut t = frames;
        let mut fits = ok(g.conv_pre.shape.c_out, t);
        for up in &g.ups {
            t = up.shape.t_out(t);
            fits &= ok(up.shape.c_out, t);
        }
        fits && ok(g.conv_post.shape.c_out.max(1), g.conv_post.shape.t_out(t))
    }
}

/// The buffer in `slot`, made on first use.
fn reuse(
    gpu: &Gpu,
    slot: &mut Option<wgpu::Buffer>,
    label: &str,
    bytes: u64,
) -> Result<wgpu::Buffer> {
    if let Some(b) = slot {
        return Ok(b.clone());
    }
    let b = gpu.scratch(label, bytes)?;
    *slot = Some(b.clone());
    Ok(b)
}

/// `c`'s weights for input channels `range` only.
fn in_channels(c: &Conv, range: std::ops::Range<usize>) -> Conv {
    let s = c.shape;
    let n = range.len();
    let mut w = Vec::with_capacity(s.c_out * n * s.kernel);
    for o in 0..s.c_out {
        for i in range.clone() {
            let at = (o * s.c_in + i) * s.kernel;
            w.extend_from_slice(&c.w[at..at + s.kernel]);
        }
    }
    Conv::new(w, c.b.clone(), Conv1dShape { c_in: n, ..s })
}

/// `c`'s output channels `range` only.
fn out_channels(c: &Conv, range: std::ops::Range<usize>) -> Conv {
    let per = c.shape.c_in * c.shape.kernel;
    Conv::new(
        c.w[range.start * per..range.end * per].to_vec(),
        c.b.as_ref().map(|b| b[range.clone()].to_vec()),
        Conv1dShape {
            c_out: range.len(),
            ..c.shape
        },
    )
}

/// `c` reading its input channels in reverse order.
fn reversed_input(c: &Conv) -> Conv {
    let s = c.shape;
    let mut w = c.w.clone();
    for o in 0..s.c_out {
        for i in 0..s.c_in {
            let (dst, src) = (
                (o * s.c_in + i) * s.kernel,
                (o * s.c_in + s.c_in - 1 - i) * s.kernel,
            );
            w[dst..dst + s.kernel].copy_from_slice(&c.w[src..src + s.kernel]);
        }
    }
    Conv::new(w, c.b.clone(), s)
}

/// -c, with its output channels in reverse order when `reverse`.
fn negated_output(c: &Conv, reverse: bool) -> Conv {
    let s = c.shape;
    let per = s.c_in * s.kernel;
    let src = |o: usize| if reverse { s.c_out - 1 - o } else { o };
    let mut w = Vec::with_capacity(c.w.len());
    for o in 0..s.c_out {
        w.extend(c.w[src(o) * per..(src(o) + 1) * per].iter().map(|v| -v));
    }
    let b =
        c.b.as_ref()
            .map(|b| (0..s.c_out).map(|o| -b[src(o)]).collect());
    Conv::new(w, b, s)
}

/// One affine coupling's layers on the device, flips folded in.
struct GpuCoupling {
    /// Reads x0 (the second buffer, reversed, after an odd number of flips).
    pre: (GpuConv, Conv1dShape),
    in_layers: Vec<(GpuConv, Conv1dShape)>,
    /// The residual half of res_skip (all layers but the last).
    res: Vec<(GpuConv, Conv1dShape)>,
    /// The skip half of res_skip (the last layer's whole res_skip).
    skip: Vec<(GpuConv, Conv1dShape)>,
    /// -post, writing x1 (reversed after an odd number of flips).
    post: (GpuConv, Conv1dShape),
    /// An odd number of flips precede this coupling in the reverse pass.
    odd: bool,
    hidden: usize,
}

impl GpuCoupling {
    fn new(gpu: &Gpu, name: &str, c: &Coupling, odd: bool) -> Result<GpuCoupling> {
        let up = |n: &str, conv: &Conv| -> Result<(GpuConv, Conv1dShape)> {
            Ok((
                GpuConv::conv(gpu, &format!("{name}.{n}"), conv)?,
                conv.shape,
            ))
        };
        let hidden = c.pre.shape.c_out;
        let pre = if odd {
            reversed_input(&c.pre)
        } else {
            c.pre.clone()
        };
        let n = c.in_layers.len();
        let mut res = Vec::new();
        let mut skip = Vec::new();
        for (i, rs) in c.res_skip.iter().enumerate() {
            if i + 1 < n {
                res.push(up("res", &out_channels(rs, 0..hidden))?);
                skip.push(up("skip", &out_channels(rs, hidden..2 * hidden))?);
            } else {
                skip.push(up("skip", rs)?);
            }
        }
        Ok(GpuCoupling {
            pre: up("pre", &pre)?,
            in_layers: c
                .in_layers
                .iter()
                .map(|l| up("in_layer", l))
                .collect::<Result<_>>()?,
            res,
            skip,
            post: up("post", &negated_output(&c.post, odd))?,
            odd,
            hidden,
        })
    }
}

/// The flow's couplings on the device, in file order.
pub struct GpuFlow {
    gpu: Arc<Gpu>,
    couplings: Vec<GpuCoupling>,
    /// Where each coupling's speaker offsets start in the offsets buffer.
    offsets_at: Vec<usize>,
    /// Offsets of a single-speaker voice: zeros.
    zeros: wgpu::Buffer,
    half: usize,
}

impl GpuFlow {
    pub fn new(gpu: Arc<Gpu>, v: &Vits) -> Result<GpuFlow> {
        let n = v.flows.len();
        if !n.is_multiple_of(2) {
            return Err(Error::gpu(format!(
                "the GPU flow folds the flips between couplings and needs an even number of \
                 them, not {n}"
            )));
        }
        let couplings = v
            .flows
            .iter()
            .enumerate()
            .map(|(i, c)| GpuCoupling::new(&gpu, &format!("flow.{i}"), c, (n - i) % 2 == 1))
            .collect::<Result<Vec<_>>>()?;
        let mut offsets_at = Vec::new();
        let mut total = 0;
        for c in &couplings {
            offsets_at.push(total);
            total += 2 * c.hidden * c.in_layers.len();
        }
        Ok(GpuFlow {
            zeros: gpu.upload_f32("flow.no_speaker", &vec![0.0; total.max(1)])?,
            gpu,
            couplings,
            offsets_at,
            half: v.inter_channels / 2,
        })
    }

    /// z_p: [inter_channels, frames] -> the decoder's input, as
    /// [`Vits::flow_reverse`] computes it.
    pub fn forward(
        &self,
        z: &[f32],
        frames: usize,
        speaker: Option<&SpeakerOffsets>,
    ) -> Result<Vec<f32>> {
        let gpu = &*self.gpu;
        let n = z.len() / 2;
        let a = gpu.upload_f32("flow.z.0", &z[..n])?;
        let b = gpu.upload_f32("flow.z.1", &z[n..])?;
        let mut work = Vec::new();
        let (a, b) = self.record(a, b, Steps::fixed(frames), speaker, &mut work)?;
        gpu.run_all(&work.iter().collect::<Vec<_>>())?;
        let n = self.half * frames;
        let mut out = gpu.read_f32(&a)?;
        out.truncate(n);
        out.extend_from_slice(&gpu.read_f32(&b)?[..n]);
        Ok(out)
    }

    /// Records the reverse flow on halves (a, b); returns the new halves.
    fn record(
        &self,
        mut a: wgpu::Buffer,
        mut b: wgpu::Buffer,
        t: Steps<'_>,
        speaker: Option<&SpeakerOffsets>,
        work: &mut Vec<Dispatch>,
    ) -> Result<(wgpu::Buffer, wgpu::Buffer)> {
        let gpu = &*self.gpu;
        let uploaded;
        let g = match speaker {
            None => &self.zeros,
            Some(s) => {
                uploaded = gpu.upload_f32("flow.speaker", &s.flows.concat())?;
                &uploaded
            }
        };
        for (ci, c) in self.couplings.iter().enumerate().rev() {
            let hidden = c.hidden;
            let (x0, x1) = if c.odd { (&b, &a) } else { (&a, &b) };
            let bytes = t.bytes(hidden);
            let mut h = gpu.scratch("flow.h", bytes)?;
            let conv = |x: &wgpu::Buffer,
                        (w, s): &(GpuConv, Conv1dShape),
                        y: &wgpu::Buffer,
                        residual: Option<&wgpu::Buffer>| {
                speech::conv1d(
                    gpu,
                    x,
                    &w.w,
                    &w.b,
                    y,
                    s,
                    t,
                    InputAct::NONE,
                    Conv1dExtras {
                        residual,
                        ..Default::default()
                    },
                )
            };
            work.push(conv(x0, &c.pre, &h, None)?);
            let mut out: Option<wgpu::Buffer> = None;
            let n = c.in_layers.len();
            for l in 0..n {
                let x_in = gpu.scratch("flow.x_in", 2 * bytes)?;
                work.push(conv(&h, &c.in_layers[l], &x_in, None)?);
                let acts = gpu.scratch("flow.acts", bytes)?;
                work.push(speech::wavenet_gate(
                    gpu,
                    &x_in,
                    g,
                    &acts,
                    hidden,
                    t,
                    self.offsets_at[ci] + l * 2 * hidden,
                )?);
                if l + 1 < n {
                    let h_next = gpu.scratch("flow.h", bytes)?;
                    work.push(conv(&acts, &c.res[l], &h_next, Some(&h))?);
                    h = h_next;
                }
                let out_next = gpu.scratch("flow.out", bytes)?;
                work.push(conv(&acts, &c.skip[l], &out_next, out.as_ref())?);
                out = Some(out_next);
            }
            let out = out.ok_or_else(|| Error::gpu("a coupling without WaveNet layers"))?;
            let x1_next = gpu.scratch("flow.z", t.bytes(self.half))?;
            work.push(conv(&out, &c.post, &x1_next, Some(x1))?);
            if c.odd {
                a = x1_next;
            } else {
                b = x1_next;
            }
        }
        Ok((a, b))
    }
}

/// The whole voice on the device: the prior ([`GpuPrior`]: text encoder
/// and duration predictor), the durations and the length regulation with
/// the prior's noise, the flow and the generator, one submission a group of
/// sentences that reads back their frame counts and audio. The prior, the
/// flow and the generator run a group's sentences in the same dispatches (a
/// batch: each sentence a slice of workgroups, [`speech::Steps`]), so their
/// fixed cost a dispatch is paid once a group; the durations and the length
/// regulation run a sentence at a time.
pub struct GpuVoice {
    pub prior: GpuPrior,
    pub flow: GpuFlow,
    pub dec: GpuGenerator,
    /// The most frames a sentence's buffers and dispatches take here.
    max_frames: usize,
    /// Frames per phoneme id (and unit of length scale) a sentence's
    /// buffers are first made for, and at least how many.
    frames_per_id: f32,
    min_frames: usize,
    /// Sentences run again because they needed more frames.
    reruns: AtomicUsize,
    /// The most sentences [`GpuVoice::speak`] puts in one group.
    batch: usize,
}

/// How many groups of sentences [`GpuVoice::speak`] keeps on the device
/// queue while it waits for the first of them: the host records the next
/// one while the device works (each holds its buffers until it is read).
/// The first sentence is read before anything is queued behind it: its
/// audio is what a listener waits for, and recording a group takes the host
/// longer than the sentence takes the device (the group after it is
/// recorded on another thread meanwhile, and submitted once it is read).
const GROUPS_AHEAD: usize = 2;

/// The most sentences [`GpuVoice::speak`] runs in the same dispatches
/// (after the first, which runs alone so that its audio comes first). A
/// sentence of the bench paragraph has 300-700 frames: a flow convolution
/// then has 5-11 x 24 workgroups of 64 invocations, far from filling a
/// large GPU, and the generator's first stage about as few; four such
/// sentences together are still under one wave of an H200, and hold 4x
/// their buffers (~0.5 GB at most) while later sentences wait less than
/// the audio before them lasts.
const BATCH: usize = 4;

/// Frames a sentence's buffers are first made for: this many per phoneme id
/// and unit of length scale, plus one per id (each duration is rounded
/// up), and at least [`MIN_FRAMES`]. A sentence that needs more is run again
/// with buffers of its size (its audio is the same), so these trade the
/// noise drawn and the memory held against the rare rerun (BENCHMARKS.md,
/// "frames per phoneme id").
const FRAMES_PER_ID: f32 = 2.5;
const MIN_FRAMES: usize = 64;

/// A group of sentences recorded ([`GpuVoice::record_group`]), to submit.
struct RecordedGroup {
    commands: ops::Recorded,
    cap: usize,
    stride: usize,
    rngs: Vec<Rng>,
    timer: Option<PassTimer>,
    /// How long its recording took.
    recording: Duration,
}

/// A group of sentences on the device queue: one submission whose frame
/// counts and audio come back with [`GpuVoice::read`].
struct QueuedGroup {
    out: ops::Queued,
    /// Frames its buffers hold, a sentence, and how many samples apart
    /// their audio starts.
    cap: usize,
    stride: usize,
    /// Its sentences' generators before any of their draws, to run one
    /// again.
    rngs: Vec<Rng>,
    /// Timestamps at the ends of its stages (adapters that have them).
    timer: Option<PassTimer>,
    /// How long its recording took, and when it was submitted.
    recording: Duration,
    submitted: Instant,
}

/// The next group of a text's sentences: the sentences, each one's
/// generator, and the frames their buffers are made for.
type Group<T> = (Vec<T>, Vec<Rng>, usize);

/// A group's latent z_p on the device once its work runs: the halves (each
/// sentence's at its place in the batch), each sentence's durations'
/// running sums, and where in the work the priors end.
struct GroupPrior {
    a: wgpu::Buffer,
    b: wgpu::Buffer,
    ends: Vec<wgpu::Buffer>,
    prior_end: usize,
}

impl GpuVoice {
    pub fn new(gpu: Arc<Gpu>, v: &Vits) -> Result<GpuVoice> {
        let prior = GpuPrior::new(gpu.clone(), v)?;
        let flow = GpuFlow::new(gpu.clone(), v)?;
        let dec = GpuGenerator::new(gpu.clone(), &v.dec)?;
        let mut voice = GpuVoice {
            prior,
            flow,
            dec,
            max_frames: 0,
            frames_per_id: FRAMES_PER_ID,
            min_frames: MIN_FRAMES,
            reruns: AtomicUsize::new(0),
            batch: BATCH,
        };
        if !voice.fits(1, 1) {
            return Err(Error::gpu("the adapter's buffers cannot hold one frame"));
        }
        // The largest count that fits: they fit up to it and not after.
        let (mut lo, mut hi) = (1usize, MAX_SENTENCE_FRAMES);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if voice.fits(mid, 1) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        voice.max_frames = lo;
        Ok(voice)
    }

    /// Whether `batch` sentences of `frames` frames fit in one submission's
    /// buffers and dispatches: the flow's largest activation (a WaveNet
    /// layer's 2 hidden channels) and the prior's noise, and the
    /// generator's.
    fn fits(&self, frames: usize, batch: usize) -> bool {
        let gpu = self.gpu();
        let limit = gpu.caps.max_binding.min(gpu.caps.max_buffer);
        let per_frame = self
            .flow
            .couplings
            .iter()
            .map(|c| 2 * c.hidden)
            .chain([2 * self.flow.half])
            .max()
            .unwrap_or(1) as u64
            * 4;
        frames as u64 * batch as u64 * per_frame <= limit && self.dec.fits(frames, batch)
    }

    /// Makes a sentence's buffers first for `frames_per_id` frames a phoneme
    /// id and unit of length scale, plus one an id, and at least
    /// `min_frames` frames: less makes for less memory and noise drawn, and
    /// more sentences run again.
    pub fn with_first_frames(mut self, frames_per_id: f32, min_frames: usize) -> GpuVoice {
        self.frames_per_id = frames_per_id;
        self.min_frames = min_frames.max(1);
        self
    }

    /// Runs at most `batch` sentences (at least 1) of a text in the same
    /// dispatches ([`GpuVoice::speak`]); 1 runs each alone.
    pub fn with_batch(mut self, batch: usize) -> GpuVoice {
        self.batch = batch.max(1);
        self
    }

    /// How many sentences needed more frames than their buffers were first
    /// made for, and were run again.
    pub fn reruns(&self) -> usize {
        self.reruns.load(Ordering::Relaxed)
    }

    /// The most frames a sentence may last on this adapter.
    pub fn max_frames(&self) -> usize {
        self.max_frames
    }

    /// The frames a sentence of `t` ids is given buffers for at first.
    fn first_cap(&self, t: usize, scales: &Scales) -> usize {
        let guess = (t as f32 * (self.frames_per_id * scales.length_scale + 1.0)).ceil() as usize;
        guess.max(self.min_frames).min(self.max_frames)
    }

    /// Records a group of sentences (ids, and each one's generator before
    /// its draws) up to the latent z_p (its halves once `work` runs) for
    /// buffers of `count.cap` frames each: their priors in the same
    /// dispatches, each with its duration noise, then each one's durations
    /// and frame count, then its length regulation with the prior's noise,
    /// all drawn from its generator as the CPU draws them (the prior's for
    /// the cap, of which the kernels read the start).
    #[allow(clippy::too_many_arguments)]
    fn record_prior(
        &self,
        v: &Vits,
        sentences: &[(&[i64], Rng)],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        count: &FrameCount,
        work: &mut Vec<Dispatch>,
    ) -> Result<GroupPrior> {
        let gpu = self.gpu();
        let mut noises = Vec::new();
        let mut rngs = Vec::new();
        for (ids, rng) in sentences {
            let t = v.check_ids(ids)?.len();
            let mut rng = rng.clone();
            noises.push(duration_noise(t, scales, &mut rng));
            rngs.push(rng);
        }
        let inputs: Vec<(&[i64], &[f32])> = sentences
            .iter()
            .zip(&noises)
            .map(|((ids, _), n)| (*ids, n.as_slice()))
            .collect();
        let p = self.prior.record(v, &inputs, speaker, work)?;
        let prior_end = work.len();
        let (m, inv) = self.prior.affine();
        let mut ends = Vec::new();
        for (s, t) in p.ts.iter().enumerate() {
            let e = gpu.scratch("prior.ends", (t * 4) as u64)?;
            work.push(speech::durations(
                gpu,
                p.z(s),
                &e,
                count,
                s,
                *t,
                m,
                inv,
                scales.length_scale,
            )?);
            ends.push(e);
        }
        let c = v.inter_channels;
        let half = c / 2;
        let frames = count.steps(1, 0);
        let a = gpu.scratch("flow.z", frames.bytes(half))?;
        let b = gpu.scratch("flow.z", frames.bytes(half))?;
        for (s, (t, rng)) in p.ts.iter().zip(&mut rngs).enumerate() {
            let noise = gpu.upload_f32("prior.noise", &rng.normals(c * count.cap))?;
            for (ch0, y) in [(0, &a), (half, &b)] {
                work.push(speech::expand_prior(
                    gpu,
                    p.stats(s),
                    &ends[s],
                    &noise,
                    y,
                    c,
                    ch0,
                    half,
                    *t,
                    frames.sentence(s),
                    scales.noise_scale,
                )?);
            }
        }
        Ok(GroupPrior {
            a,
            b,
            ends,
            prior_end,
        })
    }

    /// Queues a group of sentences with buffers for `cap` frames each, each
    /// one's noise drawn from a copy of its generator: one submission that
    /// copies back [frames, total] a sentence and their audio.
    fn queue(
        &self,
        v: &Vits,
        sentences: &[(&[i64], Rng)],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        cap: usize,
    ) -> Result<QueuedGroup> {
        let r = self.record_group(v, sentences, speaker, scales, cap)?;
        Ok(self.submit(r))
    }

    /// Submits a recorded group.
    fn submit(&self, r: RecordedGroup) -> QueuedGroup {
        QueuedGroup {
            out: self.gpu().submit_recorded(r.commands),
            cap: r.cap,
            stride: r.stride,
            rngs: r.rngs,
            timer: r.timer,
            recording: r.recording,
            submitted: Instant::now(),
        }
    }

    /// [`GpuVoice::queue`]'s command buffer, recorded (on any thread), not
    /// submitted.
    fn record_group(
        &self,
        v: &Vits,
        sentences: &[(&[i64], Rng)],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        cap: usize,
    ) -> Result<RecordedGroup> {
        let started = Instant::now();
        let gpu = self.gpu();
        let n = sentences.len();
        let count = FrameCount::batch(gpu, cap, n)?;
        let mut work = Vec::new();
        let p = self.record_prior(v, sentences, speaker, scales, &count, &mut work)?;
        let regulation_end = work.len();
        let frames = count.steps(1, 0);
        let (a, b) = self.flow.record(p.a, p.b, frames, speaker, &mut work)?;
        let flow_end = work.len();
        let (out, stride) =
            self.dec
                .record(&a, &b, frames, speaker.map(|s| s.dec.as_slice()), &mut work)?;
        count.finish(gpu);
        let samples = n * stride;
        // Timestamps at the stages' ends, where the adapter has them.
        let marks = [0, p.prior_end, regulation_end, flow_end, work.len()];
        let timer = if gpu.caps.timestamps {
            Some(PassTimer::new(gpu, marks.len() as u32)?)
        } else {
            None
        };
        let commands = gpu.record_and_copy_all(
            &work.iter().collect::<Vec<_>>(),
            &[(&count.lens, (8 * n) as u64), (&out, (samples * 4) as u64)],
            timer.as_ref().map(|t| (t, &marks[..])),
        );
        Ok(RecordedGroup {
            commands,
            cap,
            stride,
            rngs: sentences.iter().map(|(_, r)| r.clone()).collect(),
            timer,
            recording: started.elapsed(),
        })
    }

    /// A queued group's audio, a sentence, once the device is done, and
    /// where its time went (the group's, shared evenly by its sentences). A
    /// sentence that needed more frames than its buffers hold (the device
    /// then ran only its prior) is run again alone with buffers of its size
    /// (the same noise, so the same audio), or refused past what the
    /// adapter takes.
    fn read(
        &self,
        v: &Vits,
        sentences: &[&[i64]],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        q: QueuedGroup,
    ) -> Result<Vec<(Vec<f32>, StageSeconds)>> {
        let n = sentences.len();
        let submission = q.out.submission();
        let bytes = self.gpu().read_queued(q.out)?;
        let lens: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes[..8 * n]);
        let device = match &q.timer {
            Some(timer) => {
                let ns = timer.read(self.gpu(), 5, submission)?;
                let s = |i: usize| (ns[i + 1] - ns[i]).max(0.0) * 1e-9 / n as f64;
                Some(DeviceSeconds {
                    prior: s(0),
                    regulation: s(1),
                    flow: s(2),
                    decoder: s(3),
                })
            }
            None => None,
        };
        let stages = StageSeconds {
            prior: q.recording.as_secs_f64() / n as f64,
            flow_and_decoder: q.submitted.elapsed().as_secs_f64(),
            device,
        };
        let hop = self.dec.cpu.hop();
        let mut out = Vec::with_capacity(n);
        for (s, ids) in sentences.iter().enumerate() {
            let (frames, total) = (lens[2 * s] as usize, lens[2 * s + 1] as usize);
            if total > q.cap {
                if total > self.max_frames {
                    return Err(too_many_frames(
                        ids.len(),
                        total as u64,
                        self.max_frames,
                        "GPU path (its buffers and dispatches on this adapter)",
                    ));
                }
                self.reruns.fetch_add(1, Ordering::Relaxed);
                let alone = [(*ids, q.rngs[s].clone())];
                let again = self.queue(v, &alone, speaker, scales, total)?;
                out.extend(self.read(v, &[ids], speaker, scales, again)?);
                continue;
            }
            let at = 8 * n + s * q.stride * 4;
            let audio = bytemuck::pod_collect_to_vec(&bytes[at..at + frames * hop * 4]);
            out.push((audio, stages));
        }
        Ok(out)
    }

    /// [`Vits::prior`] on the device: the latent z_p read back, with the
    /// durations the device computed (for per-stage parity;
    /// [`GpuVoice::synthesize`] keeps them on the device). The noise is
    /// drawn from `rng` as the CPU draws it.
    pub fn prior(
        &self,
        v: &Vits,
        ids: &[i64],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &Rng,
    ) -> Result<Latent> {
        let gpu = self.gpu();
        let t = v.check_ids(ids)?.len();
        let mut cap = self.first_cap(t, scales);
        loop {
            let count = FrameCount::new(gpu, cap)?;
            let mut work = Vec::new();
            let p =
                self.record_prior(v, &[(ids, rng.clone())], speaker, scales, &count, &mut work)?;
            count.finish(gpu);
            gpu.run_all(&work.iter().collect::<Vec<_>>())?;
            let lens = gpu.read_u32(&count.lens)?;
            let (frames, total) = (lens[0] as usize, lens[1] as usize);
            if total > cap {
                if total > self.max_frames {
                    return Err(too_many_frames(
                        t,
                        total as u64,
                        self.max_frames,
                        "GPU path",
                    ));
                }
                cap = total;
                continue;
            }
            let ends = gpu.read_u32(&p.ends[0])?;
            let durations = (0..t)
                .map(|j| (ends[j] - if j > 0 { ends[j - 1] } else { 0 }) as usize)
                .collect();
            let n = v.inter_channels / 2 * frames;
            let mut z = gpu.read_f32(&p.a)?;
            z.truncate(n);
            z.extend_from_slice(&gpu.read_f32(&p.b)?[..n]);
            return Ok(Latent {
                z,
                frames,
                durations,
            });
        }
    }

    /// Phoneme ids -> audio in one submission, as [`Vits::synthesize`]
    /// computes it on the CPU with the same noise (drawn on the host from
    /// `rng` in the same order), and where the time went. `v` is the voice
    /// this was made from.
    pub fn synthesize(
        &self,
        v: &Vits,
        ids: &[i64],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &Rng,
    ) -> Result<(Vec<f32>, StageSeconds)> {
        let t = v.check_ids(ids)?.len();
        let q = self.queue(
            v,
            &[(ids, rng.clone())],
            speaker,
            scales,
            self.first_cap(t, scales),
        )?;
        let mut out = self.read(v, &[ids], speaker, scales, q)?;
        Ok(out.remove(0))
    }

    /// Speaks `sentences` in order, handing each one's audio to `emit` as
    /// soon as it is back, as [`GpuVoice::synthesize`] computes it with a
    /// generator of its own ([`super::sentence_rng`], drawn from `rng` in
    /// sentence order). The first sentence runs alone; the next ones in
    /// groups of up to [`GpuVoice::with_batch`]'s count (those whose
    /// buffers fit together), each group in the same dispatches. The device
    /// is kept ahead of the host: the next groups are queued behind the one
    /// whose audio is awaited, so the host's recording, emitting and
    /// waiting overlap the device's work. The first sentence's audio is
    /// what a listener waits for: nothing is queued behind it, and the
    /// group after it is recorded on another thread while it is read and
    /// emitted.
    pub fn speak<T: AsRef<[i64]> + Sync>(
        &self,
        v: &Vits,
        sentences: &mut dyn Iterator<Item = Result<T>>,
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
        emit: &mut dyn FnMut(T, Vec<f32>, StageSeconds) -> Result<()>,
    ) -> Result<()> {
        let mut ahead = VecDeque::new();
        let mut next = None;
        let Some((items, rngs, cap)) = self.take_group(sentences, &mut next, scales, rng, 1)?
        else {
            return Ok(());
        };
        let q = self.queue(v, &with_rngs(&items, &rngs), speaker, scales, cap)?;
        // An error in the sentences after the first comes after its audio.
        let following = self.take_group(sentences, &mut next, scales, rng, self.batch);
        let (first, recorded) = overlap(
            || -> Result<()> {
                let ids: Vec<&[i64]> = items.iter().map(|i| i.as_ref()).collect();
                let out = self.read(v, &ids, speaker, scales, q)?;
                for (item, (audio, stages)) in items.into_iter().zip(out) {
                    emit(item, audio, stages)?;
                }
                Ok(())
            },
            || match &following {
                Ok(Some((items, rngs, cap))) => self
                    .record_group(v, &with_rngs(items, rngs), speaker, scales, *cap)
                    .map(Some),
                _ => Ok(None),
            },
        );
        first?;
        if let (Some((items, _, _)), Some(r)) = (following?, recorded?) {
            ahead.push_back((items, self.submit(r)));
        }
        loop {
            while ahead.len() < GROUPS_AHEAD {
                let Some((items, rngs, cap)) =
                    self.take_group(sentences, &mut next, scales, rng, self.batch)?
                else {
                    break;
                };
                let q = self.queue(v, &with_rngs(&items, &rngs), speaker, scales, cap)?;
                ahead.push_back((items, q));
            }
            let Some((items, q)) = ahead.pop_front() else {
                break;
            };
            let ids: Vec<&[i64]> = items.iter().map(|i| i.as_ref()).collect();
            let out = self.read(v, &ids, speaker, scales, q)?;
            for (item, (audio, stages)) in items.into_iter().zip(out) {
                emit(item, audio, stages)?;
            }
        }
        Ok(())
    }

    /// The next up to `most` sentences (`next`, then `sentences`) whose
    /// buffers fit together, each given its generator from `rng` in order;
    /// None when none are left. A sentence that does not fit with those
    /// before it is left in `next` for the next group.
    fn take_group<T: AsRef<[i64]>>(
        &self,
        sentences: &mut dyn Iterator<Item = Result<T>>,
        next: &mut Option<T>,
        scales: &Scales,
        rng: &mut Rng,
        most: usize,
    ) -> Result<Option<Group<T>>> {
        let mut items: Vec<T> = Vec::new();
        let mut rngs = Vec::new();
        let (mut cap, mut ids) = (0, 0);
        while items.len() < most {
            let item = match next.take() {
                Some(item) => item,
                None => match sentences.next() {
                    Some(item) => item?,
                    None => break,
                },
            };
            let c = cap.max(self.first_cap(item.as_ref().len(), scales));
            let t = ids.max(item.as_ref().len());
            let n = items.len() + 1;
            if n > 1 && !(self.fits(c, n) && self.prior.fits(t, n)) {
                *next = Some(item);
                break;
            }
            (cap, ids) = (c, t);
            rngs.push(super::sentence_rng(rng));
            items.push(item);
        }
        Ok((!items.is_empty()).then_some((items, rngs, cap)))
    }

    pub fn gpu(&self) -> &Gpu {
        &self.flow.gpu
    }
}

/// A group's sentences with their generators, as [`GpuVoice::queue`] takes them.
fn with_rngs<'a, T: AsRef<[i64]>>(items: &'a [T], rngs: &[Rng]) -> Vec<(&'a [i64], Rng)> {
    items
        .iter()
        .map(|i| i.as_ref())
        .zip(rngs.iter().cloned())
        .collect()
}

/// Runs `side` on another thread while `main` runs on this one (after it,
/// where there are no threads), and returns both results.
fn overlap<A, B: Send>(main: impl FnOnce() -> A, side: impl FnOnce() -> B + Send) -> (A, B) {
    if cfg!(target_arch = "wasm32") {
        let a = main();
        return (a, side());
    }
    std::thread::scope(|s| {
        let h = s.spawn(side);
        let a = main();
        let b = h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        (a, b)
    })
}
