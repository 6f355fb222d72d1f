//! The GPU plan for VITS: the HiFi-GAN generator (about 80% of the work, all
//! of it per audio sample) runs on the GPU as one submission per sentence;
//! the text encoder, duration predictor and flow, which work per phoneme or
//! per 256-sample frame, stay on the CPU reference.

use super::{Conv, ConvT, Generator, LRELU_SLOPE, LRELU_SLOPE_POST};
use crate::error::Result;
use crate::gpu::ops::{self, Dispatch};
use crate::gpu::speech::{self, Conv1dExtras, InputAct};
use crate::gpu::Gpu;
use std::sync::Arc;

/// A convolution's weights on the device.
struct GpuConv {
    w: wgpu::Buffer,
    b: wgpu::Buffer,
}

impl GpuConv {
    fn upload(
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

    fn conv(gpu: &Gpu, name: &str, c: &Conv) -> Result<GpuConv> {
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
    conv_pre: GpuConv,
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
        Ok(GpuGenerator {
            conv_pre: GpuConv::conv(&gpu, "dec.conv_pre", &g.conv_pre)?,
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
        let g = &self.cpu;
        let mut work: Vec<Dispatch> = Vec::new();
        let mut t = frames;
        let zb = gpu.upload_f32("dec.z", z)?;
        let speaker_bias = match speaker {
            None => None,
            Some(offset) => {
                let c = g.conv_pre.shape.c_out;
                let mut b = g.conv_pre.b.clone().unwrap_or_else(|| vec![0.0; c]);
                for (b, o) in b.iter_mut().zip(offset) {
                    *b += o;
                }
                Some(gpu.upload_f32("dec.conv_pre.bias+speaker", &b)?)
            }
        };
        let mut x = gpu.scratch("dec.x", (g.conv_pre.shape.c_out * t * 4) as u64)?;
        work.push(speech::conv1d(
            gpu,
            &zb,
            &self.conv_pre.w,
            speaker_bias.as_ref().unwrap_or(&self.conv_pre.b),
            &x,
            &g.conv_pre.shape,
            t,
            InputAct::NONE,
            Conv1dExtras::default(),
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
        gpu.run_all(&work.iter().collect::<Vec<_>>())?;
        let mut audio = gpu.read_f32(&out)?;
        audio.truncate(t);
        Ok(audio)
    }
}
