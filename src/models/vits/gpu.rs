//! The GPU plan for VITS: the normalising flow (per frame) and the HiFi-GAN
//! generator (per audio sample; together nearly all of the work), after the
//! prior (`gpu_prior`) and the length regulation with its noise (drawn from
//! the seeded CPU generator, so a seed gives the same noise on both
//! backends): two submissions per sentence, the first reading back only the
//! durations, with the sentences of a text pipelined ([`GpuVoice::speak`]).
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

use super::gpu_prior::QueuedPrior;
use super::{
    duration_noise, durations, no_frames_prior, prior_noise, Conv, ConvT, Coupling, Generator,
    GpuPrior, Latent, Scales, SpeakerOffsets, StageSeconds, Vits, LRELU_SLOPE, LRELU_SLOPE_POST,
};
use crate::cpu::Conv1dShape;
use crate::error::{Error, Result};
use crate::gpu::ops::{self, Dispatch};
use crate::gpu::speech::{self, Conv1dExtras, InputAct};
use crate::gpu::Gpu;
use crate::util::rng::Rng;
use std::sync::Arc;
use web_time::Instant;

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
        let out = self.record(&a, &b, frames, speaker, &mut work)?;
        gpu.run_all(&work.iter().collect::<Vec<_>>())?;
        let mut audio = gpu.read_f32(&out)?;
        audio.truncate(frames * self.cpu.hop());
        Ok(audio)
    }

    /// Records the generator on the latent's halves a, b: [inter / 2,
    /// frames] each; returns the buffer the audio will be in.
    fn record(
        &self,
        a: &wgpu::Buffer,
        b: &wgpu::Buffer,
        frames: usize,
        speaker: Option<&[f32]>,
        work: &mut Vec<Dispatch>,
    ) -> Result<wgpu::Buffer> {
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
        let bytes = (g.conv_pre.shape.c_out * t * 4) as u64;
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
                tanh: false,
            },
        )?);
        // The average over a stage's residual blocks is folded into the next
        // layer's input scale: leaky_relu(s * v) = s * leaky_relu(v) for s > 0.
        let mut in_scale = 1.0f32;
        for (si, (up, blocks)) in g.ups.iter().zip(&g.resblocks).enumerate() {
            let t_up = up.shape.t_out(t);
            let c = up.shape.c_out;
            let bytes = (c * t_up * 4) as u64;
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
            // The blocks' outputs are summed into fresh buffers (a dispatch
            // cannot read and write the same buffer).
            let mut sum: Option<wgpu::Buffer> = None;
            for (bi, convs) in blocks.iter().enumerate() {
                // x_b = x_b + conv(leaky(x_b)) for each conv, starting from u.
                let mut cur: Option<wgpu::Buffer> = None;
                for (ci, c) in convs.iter().enumerate() {
                    let input = cur.as_ref().unwrap_or(&u);
                    let out = gpu.scratch("dec.block", bytes)?;
                    let w = &self.resblocks[si][bi][ci];
                    work.push(speech::conv1d(
                        gpu,
                        input,
                        &w.w,
                        &w.b,
                        &out,
                        &c.shape,
                        t,
                        InputAct::leaky(LRELU_SLOPE),
                        Conv1dExtras {
                            residual: Some(input),
                            tanh: false,
                        },
                    )?);
                    cur = Some(out);
                }
                let block_out = cur.unwrap_or_else(|| u.clone());
                sum = Some(match sum {
                    None => block_out,
                    Some(prev) => {
                        let next = gpu.scratch("dec.sum", bytes)?;
                        work.push(ops::add(gpu, &prev, &block_out, &next, c * t)?);
                        next
                    }
                });
            }
            in_scale = 1.0 / blocks.len() as f32;
            x = sum.unwrap_or(u);
        }
        let out = gpu.scratch("dec.audio", (t * 4) as u64)?;
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
                residual: None,
                tanh: true,
            },
        )?);
        Ok(out)
    }
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
        let (a, b) = self.upload(z)?;
        let mut work = Vec::new();
        let (a, b) = self.record(a, b, frames, speaker, &mut work)?;
        gpu.run_all(&work.iter().collect::<Vec<_>>())?;
        let n = self.half * frames;
        let mut out = gpu.read_f32(&a)?;
        out.truncate(n);
        out.extend_from_slice(&gpu.read_f32(&b)?[..n]);
        Ok(out)
    }

    /// z: [inter_channels, t] as its two halves on the device.
    fn upload(&self, z: &[f32]) -> Result<(wgpu::Buffer, wgpu::Buffer)> {
        let n = z.len() / 2;
        Ok((
            self.gpu.upload_f32("flow.z.0", &z[..n])?,
            self.gpu.upload_f32("flow.z.1", &z[n..])?,
        ))
    }

    /// Records the reverse flow on halves (a, b); returns the new halves.
    fn record(
        &self,
        mut a: wgpu::Buffer,
        mut b: wgpu::Buffer,
        t: usize,
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
            let bytes = (hidden * t * 4) as u64;
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
                        tanh: false,
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
            let x1_next = gpu.scratch("flow.z", (self.half * t * 4) as u64)?;
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
/// and duration predictor, one submission that reads back the durations),
/// then the length regulation with the prior's noise, the flow and the
/// generator (a second submission that reads back the audio).
pub struct GpuVoice {
    pub prior: GpuPrior,
    pub flow: GpuFlow,
    pub dec: GpuGenerator,
}

/// How many sentences' priors [`GpuVoice::speak`] keeps queued ahead of
/// the sentence whose audio it is recording: enough that a prior's
/// durations are back before its audio is recorded, while the device still
/// works on the audio before it.
const PRIORS_AHEAD: usize = 2;

/// A sentence's audio on the device queue.
struct QueuedAudio {
    out: ops::Queued,
    samples: usize,
    /// When the prior was queued and when its durations were back.
    prior_queued: Instant,
    prior_ready: Instant,
}

impl GpuVoice {
    pub fn new(gpu: Arc<Gpu>, v: &Vits) -> Result<GpuVoice> {
        Ok(GpuVoice {
            prior: GpuPrior::new(gpu.clone(), v)?,
            flow: GpuFlow::new(gpu.clone(), v)?,
            dec: GpuGenerator::new(gpu, &v.dec)?,
        })
    }

    /// Queues the prior of `ids` on the device, its duration noise drawn
    /// from `rng`.
    fn queue_prior(
        &self,
        v: &Vits,
        ids: &[i64],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
    ) -> Result<(QueuedPrior, Instant)> {
        let queued = Instant::now();
        let noise = duration_noise(ids.len(), scales, rng);
        Ok((self.prior.queue(v, ids, &noise, speaker)?, queued))
    }

    /// Waits for a queued prior's durations and records the length
    /// regulation into `work`, the prior's noise drawn from `rng`: the
    /// latent z_p's halves once `work` runs, its frames and the durations.
    fn regulate(
        &self,
        v: &Vits,
        p: QueuedPrior,
        scales: &Scales,
        rng: &mut Rng,
        work: &mut Vec<Dispatch>,
    ) -> Result<(wgpu::Buffer, wgpu::Buffer, Latent)> {
        let gpu = self.gpu();
        let t = p.t;
        let logw = self.prior.log_durations(&gpu.read_queued(p.z)?, t);
        let durations = durations(&logw, scales.length_scale);
        let (idx, noise) = prior_noise(&durations, v.inter_channels, rng);
        let c = v.inter_channels;
        let half = c / 2;
        let frames = idx.len().max(1);
        let (a, b) = if idx.is_empty() {
            self.flow
                .upload(&no_frames_prior(&noise, scales.noise_scale))?
        } else {
            let gi = gpu.upload_u32("prior.idx", &idx)?;
            let gn = gpu.upload_f32("prior.noise", &noise)?;
            let mut half_buffer = |ch0: usize| -> Result<wgpu::Buffer> {
                let y = gpu.scratch("flow.z", (half * frames * 4) as u64)?;
                work.push(speech::expand_prior(
                    gpu,
                    &p.stats,
                    &gi,
                    &gn,
                    &y,
                    c,
                    ch0,
                    half,
                    t,
                    frames,
                    scales.noise_scale,
                )?);
                Ok(y)
            };
            (half_buffer(0)?, half_buffer(half)?)
        };
        let lat = Latent {
            z: Vec::new(),
            frames,
            durations,
        };
        Ok((a, b, lat))
    }

    /// Waits for a queued prior's durations, then queues the length
    /// regulation (its noise drawn from `rng`), the flow and the generator
    /// as one submission whose audio comes back with
    /// [`GpuVoice::read_audio`].
    fn queue_audio(
        &self,
        v: &Vits,
        (p, prior_queued): (QueuedPrior, Instant),
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
    ) -> Result<QueuedAudio> {
        let mut work = Vec::new();
        let (a, b, lat) = self.regulate(v, p, scales, rng, &mut work)?;
        let prior_ready = Instant::now();
        let (a, b) = self.flow.record(a, b, lat.frames, speaker, &mut work)?;
        let out = self.dec.record(
            &a,
            &b,
            lat.frames,
            speaker.map(|s| s.dec.as_slice()),
            &mut work,
        )?;
        let samples = lat.frames * self.dec.cpu.hop();
        let out =
            self.gpu()
                .queue_and_copy(&work.iter().collect::<Vec<_>>(), &out, (samples * 4) as u64);
        Ok(QueuedAudio {
            out,
            samples,
            prior_queued,
            prior_ready,
        })
    }

    /// A queued sentence's audio once the device is done, and where its
    /// time went.
    fn read_audio(&self, a: QueuedAudio) -> Result<(Vec<f32>, StageSeconds)> {
        let bytes = self.gpu().read_queued(a.out)?;
        let mut audio: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
        audio.truncate(a.samples);
        let stages = StageSeconds {
            prior: (a.prior_ready - a.prior_queued).as_secs_f64(),
            flow_and_decoder: a.prior_ready.elapsed().as_secs_f64(),
        };
        Ok((audio, stages))
    }

    /// [`Vits::prior`] on the device: the latent z_p read back (for
    /// per-stage parity; [`GpuVoice::synthesize`] keeps it on the device).
    pub fn prior(
        &self,
        v: &Vits,
        ids: &[i64],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
    ) -> Result<Latent> {
        let gpu = self.gpu();
        let (p, _) = self.queue_prior(v, ids, speaker, scales, rng)?;
        let mut work = Vec::new();
        let (a, b, mut lat) = self.regulate(v, p, scales, rng, &mut work)?;
        let n = v.inter_channels / 2 * lat.frames;
        if !work.is_empty() {
            gpu.run_all(&work.iter().collect::<Vec<_>>())?;
        }
        lat.z = gpu.read_f32(&a)?;
        lat.z.truncate(n);
        lat.z.extend_from_slice(&gpu.read_f32(&b)?[..n]);
        Ok(lat)
    }

    /// Phoneme ids -> audio, as [`Vits::synthesize`] computes it on the
    /// CPU, with the same noise from `rng` (drawn on the host in the same
    /// order), and where the time went. `v` is the voice this was made from.
    pub fn synthesize(
        &self,
        v: &Vits,
        ids: &[i64],
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
    ) -> Result<(Vec<f32>, StageSeconds)> {
        let p = self.queue_prior(v, ids, speaker, scales, rng)?;
        let a = self.queue_audio(v, p, speaker, scales, rng)?;
        self.read_audio(a)
    }

    /// Speaks `sentences` in order, handing each one's audio to `emit` as
    /// soon as it is back, as [`GpuVoice::synthesize`] computes it with a
    /// generator of its own ([`super::sentence_rng`], drawn from `rng` in
    /// sentence order). The device is kept ahead of the host: the priors of
    /// the next sentences are queued behind the audio of this one, and a
    /// sentence's audio is recorded while the device still works on the
    /// one before, so the host's recording and waiting overlap the device's
    /// work instead of adding to it.
    pub fn speak<T: AsRef<[i64]>>(
        &self,
        v: &Vits,
        sentences: &mut dyn Iterator<Item = Result<T>>,
        speaker: Option<&SpeakerOffsets>,
        scales: &Scales,
        rng: &mut Rng,
        emit: &mut dyn FnMut(T, Vec<f32>, StageSeconds) -> Result<()>,
    ) -> Result<()> {
        let mut ahead = std::collections::VecDeque::new();
        let mut sounding: Option<(T, QueuedAudio)> = None;
        loop {
            while ahead.len() < PRIORS_AHEAD {
                let Some(item) = sentences.next() else { break };
                let item = item?;
                let mut own = super::sentence_rng(rng);
                let p = self.queue_prior(v, item.as_ref(), speaker, scales, &mut own)?;
                ahead.push_back((item, p, own));
            }
            let Some((item, p, mut own)) = ahead.pop_front() else {
                break;
            };
            let queued = self.queue_audio(v, p, speaker, scales, &mut own)?;
            if let Some((done, a)) = sounding.replace((item, queued)) {
                let (audio, stages) = self.read_audio(a)?;
                emit(done, audio, stages)?;
            }
        }
        if let Some((done, a)) = sounding {
            let (audio, stages) = self.read_audio(a)?;
            emit(done, audio, stages)?;
        }
        Ok(())
    }

    pub fn gpu(&self) -> &Gpu {
        &self.flow.gpu
    }
}
