//! The Whisper encoder on the GPU, conv stem included: im2col + matmul for
//! both convolutions (GELU fused, positions added as the matmul's residual),
//! then pre-norm layers of LayerNorm, fused-QKV matmul, attention, and
//! matmuls with bias, GELU and residual fused; the final LayerNorm; and each
//! decoder layer's cross-attention K/V projection of the output, which the
//! GPU decoder (`gpu_decoder`) copies into the window's slot. One
//! submission per batch of 30 s windows.
//!
//! Weights go up as f16 when they are exactly f16 (CTranslate2's f16 files),
//! f32 otherwise. The kernels are the shared dense ones (`gpu::dense`) plus
//! `gpu::whisper`'s `im2col_1d` and `attention_tiled`, whose CPU twins are
//! `model::im2col_1d` and `cpu::attention`.

use super::gpu_decoder::{GpuDecoder, Readback, MAX_AHEAD};
use super::model::{Config, CrossKv, LayerNorm, Linear, Whisper, LN_EPS};
use crate::cpu::whisper::{
    self as select, Draw, Picked, RowRule, RuleState, SampleRules, Sampled, SelectRules,
    TimestampRules,
};
use crate::cpu::{Activation, AttentionShape, SeqSpan};
use crate::error::{Error, Result};
use crate::gpu::dense::{self, pack_f16, WeightFormat};
use crate::gpu::ops::Dispatch;
use crate::gpu::whisper::{attention_tiled, im2col_1d};
use crate::gpu::Gpu;
use crate::models::whisper::mel::N_FRAMES;
use crate::run::transcribe::{Backend, Pick, Picks, Traffic};
use std::sync::Arc;

/// A weight matrix and its bias on the GPU.
pub(super) struct GpuLinear {
    w: wgpu::Buffer,
    format: WeightFormat,
    bias: Option<wgpu::Buffer>,
    n: usize,
    k: usize,
}

impl GpuLinear {
    pub(super) fn upload(
        gpu: &Gpu,
        name: &str,
        w: &[f32],
        bias: Option<&[f32]>,
        n: usize,
        k: usize,
    ) -> Result<GpuLinear> {
        // f16 only when nothing is lost: CT2 stores Whisper in f16.
        let exact_f16 = w.iter().all(|&v| half::f16::from_f32(v).to_f32() == v);
        let (w, format) = if exact_f16 {
            (gpu.upload_u32(name, &pack_f16(w, n, k))?, WeightFormat::F16)
        } else {
            (gpu.upload_f32(name, w)?, WeightFormat::F32)
        };
        let bias = bias
            .map(|b| gpu.upload_f32(&format!("{name}.bias"), b))
            .transpose()?;
        Ok(GpuLinear {
            w,
            format,
            bias,
            n,
            k,
        })
    }

    pub(super) fn from(gpu: &Gpu, name: &str, l: &Linear) -> Result<GpuLinear> {
        GpuLinear::upload(gpu, name, &l.w, l.b.as_deref(), l.n_out, l.n_in)
    }

    /// This layer as `dense::Linear` of x: [m, k] into y.
    fn linear<'a>(
        &'a self,
        x: &'a wgpu::Buffer,
        y: &'a wgpu::Buffer,
        m: usize,
        act: Option<Activation>,
        residual: Option<&'a wgpu::Buffer>,
    ) -> dense::Linear<'a> {
        dense::Linear {
            x,
            w: &self.w,
            format: self.format,
            bias: self.bias.as_ref(),
            residual,
            y,
            m,
            k: self.k,
            n: self.n,
            act,
        }
    }

    /// y[m, n] = act(layer_norm(x) · w^T + bias) + residual for up to
    /// `dense::MATMUL_THIN_ROWS` rows, the norm folded into the product; with
    /// `cache`, its columns also written there.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_norm(
        &self,
        gpu: &Gpu,
        norm: &GpuNorm,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        m: usize,
        act: Option<Activation>,
        residual: Option<&wgpu::Buffer>,
        cache: Option<&dense::CacheWrite>,
    ) -> Result<Dispatch> {
        dense::matmul_thin_norm(
            gpu,
            &self.linear(x, y, m, act, residual),
            &dense::FoldedNorm {
                gamma_beta: &norm.gamma_beta,
                eps: LN_EPS,
            },
            cache,
        )
    }

    /// y[m, n] = act(x · w^T + bias) + residual
    pub(super) fn matmul(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        m: usize,
        act: Option<Activation>,
        residual: Option<&wgpu::Buffer>,
    ) -> Result<Dispatch> {
        dense::matmul(gpu, &self.linear(x, y, m, act, residual))
    }
}

pub(super) struct GpuNorm {
    gamma: wgpu::Buffer,
    beta: wgpu::Buffer,
    /// Both, one after the other: for a norm folded into a product.
    gamma_beta: wgpu::Buffer,
}

impl GpuNorm {
    pub(super) fn from(gpu: &Gpu, name: &str, n: &LayerNorm) -> Result<GpuNorm> {
        Ok(GpuNorm {
            gamma: gpu.upload_f32(&format!("{name}.gamma"), &n.gamma)?,
            beta: gpu.upload_f32(&format!("{name}.beta"), &n.beta)?,
            gamma_beta: gpu.upload_f32(
                &format!("{name}.gamma_beta"),
                &[&n.gamma[..], &n.beta[..]].concat(),
            )?,
        })
    }

    pub(super) fn run(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        d: usize,
        rows: usize,
    ) -> Result<Dispatch> {
        dense::layer_norm(
            gpu,
            &gpu.reduce_variant(),
            x,
            &self.gamma,
            &self.beta,
            y,
            d,
            rows,
            LN_EPS,
        )
    }
}

/// The encoder with its buffers and every dispatch bound once.
pub struct GpuEncoder {
    gpu: Arc<Gpu>,
    config: Config,
    /// [n_mels, 3000], written each window.
    mel: wgpu::Buffer,
    /// The encoder output [n_audio_ctx, d].
    xa: wgpu::Buffer,
    /// Per decoder layer, [n_audio_ctx, 2d].
    kv: Vec<wgpu::Buffer>,
    /// The whole window, in order: each step's name, dispatch and output.
    plan: Vec<Step>,
}

/// One dispatch of the plan and the buffer it writes (for [`GpuEncoder::intermediates`]).
struct Step {
    name: String,
    dispatch: Dispatch,
    output: wgpu::Buffer,
}

impl GpuEncoder {
    pub fn new(gpu: Arc<Gpu>, model: &Whisper) -> Result<GpuEncoder> {
        let c = model.config.clone();
        let e = &model.encoder;
        let g = &*gpu;
        let (d, t, t_in, n_mels, d_ff) = (c.d_model, c.n_audio_ctx, N_FRAMES, c.n_mels, c.d_ff);
        let f32s = |name: &str, n: usize| g.scratch(name, (n * 4) as u64);

        let mel = f32s("mel", n_mels * t_in)?;
        let cols1 = f32s("conv1.cols", t_in * n_mels * 3)?;
        let h1 = f32s("conv1.out", t_in * d)?;
        let cols2 = f32s("conv2.cols", t * d * 3)?;
        let x = f32s("x", t * d)?;
        let x2 = f32s("x2", t * d)?;
        let h = f32s("h", t * d)?;
        let qkv = f32s("qkv", t * 3 * d)?;
        let att = f32s("attention", t * d)?;
        let ff = f32s("ffn", t * d_ff)?;
        let xa = f32s("encoder.out", t * d)?;
        let positions = g.upload_f32("positions", &e.positions)?;
        let span = g.upload_u32("encoder.span", &dense::pack_seqs(&[SeqSpan::same(0, t)]))?;
        let conv1 = GpuLinear::from(g, "conv1", &e.conv1)?;
        let conv2 = GpuLinear::from(g, "conv2", &e.conv2)?;
        let head_dim = d / c.n_audio_heads;
        let shape = AttentionShape {
            heads: c.n_audio_heads,
            kv_heads: c.n_audio_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            causal: false,
            window: 0,
            q_stride: 3 * d,
            k_stride: 3 * d,
            v_stride: 3 * d,
            q_col: 0,
            k_col: d,
            v_col: 2 * d,
        };
        let gelu = Some(Activation::Gelu);

        let mut plan = Vec::new();
        let mut step = |name: String, dispatch: Dispatch, output: &wgpu::Buffer| {
            plan.push(Step {
                name,
                dispatch,
                output: output.clone(),
            })
        };
        step(
            "conv1.cols".into(),
            im2col_1d(g, &mel, &cols1, t_in, n_mels, 1, t_in, 3, 1, 1, t_in)?,
            &cols1,
        );
        step(
            "conv1".into(),
            conv1.matmul(g, &cols1, &h1, t_in, gelu, None)?,
            &h1,
        );
        step(
            "conv2.cols".into(),
            im2col_1d(g, &h1, &cols2, t_in, d, d, 1, 3, 2, 1, t)?,
            &cols2,
        );
        step(
            "conv2+positions".into(),
            conv2.matmul(g, &cols2, &x, t, gelu, Some(&positions))?,
            &x,
        );
        for (i, l) in e.layers.iter().enumerate() {
            let p = format!("encoder.{i}");
            let attn_norm = GpuNorm::from(g, &format!("{p}.attn_norm"), &l.attn_norm)?;
            let wqkv = GpuLinear::from(g, &format!("{p}.qkv"), &l.qkv)?;
            let wout = GpuLinear::from(g, &format!("{p}.out"), &l.out)?;
            let mlp_norm = GpuNorm::from(g, &format!("{p}.mlp_norm"), &l.mlp.norm)?;
            let fc1 = GpuLinear::from(g, &format!("{p}.fc1"), &l.mlp.fc1)?;
            let fc2 = GpuLinear::from(g, &format!("{p}.fc2"), &l.mlp.fc2)?;
            step(
                format!("{p}.attn_norm"),
                attn_norm.run(g, &x, &h, d, t)?,
                &h,
            );
            step(
                format!("{p}.qkv"),
                wqkv.matmul(g, &h, &qkv, t, None, None)?,
                &qkv,
            );
            step(
                format!("{p}.attention"),
                attention_tiled(g, &qkv, &qkv, &qkv, &span, 1, t, &att, &shape)?,
                &att,
            );
            step(
                format!("{p}.attn_residual"),
                wout.matmul(g, &att, &x2, t, None, Some(&x))?,
                &x2,
            );
            step(format!("{p}.mlp_norm"), mlp_norm.run(g, &x2, &h, d, t)?, &h);
            step(
                format!("{p}.fc1"),
                fc1.matmul(g, &h, &ff, t, gelu, None)?,
                &ff,
            );
            step(
                format!("{p}.out"),
                fc2.matmul(g, &ff, &x, t, None, Some(&x2))?,
                &x,
            );
        }
        let norm = GpuNorm::from(g, "encoder.norm", &e.norm)?;
        step("encoder.norm".into(), norm.run(g, &x, &xa, d, t)?, &xa);
        let mut kv = Vec::new();
        for (i, l) in model.decoder.layers.iter().enumerate() {
            let w = GpuLinear::from(g, &format!("decoder.{i}.cross_kv"), &l.cross_kv)?;
            let out = f32s(&format!("decoder.{i}.cross_kv.out"), t * 2 * d)?;
            step(
                format!("decoder.{i}.cross_kv"),
                w.matmul(g, &xa, &out, t, None, None)?,
                &out,
            );
            kv.push(out);
        }
        Ok(GpuEncoder {
            gpu,
            config: c,
            mel,
            xa,
            kv,
            plan,
        })
    }

    /// Runs one window of features [n_mels, 3000]; the results stay on the GPU.
    fn run(&self, mel: &[f32]) -> Result<()> {
        assert_eq!(
            mel.len(),
            self.config.n_mels * N_FRAMES,
            "gpu encoder: mel is not [n_mels, 3000]"
        );
        self.gpu
            .queue
            .write_buffer(&self.mel, 0, bytemuck::cast_slice(mel));
        let work: Vec<&Dispatch> = self.plan.iter().map(|s| &s.dispatch).collect();
        self.gpu.run_all(&work)
    }

    /// Records one window: its features copied from `mels` at byte
    /// `offset` into the input, then every dispatch.
    fn record(&self, enc: &mut wgpu::CommandEncoder, mels: &wgpu::Buffer, offset: u64) {
        enc.copy_buffer_to_buffer(mels, offset, &self.mel, 0, self.mel.size());
        let mut pass = enc.begin_compute_pass(&Default::default());
        for s in &self.plan {
            s.dispatch.record(&mut pass);
        }
    }

    /// Debug hook: runs the window one dispatch at a time and returns every
    /// step's name and output, to find the first one that diverges from the
    /// CPU reference. Slow; never used on the normal path.
    pub fn intermediates(&self, mel: &[f32]) -> Result<Vec<(String, Vec<f32>)>> {
        self.gpu
            .queue
            .write_buffer(&self.mel, 0, bytemuck::cast_slice(mel));
        let mut out = Vec::new();
        for s in &self.plan {
            self.gpu.run_all(&[&s.dispatch])?;
            out.push((s.name.clone(), self.gpu.read_f32(&s.output)?));
        }
        Ok(out)
    }

    /// The encoder output [n_audio_ctx, d] for one window.
    pub fn forward(&self, mel: &[f32]) -> Result<Vec<f32>> {
        self.run(mel)?;
        self.output()
    }

    /// The encoder output [n_audio_ctx, d] of the window run last.
    pub fn output(&self) -> Result<Vec<f32>> {
        self.gpu.read_f32(&self.xa)
    }

    /// The cross-attention state of the window run last.
    pub fn cross_kv(&self) -> Result<CrossKv> {
        let kv = self
            .kv
            .iter()
            .map(|b| self.gpu.read_f32(b))
            .collect::<Result<_>>()?;
        Ok(CrossKv::new(kv))
    }
}

/// Transcription on the GPU: the encoder, and the decoder over the
/// cross-attention state the encoder leaves on the device.
pub struct GpuBackend {
    encoder: GpuEncoder,
    decoder: GpuDecoder,
    /// [max_windows, n_mels, 3000]: the features of a batch of windows.
    mels: wgpu::Buffer,
    /// Windows encoded last, and each one's cross-attention state, read
    /// back once when asked for.
    windows: usize,
    host_cross: Vec<Option<CrossKv>>,
    /// The encoder's submissions and the cross state's readbacks.
    traffic: Traffic,
    /// Draws `whisper_sample` handed back to the CPU.
    cpu_draws: u64,
    /// Greedy passes one submission runs at most ([`Backend::greedy_ahead`];
    /// below 2 steps one token a submission). `LFM_GREEDY_AHEAD` sets it.
    pub ahead: usize,
}

/// Greedy passes a submission unless `LFM_GREEDY_AHEAD` says otherwise.
const DEFAULT_AHEAD: usize = 8;

impl GpuBackend {
    /// For batches of at most `max_windows` windows decoded with at most
    /// `max_seqs` sequences at once in all
    /// ([`crate::run::transcribe::Options::max_sequences`] a window).
    pub fn new(
        gpu: Arc<Gpu>,
        model: &Whisper,
        max_seqs: usize,
        max_windows: usize,
    ) -> Result<GpuBackend> {
        let decoder = GpuDecoder::new(gpu.clone(), model, max_seqs, max_windows)?;
        let (max_windows, _) = decoder.capacity();
        let bytes = (max_windows * model.config.n_mels * N_FRAMES * 4) as u64;
        let mels = gpu.scratch("encoder.mels", bytes)?;
        Ok(GpuBackend {
            encoder: GpuEncoder::new(gpu, model)?,
            decoder,
            mels,
            windows: 0,
            host_cross: Vec::new(),
            traffic: Traffic::default(),
            cpu_draws: 0,
            ahead: std::env::var("LFM_GREEDY_AHEAD")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_AHEAD)
                .min(MAX_AHEAD),
        })
    }

    /// The encoder the decoder attends to (its output, for checks).
    pub fn encoder(&self) -> &GpuEncoder {
        &self.encoder
    }

    /// Times every dispatch of the decoder steps that follow (see
    /// `examples/whisper_profile.rs`).
    pub fn start_profile(&mut self, what: &str) -> Result<()> {
        self.decoder.start_profile(what)
    }

    /// The decoder steps timed since [`GpuBackend::start_profile`].
    pub fn take_profile(&mut self) -> Option<crate::gpu::profile::StepProfile> {
        self.decoder.take_profile()
    }
}

/// The decoder's readback for a [`Pick`] over the rows it names.
fn readback<'a>(pick: &Pick<'a>) -> Readback<'a> {
    match *pick {
        Pick::Logits => Readback::Logits,
        Pick::Top { k, rules, rows } => Readback::Picks { k, rules, rows },
        Pick::Sample { rules, draws } => Readback::Sample { rules, draws },
    }
}

impl GpuBackend {
    /// The draws `whisper_sample` wrote (`words`) for `draws` of the last
    /// pass's head rows under `rules`: those it handed back are drawn again
    /// on the CPU from their rows' logits.
    fn sampled(
        &mut self,
        rules: &SampleRules,
        draws: &[Draw],
        words: &[u32],
    ) -> Result<Vec<Sampled>> {
        let mut out: Vec<Sampled> = words
            .chunks_exact(select::SAMPLE_WORDS)
            .map(|w| Sampled {
                token: w[0],
                logprob: f32::from_bits(w[1]),
            })
            .collect();
        let again: Vec<usize> = words
            .chunks_exact(select::SAMPLE_WORDS)
            .enumerate()
            .filter(|(_, w)| w[2] & select::DRAW_ON_CPU != 0)
            .map(|(i, _)| i)
            .collect();
        if again.is_empty() {
            return Ok(out);
        }
        let mut rows: Vec<usize> = again.iter().map(|&i| draws[i].row as usize).collect();
        rows.sort_unstable();
        rows.dedup();
        let logits = self.decoder.head_logits(&rows)?;
        let row_rules: Vec<RowRule> = rows.iter().map(|&r| rules.rows[r]).collect();
        let redraws: Vec<Draw> = again
            .iter()
            .map(|&i| Draw {
                row: rows.partition_point(|&r| r < draws[i].row as usize) as u32,
                u: draws[i].u,
            })
            .collect();
        let on_cpu = SampleRules {
            rows: &row_rules,
            ..*rules
        };
        for (&i, d) in again
            .iter()
            .zip(select::whisper_sample(&logits, &on_cpu, &redraws))
        {
            out[i] = d;
        }
        self.cpu_draws += again.len() as u64;
        Ok(out)
    }

    /// Draws the device handed back to the CPU so far.
    pub fn cpu_draws(&self) -> u64 {
        self.cpu_draws
    }
}

impl Backend for GpuBackend {
    fn encode(&mut self, mels: &[&[f32]]) -> Result<()> {
        let (max_windows, _) = self.decoder.capacity();
        if mels.is_empty() || mels.len() > max_windows {
            return Err(Error::invalid(format!(
                "{} windows at once; this GPU backend was made for 1 to {max_windows}",
                mels.len()
            )));
        }
        let c = &self.encoder.config;
        let window = c.n_mels * N_FRAMES;
        let gpu = &self.encoder.gpu;
        for (w, mel) in mels.iter().enumerate() {
            assert_eq!(mel.len(), window, "gpu encoder: mel is not [n_mels, 3000]");
            gpu.queue.write_buffer(
                &self.mels,
                (w * window * 4) as u64,
                bytemuck::cast_slice(mel),
            );
        }
        let slot = self.encoder.kv[0].size();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for w in 0..mels.len() {
            self.encoder
                .record(&mut enc, &self.mels, (w * window * 4) as u64);
            for (kv, cross) in self.encoder.kv.iter().zip(&self.decoder.cross) {
                enc.copy_buffer_to_buffer(kv, 0, cross, w as u64 * slot, slot);
            }
        }
        gpu.submit_and_wait(enc)?;
        self.traffic.submissions += 1;
        self.windows = mels.len();
        self.host_cross = vec![None; mels.len()];
        Ok(())
    }

    fn cross_kv(&mut self, window: usize) -> Result<&CrossKv> {
        assert!(
            window < self.windows,
            "decoder: no window encoded in slot {window}"
        );
        if self.host_cross[window].is_none() {
            let gpu = &self.encoder.gpu;
            let slot = self.encoder.kv[0].size();
            let mut kv = Vec::with_capacity(self.decoder.cross.len());
            for cross in &self.decoder.cross {
                let staging = gpu.staging("cross_kv.read", slot);
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                enc.copy_buffer_to_buffer(cross, window as u64 * slot, &staging, 0, slot);
                kv.push(bytemuck::pod_collect_to_vec(
                    &gpu.submit_and_read(enc, &staging, slot)?,
                ));
                self.traffic.submissions += 1;
                self.traffic.bytes_read += slot;
            }
            self.host_cross[window] = Some(CrossKv::new(kv));
        }
        Ok(self.host_cross[window]
            .as_ref()
            .expect("read back just now"))
    }

    fn prompt(
        &mut self,
        prompts: &[&[u32]],
        probe: Option<(usize, u32)>,
        pick: &Pick,
    ) -> Result<(Vec<f32>, Picks)> {
        let n = prompts[0].len();
        let vocab = self.encoder.config.n_vocab;
        // Each window's head rows: the probe's (no rules), then the last.
        let rows: Vec<usize> = match probe {
            Some((r, _)) => vec![r, n - 1],
            None => vec![n - 1],
        };
        let per = rows.len();
        let probe_rule = probe.map(|(_, token)| RowRule::raw(vocab, token));
        let widen = |last: &[RowRule]| -> Vec<RowRule> {
            last.iter()
                .flat_map(|&r| probe_rule.into_iter().chain([r]))
                .collect()
        };
        let (head_rules, draws) = match *pick {
            Pick::Logits => (Vec::new(), Vec::new()),
            Pick::Top { rows, .. } => (widen(rows), Vec::new()),
            Pick::Sample { rules, draws } => (
                widen(rules.rows),
                draws
                    .iter()
                    .map(|d| Draw {
                        row: (d.row as usize * per + per - 1) as u32,
                        u: d.u,
                    })
                    .collect(),
            ),
        };
        let read = match *pick {
            Pick::Logits => Readback::Logits,
            Pick::Top { k, rules, .. } => Readback::Picks {
                k,
                rules,
                rows: &head_rules,
            },
            Pick::Sample { rules, .. } => Readback::Sample {
                rules: SampleRules {
                    rows: &head_rules,
                    ..rules
                },
                draws: &draws,
            },
        };
        let out = self.decoder.prompt(prompts, &rows, &read)?;
        let words_per_row = match *pick {
            Pick::Logits => vocab,
            Pick::Top { k, .. } => select::select_words(k),
            Pick::Sample { .. } => select::select_words(1),
        };
        let (head, drawn) = out.split_at(prompts.len() * per * words_per_row);
        let mut probs = Vec::with_capacity(prompts.len());
        let mut last = Vec::with_capacity(prompts.len() * words_per_row);
        for w in head.chunks_exact(per * words_per_row) {
            let (first, tail) = w.split_at((per - 1) * words_per_row);
            probs.push(match (probe, pick) {
                (None, _) => 0.0,
                (Some((_, token)), Pick::Logits) => {
                    let logits: Vec<f32> = bytemuck::cast_slice(first).to_vec();
                    select::raw_logprob(&logits, token).exp()
                }
                (Some(_), _) => f32::from_bits(first[0]).exp(),
            });
            last.extend_from_slice(tail);
        }
        let picks = match (pick, &read) {
            (Pick::Logits, _) => Picks::Logits(bytemuck::cast_vec(last)),
            (Pick::Top { k, .. }, _) => Picks::Top(select::read_picks(&last, *k)),
            (_, Readback::Sample { rules, draws }) => {
                Picks::Sampled(self.sampled(rules, draws, drawn)?)
            }
            (Pick::Sample { .. }, _) => unreachable!("a draw reads back draws"),
        };
        Ok((probs, picks))
    }

    fn select(&mut self, sources: &[usize]) -> Result<()> {
        self.decoder.select(sources)
    }

    fn step(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picks> {
        let words = self.decoder.step(tokens, &readback(pick))?;
        Ok(match *pick {
            Pick::Logits => Picks::Logits(bytemuck::cast_vec(words)),
            Pick::Top { k, .. } => Picks::Top(select::read_picks(&words, k)),
            Pick::Sample { rules, draws } => {
                let drawn = &words[tokens.len() * select::select_words(1)..];
                Picks::Sampled(self.sampled(&rules, draws, drawn)?)
            }
        })
    }

    fn greedy_ahead(
        &mut self,
        tokens: &[u32],
        rules: &SelectRules,
        rows: &[RowRule],
        states: &[RuleState],
        timestamps: &TimestampRules,
        n: usize,
    ) -> Result<Option<Vec<Vec<Picked>>>> {
        let n = n.min(self.ahead).min(self.decoder.room());
        if n < 2 {
            return Ok(None);
        }
        let words = self
            .decoder
            .greedy_ahead(tokens, rules, rows, states, timestamps, n)?;
        let per_step = tokens.len() * select::select_words(1);
        Ok(Some(
            words
                .chunks_exact(per_step)
                .map(|w| select::read_picks(w, 1))
                .collect(),
        ))
    }

    fn traffic(&self) -> Traffic {
        self.traffic + self.decoder.traffic
    }
}
