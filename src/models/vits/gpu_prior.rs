//! The GPU plan for VITS's prior: the text encoder (relative-position
//! attention transformer, conv FFNs, layer norms, the projection to the
//! prior's mean and log-std) and the stochastic duration predictor run in
//! reverse (depthwise-separable conv stacks, three spline flows). Recorded
//! at the head of a group of sentences' one submission
//! ([`super::GpuVoice::synthesize`], [`super::GpuVoice::speak`]), the
//! group's sentences in the same dispatches (a batch: each sentence a slice
//! of workgroups along z, reading its own number of phoneme ids from a
//! count the host writes, its activations at its index times a stride, so
//! it gets the bits it gets alone): the prior's mean and log-std and the
//! duration channel stay on the device for the length regulation.
//!
//! The noise is drawn on the host from the seeded generator in the CPU
//! reference's order, so a seed gives the same noise on both backends.

use super::gpu::GpuConv;
use super::{Conv, DdsConv, LayerNorm, SpeakerOffsets, Vits, LN_EPS};
use crate::cpu::Conv1dShape;
use crate::error::{Error, Result};
use crate::gpu::ops::Dispatch;
use crate::gpu::speech::{self, Conv1dExtras, FrameCount, InputAct, Steps};
use crate::gpu::Gpu;
use std::sync::Arc;

/// A dense convolution on the device with its shape.
struct DenseConv {
    gpu: GpuConv,
    shape: Conv1dShape,
}

impl DenseConv {
    fn new(gpu: &Gpu, name: &str, c: &Conv) -> Result<DenseConv> {
        if c.shape.groups != 1 {
            return Err(Error::gpu(format!("{name}: a grouped convolution")));
        }
        Ok(DenseConv {
            gpu: GpuConv::conv(gpu, name, c)?,
            shape: c.shape,
        })
    }

    /// y = conv(act(x)) + bias + residual, x: [c_in, t].
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        bias: Option<&wgpu::Buffer>,
        t: Steps<'_>,
        act: InputAct,
        residual: Option<&wgpu::Buffer>,
        work: &mut Vec<Dispatch>,
        label: &str,
    ) -> Result<wgpu::Buffer> {
        let y = gpu.scratch(label, t.conv(&self.shape).bytes(self.shape.c_out))?;
        work.push(speech::conv1d(
            gpu,
            x,
            &self.gpu.w,
            bias.unwrap_or(&self.gpu.b),
            &y,
            &self.shape,
            t,
            act,
            Conv1dExtras {
                residual,
                ..Default::default()
            },
        )?);
        Ok(y)
    }
}

struct GpuNorm {
    gamma: wgpu::Buffer,
    beta: wgpu::Buffer,
}

impl GpuNorm {
    fn new(gpu: &Gpu, name: &str, n: &LayerNorm) -> Result<GpuNorm> {
        Ok(GpuNorm {
            gamma: gpu.upload_f32(&format!("{name}.gamma"), &n.gamma)?,
            beta: gpu.upload_f32(&format!("{name}.beta"), &n.beta)?,
        })
    }

    /// act(norm(x)) + res over x: [c, t].
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        c: usize,
        t: Steps<'_>,
        gelu: bool,
        res: Option<&wgpu::Buffer>,
        work: &mut Vec<Dispatch>,
    ) -> Result<wgpu::Buffer> {
        let y = gpu.scratch("prior.norm", t.bytes(c))?;
        work.push(speech::layer_norm_channels(
            gpu,
            x,
            &self.gamma,
            &self.beta,
            res,
            &y,
            c,
            t,
            LN_EPS,
            gelu,
        )?);
        Ok(y)
    }
}

struct EncoderLayer {
    /// conv_q, conv_k, conv_v as one convolution: [3 hidden, hidden, 1].
    qkv: DenseConv,
    rel_k: wgpu::Buffer,
    rel_v: wgpu::Buffer,
    o: DenseConv,
    norm1: GpuNorm,
    ffn1: DenseConv,
    ffn2: DenseConv,
    norm2: GpuNorm,
}

/// One DDSConv layer: depthwise conv, norm + GELU, 1x1 conv, norm + GELU,
/// residual.
struct DdsLayer {
    sep_w: wgpu::Buffer,
    sep_b: wgpu::Buffer,
    sep: Conv1dShape,
    norm1: GpuNorm,
    pointwise: DenseConv,
    norm2: GpuNorm,
}

struct GpuDds {
    layers: Vec<DdsLayer>,
}

impl GpuDds {
    fn new(gpu: &Gpu, name: &str, d: &DdsConv) -> Result<GpuDds> {
        let mut layers = Vec::new();
        for i in 0..d.sep.len() {
            let sep = &d.sep[i];
            let s = sep.shape;
            if s.groups != s.c_in || s.c_in != s.c_out {
                return Err(Error::gpu(format!(
                    "{name}.convs_sep.{i}: not a depthwise convolution"
                )));
            }
            layers.push(DdsLayer {
                sep_w: gpu.upload_f32(&format!("{name}.sep.{i}.weight"), &sep.w)?,
                sep_b: gpu.upload_f32(
                    &format!("{name}.sep.{i}.bias"),
                    &sep.b.clone().unwrap_or_else(|| vec![0.0; s.c_out]),
                )?,
                sep: s,
                norm1: GpuNorm::new(gpu, name, &d.norms1[i])?,
                pointwise: DenseConv::new(gpu, name, &d.pointwise[i])?,
                norm2: GpuNorm::new(gpu, name, &d.norms2[i])?,
            });
        }
        Ok(GpuDds { layers })
    }

    /// x: [c, t] -> the stack's output (a new buffer).
    fn record(
        &self,
        gpu: &Gpu,
        mut x: wgpu::Buffer,
        t: Steps<'_>,
        work: &mut Vec<Dispatch>,
    ) -> Result<wgpu::Buffer> {
        for l in &self.layers {
            let c = l.sep.c_out;
            if l.sep.t_out(t.max()) != t.max() {
                return Err(Error::gpu("DDSConv: a layer changes the length"));
            }
            let y = gpu.scratch("dp.sep", t.bytes(c))?;
            work.push(speech::conv1d_depthwise(
                gpu, &x, &l.sep_w, &l.sep_b, &y, &l.sep, t,
            )?);
            let y = l.norm1.record(gpu, &y, c, t, true, None, work)?;
            let y = l
                .pointwise
                .record(gpu, &y, None, t, InputAct::NONE, None, work, "dp.1x1")?;
            x = l.norm2.record(gpu, &y, c, t, true, Some(&x), work)?;
        }
        Ok(x)
    }
}

/// A spline coupling of the duration predictor (`ConvFlow`).
struct GpuConvFlow {
    pre: DenseConv,
    dds: GpuDds,
    proj: DenseConv,
    bins: usize,
    norm: f32,
}

/// The text encoder and the duration predictor on the device.
pub struct GpuPrior {
    gpu: Arc<Gpu>,
    /// The phoneme embeddings, [vocab, hidden].
    emb: wgpu::Buffer,
    embed_scale: f32,
    hidden: usize,
    heads: usize,
    dk: usize,
    /// The most channels an activation has.
    widest: usize,
    window: usize,
    layers: Vec<EncoderLayer>,
    proj: DenseConv,
    dp_pre: DenseConv,
    /// dp.pre's bias (the speaker's offset is added to it per call).
    dp_pre_bias: Vec<f32>,
    dp_dds: GpuDds,
    dp_proj: DenseConv,
    /// In the order inference applies them.
    flows: Vec<GpuConvFlow>,
    /// The affine flow's mean and exp(-logs) on the log-duration channel.
    affine: (f32, f32),
}

impl GpuPrior {
    pub fn new(gpu: Arc<Gpu>, v: &Vits) -> Result<GpuPrior> {
        let g = &*gpu;
        let enc = &v.enc;
        let first = &enc.layers[0].attn;
        let (dk, window) = (first.k_channels, first.window);
        if dk > speech::REL_ATTENTION_MAX_DK {
            return Err(Error::gpu(format!(
                "attention heads of {dk} channels; the GPU kernel takes up to {}",
                speech::REL_ATTENTION_MAX_DK
            )));
        }
        let mut layers = Vec::new();
        for (i, l) in enc.layers.iter().enumerate() {
            let a = &l.attn;
            if a.k_channels != dk || a.window != window {
                return Err(Error::gpu("encoder layers with different attention shapes"));
            }
            let qkv = Conv::new(
                [a.q.w.as_slice(), &a.k.w, &a.v.w].concat(),
                Some(
                    [&a.q, &a.k, &a.v]
                        .iter()
                        .flat_map(|c| c.b.clone().unwrap_or_else(|| vec![0.0; c.shape.c_out]))
                        .collect(),
                ),
                Conv1dShape {
                    c_out: 3 * a.q.shape.c_out,
                    ..a.q.shape
                },
            );
            if a.q.shape != a.k.shape || a.q.shape != a.v.shape || a.q.shape.kernel != 1 {
                return Err(Error::gpu("attention projections that are not 1x1 alike"));
            }
            let name = format!("enc_p.layer.{i}");
            layers.push(EncoderLayer {
                qkv: DenseConv::new(g, &format!("{name}.qkv"), &qkv)?,
                rel_k: g.upload_f32(&format!("{name}.rel_k"), &a.rel_k)?,
                rel_v: g.upload_f32(&format!("{name}.rel_v"), &a.rel_v)?,
                o: DenseConv::new(g, &format!("{name}.o"), &a.o)?,
                norm1: GpuNorm::new(g, &name, &l.norm1)?,
                ffn1: DenseConv::new(g, &format!("{name}.ffn1"), &l.ffn1)?,
                ffn2: DenseConv::new(g, &format!("{name}.ffn2"), &l.ffn2)?,
                norm2: GpuNorm::new(g, &name, &l.norm2)?,
            });
        }
        let dp = &v.dp;
        let mut flows = Vec::new();
        for (i, f) in dp.flows.iter().enumerate() {
            // The residual add reads the conditioning at pre's output shape.
            if f.pre.shape.c_out != dp.proj.shape.c_out {
                return Err(Error::gpu(format!(
                    "duration flow {i}: pre gives {} channels, the conditioning {}",
                    f.pre.shape.c_out, dp.proj.shape.c_out
                )));
            }
            let n_params = f.proj.shape.c_out;
            if n_params % 3 != 2 || (n_params + 1) / 3 > speech::SPLINE_MAX_BINS {
                return Err(Error::gpu(format!(
                    "duration flow {i}: {n_params} spline parameters (3 bins - 1, at most {} bins)",
                    speech::SPLINE_MAX_BINS
                )));
            }
            flows.push(GpuConvFlow {
                pre: DenseConv::new(g, &format!("dp.flow.{i}.pre"), &f.pre)?,
                dds: GpuDds::new(g, &format!("dp.flow.{i}.convs"), &f.dds)?,
                proj: DenseConv::new(g, &format!("dp.flow.{i}.proj"), &f.proj)?,
                bins: (n_params + 1) / 3,
                norm: f.norm(),
            });
        }
        let widest = layers
            .iter()
            .flat_map(|l| [l.qkv.shape.c_out, l.ffn1.shape.c_out])
            .chain(flows.iter().map(|f| f.proj.shape.c_out))
            .chain([enc.proj.shape.c_out, dp.pre.shape.c_out, enc.hidden])
            .max()
            .unwrap_or(1);
        Ok(GpuPrior {
            widest,
            emb: g.upload_f32("enc_p.emb", &enc.emb)?,
            embed_scale: enc.embed_scale(),
            hidden: enc.hidden,
            heads: enc.hidden / dk,
            dk,
            window,
            layers,
            proj: DenseConv::new(g, "enc_p.proj", &enc.proj)?,
            dp_pre: DenseConv::new(g, "dp.pre", &dp.pre)?,
            dp_pre_bias: dp
                .pre
                .b
                .clone()
                .unwrap_or_else(|| vec![0.0; dp.pre.shape.c_out]),
            dp_dds: GpuDds::new(g, "dp.convs", &dp.dds)?,
            dp_proj: DenseConv::new(g, "dp.proj", &dp.proj)?,
            flows,
            affine: (dp.affine_m[0], dp.affine_inv_scale[0]),
            gpu,
        })
    }

    /// [`Vits::encode`] on the device, in one submission: the text encoder
    /// and the duration predictor on phoneme ids and the duration noise [2,
    /// t]. Returns the prior's statistics, left on the device ([2
    /// inter_channels, t]: the mean, then the log-std), and the
    /// log-durations [t] (for per-stage parity; a sentence keeps them on
    /// the device). `v` is the voice this was made from.
    pub fn encode(
        &self,
        v: &Vits,
        ids: &[i64],
        noise: &[f32],
        speaker: Option<&SpeakerOffsets>,
    ) -> Result<(wgpu::Buffer, Vec<f32>)> {
        let mut work = Vec::new();
        let p = self.record(v, &[(ids, noise)], speaker, &mut work)?;
        let t = p.ts[0];
        let z = self
            .gpu
            .run_and_read(&work.iter().collect::<Vec<_>>(), &p.z, (t * 4) as u64)?;
        let z: Vec<f32> = bytemuck::pod_collect_to_vec(&z);
        let (m, inv) = self.affine;
        let logw = z[..t].iter().map(|v| (v - m) * inv).collect();
        Ok((p.stats, logw))
    }

    /// Whether `batch` sentences of up to `t` phoneme ids fit in one
    /// recording's buffers on this adapter (the attention's scores and the
    /// widest activation).
    pub(super) fn fits(&self, t: usize, batch: usize) -> bool {
        let limit = self.gpu.caps.max_binding.min(self.gpu.caps.max_buffer);
        let (t, batch) = (t as u64, batch as u64);
        t <= speech::MAX_GROUPS as u64
            && self.heads as u64 * t * t * batch * 4 <= limit
            && self.widest as u64 * t * batch * 4 <= limit
    }

    /// Records [`GpuPrior::encode`] of a group of sentences (each one's ids
    /// and duration noise) into `work`, in the same dispatches: the
    /// statistics and the duration channel once it runs.
    pub(super) fn record(
        &self,
        v: &Vits,
        sentences: &[(&[i64], &[f32])],
        speaker: Option<&SpeakerOffsets>,
        work: &mut Vec<Dispatch>,
    ) -> Result<RecordedPrior> {
        let gpu = &*self.gpu;
        let mut ts = Vec::with_capacity(sentences.len());
        for (ids, noise) in sentences {
            let t = v.check_ids(ids)?.len();
            assert_eq!(noise.len(), 2 * t, "GpuPrior::record: noise shape");
            ts.push(t);
        }
        let cap = ts.iter().copied().max().unwrap_or(0);
        if !self.fits(cap, ts.len()) {
            let scores = speech::rel_attention_scratch_bytes(self.heads, Steps::fixed(cap));
            return Err(Error::invalid(format!(
                "a sentence of {cap} phoneme ids is too long for the GPU's attention ({} MB of \
                 scores, the adapter binds {} MB); split it or use --cpu",
                scores >> 20,
                gpu.caps.max_binding >> 20
            )));
        }
        // Each sentence's ids and activations at its index times the
        // steps' stride, its length read from the count.
        let count = FrameCount::known(gpu, &ts, cap)?;
        let t = count.steps(1, 0);
        let lay = |part: &dyn Fn(usize) -> Vec<f32>| -> Vec<f32> {
            let mut all = vec![0.0; cap * ts.len()];
            for s in 0..ts.len() {
                let p = part(s);
                all[s * cap..s * cap + p.len()].copy_from_slice(&p);
            }
            all
        };
        let mut ids = vec![0u32; cap * ts.len()];
        for (s, (i, _)) in sentences.iter().enumerate() {
            for (d, &id) in ids[s * cap..].iter_mut().zip(i.iter()) {
                *d = id as u32;
            }
        }
        let ids = gpu.upload_u32("enc_p.ids", &ids)?;
        let mut h = gpu.scratch("enc_p.x", t.bytes(self.hidden))?;
        work.push(speech::embed_channels(
            gpu,
            &self.emb,
            &ids,
            &h,
            self.hidden,
            t,
            self.embed_scale,
        )?);
        let scores = gpu.scratch(
            "enc_p.scores",
            speech::rel_attention_scratch_bytes(self.heads, t),
        )?;
        let hidden = self.hidden;
        for l in &self.layers {
            let qkv = l
                .qkv
                .record(gpu, &h, None, t, InputAct::NONE, None, work, "enc_p.qkv")?;
            let att = gpu.scratch("enc_p.att", t.bytes(hidden))?;
            work.push(speech::rel_attention(
                gpu,
                &qkv,
                &l.rel_k,
                &l.rel_v,
                &scores,
                &att,
                self.heads,
                self.dk,
                self.window,
                t,
            )?);
            let y = l.o.record(
                gpu,
                &att,
                None,
                t,
                InputAct::NONE,
                Some(&h),
                work,
                "enc_p.o",
            )?;
            h = l.norm1.record(gpu, &y, hidden, t, false, None, work)?;
            let f = l
                .ffn1
                .record(gpu, &h, None, t, InputAct::NONE, None, work, "enc_p.ffn")?;
            // ReLU between the FFN's convolutions, fused into the second's read.
            let y = l.ffn2.record(
                gpu,
                &f,
                None,
                t,
                InputAct::leaky(0.0),
                Some(&h),
                work,
                "enc_p.y",
            )?;
            h = l.norm2.record(gpu, &y, hidden, t, false, None, work)?;
        }
        let stats =
            self.proj
                .record(gpu, &h, None, t, InputAct::NONE, None, work, "enc_p.stats")?;

        // The duration predictor, conditioned on the encoder's output.
        let uploaded;
        let pre_bias = match speaker {
            None => None,
            Some(s) => {
                let b: Vec<f32> = self
                    .dp_pre_bias
                    .iter()
                    .zip(&s.dp)
                    .map(|(b, o)| b + o)
                    .collect();
                uploaded = gpu.upload_f32("dp.pre.bias", &b)?;
                Some(&uploaded)
            }
        };
        let g = self
            .dp_pre
            .record(gpu, &h, pre_bias, t, InputAct::NONE, None, work, "dp.g")?;
        let g = self.dp_dds.record(gpu, g, t, work)?;
        let g = self
            .dp_proj
            .record(gpu, &g, None, t, InputAct::NONE, None, work, "dp.g")?;
        // z's two channels as separate buffers: the flips swap them.
        let noise = |ch: usize| lay(&|s| sentences[s].1[ch * ts[s]..(ch + 1) * ts[s]].to_vec());
        let mut a = gpu.upload_f32("dp.z.0", &noise(0))?;
        let mut b = gpu.upload_f32("dp.z.1", &noise(1))?;
        for f in &self.flows {
            std::mem::swap(&mut a, &mut b);
            let hf = f
                .pre
                .record(gpu, &a, None, t, InputAct::NONE, Some(&g), work, "dp.h")?;
            let hf = f.dds.record(gpu, hf, t, work)?;
            let params =
                f.proj
                    .record(gpu, &hf, None, t, InputAct::NONE, None, work, "dp.params")?;
            let next = gpu.scratch("dp.z", t.bytes(1))?;
            work.push(speech::spline_inverse(
                gpu, &b, &params, &next, f.bins, t, f.norm,
            )?);
            b = next;
        }
        count.finish(gpu);
        // The last flip: the log-duration channel is b.
        Ok(RecordedPrior {
            stats,
            stats_channels: self.proj.shape.c_out,
            z: b,
            ts,
            cap,
        })
    }

    /// The duration predictor's last flow, affine on the log-duration
    /// channel: (its mean, exp(-its log-scale)).
    pub(super) fn affine(&self) -> (f32, f32) {
        self.affine
    }
}

/// A group of sentences' prior as recorded: sentence s's values at s times
/// `cap` times their channels in each buffer.
pub(super) struct RecordedPrior {
    /// The prior's mean and log-std, [2 inter_channels, t] a sentence.
    pub stats: wgpu::Buffer,
    stats_channels: usize,
    /// The duration channel before the affine flow, [t] a sentence.
    pub z: wgpu::Buffer,
    /// Phoneme ids, a sentence.
    pub ts: Vec<usize>,
    /// The most phoneme ids of a sentence (what each is given room for).
    cap: usize,
}

impl RecordedPrior {
    /// Sentence s's statistics: the buffer, and the element they start at.
    pub fn stats(&self, s: usize) -> (&wgpu::Buffer, usize) {
        (&self.stats, s * self.stats_channels * self.cap)
    }

    /// Sentence s's duration channel: the buffer, and the element it
    /// starts at.
    pub fn z(&self, s: usize) -> (&wgpu::Buffer, usize) {
        (&self.z, s * self.cap)
    }
}
