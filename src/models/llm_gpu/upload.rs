//! Weights to the GPU: each matrix in its stored format (or f16 where no
//! kernel reads the format), q/k/v and gate/up as parts of one matrix when
//! they share a format, so one GEMV reads them.

use super::{GpuFfn, GpuLayer, GpuMixer};
use crate::error::{Error, Result};
use crate::gpu::llm_ops::{self, GpuMatrix, HeadConsts};
use crate::gpu::Gpu;
use crate::models::llm::{Layer, LlmConfig, Mixer};
use crate::quant::GgmlType;
use crate::tensor::Tensor;

/// Uploads weights, converting formats no kernel reads to f16 (and noting
/// which, for one notice at the end).
pub(super) struct Uploader<'a> {
    pub g: &'a Gpu,
    /// Largest weight buffer.
    pub max: u64,
    pub converted: Vec<GgmlType>,
}

impl Uploader<'_> {
    /// The tensor in a format the kernels read: as it is, or as f16.
    fn readable(&mut self, t: &Tensor) -> Result<Tensor> {
        if llm_ops::format_defines(t.dtype).is_some() {
            return Ok(t.clone());
        }
        if !self.converted.contains(&t.dtype) {
            self.converted.push(t.dtype);
        }
        t.to_dtype(GgmlType::F16)
    }

    /// One matrix of `parts` (same shape; their formats already readable
    /// and equal, or all converted here).
    pub fn matrix(&mut self, label: &str, parts: &[&Tensor]) -> Result<GpuMatrix> {
        let parts: Vec<Tensor> = parts
            .iter()
            .map(|t| self.readable(t))
            .collect::<Result<_>>()?;
        let bytes: Vec<&[u8]> = parts.iter().map(|t| t.bytes()).collect();
        let t = &parts[0];
        GpuMatrix::upload(
            self.g,
            label,
            t.dtype,
            t.row_len(),
            t.rows(),
            &bytes,
            self.max,
        )
    }

    pub fn layer(&mut self, i: usize, l: &Layer, cfg: &LlmConfig) -> Result<GpuLayer> {
        let (d, hd) = (cfg.hidden, cfg.head_dim);
        let (qw, kvw) = (cfg.heads * hd, cfg.kv_heads * hd);
        let g = self.g;
        let mixer = match &l.mixer {
            Mixer::Attention(a) => {
                let (q, k, v) = (
                    self.readable(&a.q)?,
                    self.readable(&a.k)?,
                    self.readable(&a.v)?,
                );
                // One QKV product when the three share a format.
                let qkv = if q.dtype == k.dtype && k.dtype == v.dtype {
                    let bytes = [q.bytes(), k.bytes(), v.bytes()].concat();
                    let t = Tensor::from_bytes("qkv", q.dtype, vec![qw + 2 * kvw, d], bytes)?;
                    vec![(self.matrix(&format!("layer {i} qkv"), &[&t])?, 0)]
                } else {
                    vec![
                        (self.matrix(&format!("layer {i} q"), &[&q])?, 0),
                        (self.matrix(&format!("layer {i} k"), &[&k])?, qw),
                        (self.matrix(&format!("layer {i} v"), &[&v])?, qw + kvw),
                    ]
                };
                let norms = match (&a.q_norm, &a.k_norm) {
                    (Some(qn), Some(kn)) => Some((qn.as_slice(), kn.as_slice())),
                    (None, None) => None,
                    _ => {
                        return Err(Error::invalid(format!(
                            "layer {i}: a q norm without a k norm (or the reverse)"
                        )))
                    }
                };
                GpuMixer::Attention {
                    qkv,
                    o: self.matrix(&format!("layer {i} o"), &[&a.o])?,
                    consts: HeadConsts::upload(g, norms, a.qkv_bias.as_deref())?,
                }
            }
            Mixer::Conv(c) => {
                // B, C and x rows as three parts, so one GEMV workgroup finds
                // a channel's three rows in one buffer.
                let t = self.readable(&c.in_proj)?;
                let (rb, b) = (t.row_bytes(), t.bytes());
                let parts: Vec<&[u8]> = (0..3).map(|p| &b[p * d * rb..(p + 1) * d * rb]).collect();
                let label = format!("layer {i} in_proj");
                GpuMixer::Conv {
                    in_proj: GpuMatrix::upload(g, &label, t.dtype, d, d, &parts, self.max)?,
                    conv: g.upload_f32("conv", &c.conv)?,
                    out: self.matrix(&format!("layer {i} out_proj"), &[&c.out_proj])?,
                }
            }
        };
        let (gate, up) = (self.readable(&l.gate)?, self.readable(&l.up)?);
        let ffn = if gate.dtype == up.dtype {
            GpuFfn::Fused(self.matrix(&format!("layer {i} gate/up"), &[&gate, &up])?)
        } else {
            GpuFfn::Split(
                self.matrix(&format!("layer {i} gate"), &[&gate])?,
                self.matrix(&format!("layer {i} up"), &[&up])?,
            )
        };
        let post =
            |w: &Option<Vec<f32>>| w.as_ref().map(|w| g.upload_f32("post norm", w)).transpose();
        Ok(GpuLayer {
            norm1: g.upload_f32("norm1", &l.norm1)?,
            norm2: g.upload_f32("norm2", &l.norm2)?,
            mixer,
            ffn,
            down: self.matrix(&format!("layer {i} down"), &[&l.down])?,
            post_mixer_norm: post(&l.post_mixer_norm)?,
            post_ffn_norm: post(&l.post_ffn_norm)?,
        })
    }
}
