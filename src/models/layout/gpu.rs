//! The GPU plan for a lowered layout graph: weights uploaded once, every
//! device step bound once, activations in a few buffers reused by
//! liveness. A forward pass writes the input, records every dispatch and
//! the read-back copies into one command buffer, submits once and maps the
//! results; the host steps (the head's tail) then run on the CPU.

use super::exec;
use super::graph::{Graph, Op, ValueId};
use super::HeadOutputs;
use crate::error::{Error, Result};
use crate::gpu::ops::{self, Dispatch};
use crate::gpu::{vision, Gpu};
use std::sync::Arc;

pub struct GpuLayout {
    gpu: Arc<Gpu>,
    input: wgpu::Buffer,
    /// Storage buffers holding activations; values share them by liveness.
    buffers: Vec<wgpu::Buffer>,
    /// The buffer of each device-computed value.
    slot: Vec<Option<usize>>,
    work: Vec<Dispatch>,
    /// Values read back after the device part: (value, byte offset in staging).
    readback: Vec<(ValueId, u64)>,
    staging: wgpu::Buffer,
}

impl GpuLayout {
    /// Uploads the weights of `graph` and binds every device step.
    pub fn new(gpu: Arc<Gpu>, graph: &Graph) -> Result<GpuLayout> {
        let device_steps: Vec<usize> = (0..graph.steps.len())
            .filter(|&i| graph.steps[i].op.on_device())
            .collect();
        // Values the CPU needs afterwards: inputs of host steps and graph
        // outputs computed on the device.
        let mut needed: Vec<ValueId> = graph
            .steps
            .iter()
            .filter(|s| !s.op.on_device())
            .flat_map(|s| s.inputs.iter().copied())
            .chain(graph.outputs.iter().copied())
            .filter(|&v| {
                device_steps
                    .iter()
                    .any(|&i| graph.steps[i].outputs.contains(&v))
            })
            .collect();
        needed.sort_unstable();
        needed.dedup();

        let mut last = vec![None; graph.values.len()];
        for &i in &device_steps {
            for &v in &graph.steps[i].inputs {
                last[v] = Some(i);
            }
        }
        let bytes = |v: ValueId| graph.values[v].len() as u64 * 4;
        let input = gpu.scratch("layout input", bytes(graph.input))?;
        let mut buffers: Vec<wgpu::Buffer> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut slot: Vec<Option<usize>> = vec![None; graph.values.len()];
        let mut work = Vec::new();
        for &i in &device_steps {
            let step = &graph.steps[i];
            for &out in &step.outputs {
                // Best fit among the free buffers, else a new one.
                let need = bytes(out);
                let pick = free
                    .iter()
                    .enumerate()
                    .filter(|(_, &b)| buffers[b].size() >= need)
                    .min_by_key(|(_, &b)| buffers[b].size())
                    .map(|(k, _)| k);
                slot[out] = Some(match pick {
                    Some(k) => free.swap_remove(k),
                    None => {
                        buffers.push(gpu.scratch(&graph.values[out].name, need)?);
                        buffers.len() - 1
                    }
                });
            }
            let buf = |v: ValueId| -> &wgpu::Buffer {
                if v == graph.input {
                    &input
                } else {
                    &buffers[slot[v].expect("device values have buffers")]
                }
            };
            bind_step(&gpu, graph, i, &buf, &mut work)?;
            for &v in &step.inputs {
                if last[v] == Some(i) && v != graph.input && !needed.contains(&v) {
                    if let Some(b) = slot[v] {
                        free.push(b);
                    }
                }
            }
        }
        let mut readback = Vec::new();
        let mut offset = 0u64;
        for &v in &needed {
            readback.push((v, offset));
            offset += bytes(v);
        }
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("layout readback"),
            size: offset.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(GpuLayout {
            gpu,
            input,
            buffers,
            slot,
            work,
            readback,
            staging,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Bytes held in activation buffers.
    pub fn activation_bytes(&self) -> u64 {
        self.buffers.iter().map(|b| b.size()).sum()
    }

    /// The head outputs for a preprocessed input.
    pub fn forward(&mut self, graph: &Graph, input: &[f32]) -> Result<HeadOutputs> {
        assert_eq!(
            input.len(),
            graph.values[graph.input].len(),
            "GpuLayout::forward: input size"
        );
        let gpu = &self.gpu;
        gpu.queue
            .write_buffer(&self.input, 0, bytemuck::cast_slice(input));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for d in &self.work {
                d.record(&mut pass);
            }
        }
        for &(v, offset) in &self.readback {
            let src = &self.buffers[self.slot[v].expect("read-back values are device values")];
            enc.copy_buffer_to_buffer(
                src,
                0,
                &self.staging,
                offset,
                graph.values[v].len() as u64 * 4,
            );
        }
        gpu.submit_and_wait(enc)?;
        let bytes = map_read(gpu, &self.staging)?;

        // The host steps, on the CPU, from the read-back values.
        let mut values: Vec<Option<Vec<f32>>> = vec![None; graph.values.len()];
        for &(v, offset) in &self.readback {
            let n = graph.values[v].len() * 4;
            values[v] = Some(bytemuck::pod_collect_to_vec(
                &bytes[offset as usize..offset as usize + n],
            ));
        }
        for step in graph.steps.iter().filter(|s| !s.op.on_device()) {
            let outputs = {
                let inputs: Vec<&[f32]> = step
                    .inputs
                    .iter()
                    .map(|&v| values[v].as_deref().expect("host step inputs are computed"))
                    .collect();
                exec::run_step(graph, step, &inputs)
            };
            for (&v, data) in step.outputs.iter().zip(outputs) {
                values[v] = Some(data);
            }
        }
        Ok(graph
            .outputs
            .iter()
            .map(|&v| values[v].clone().expect("graph outputs are computed"))
            .collect())
    }
}

/// Binds device step `i`; its buffers come from `buf`.
fn bind_step<'b>(
    gpu: &Gpu,
    graph: &Graph,
    i: usize,
    buf: &dyn Fn(ValueId) -> &'b wgpu::Buffer,
    work: &mut Vec<Dispatch>,
) -> Result<()> {
    let step = &graph.steps[i];
    let shape = |v: ValueId| graph.values[v].chw();
    let x = buf(step.inputs[0]);
    let y = buf(step.outputs[0]);
    let context = |e: Error| Error::gpu(format!("step {} ({}): {e}", i, step.node));
    match &step.op {
        Op::Conv {
            geom,
            weight,
            bias,
            act,
        } => {
            let w = gpu.upload_f32(&step.node, weight)?;
            let b = gpu.upload_f32(&step.node, bias)?;
            let variant = vision::conv2d_variant(geom);
            work.push(vision::conv2d(gpu, &variant, geom, *act, x, &w, &b, y).map_err(context)?);
        }
        Op::GlobalAvgPool => {
            let (c, h, w) = shape(step.inputs[0]);
            work.push(vision::global_avg_pool(gpu, x, y, c, h * w).map_err(context)?);
        }
        Op::ScaleChannels => {
            let (c, h, w) = shape(step.inputs[0]);
            let s = buf(step.inputs[1]);
            work.push(vision::scale_channels(gpu, x, s, y, c, h * w).map_err(context)?);
        }
        Op::Add => {
            let n = graph.values[step.outputs[0]].len();
            work.push(ops::add(gpu, x, buf(step.inputs[1]), y, n).map_err(context)?);
        }
        Op::ResizeNearest { scale } => {
            let (c, h, w) = shape(step.inputs[0]);
            let (_, ho, wo) = shape(step.outputs[0]);
            work.push(
                vision::resize_nearest(gpu, x, y, c, [h, w], [ho, wo], *scale).map_err(context)?,
            );
        }
        Op::Concat => {
            let mut offset = 0;
            for &v in &step.inputs {
                let n = graph.values[v].len();
                work.push(vision::concat_part(gpu, buf(v), y, n, offset).map_err(context)?);
                offset += n;
            }
        }
        Op::Split { .. } | Op::Sigmoid | Op::Reshape | Op::Transpose { .. } => {
            unreachable!("host steps are not bound on the device")
        }
    }
    Ok(())
}

/// Maps `staging` and copies it out.
fn map_read(gpu: &Gpu, staging: &wgpu::Buffer) -> Result<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::gpu(format!("readback: {e}")))?;
    rx.recv()
        .map_err(|_| Error::gpu("readback: map callback dropped"))?
        .map_err(|e| Error::gpu(format!("readback: {e}")))?;
    let bytes = staging
        .get_mapped_range(..)
        .map_err(|e| Error::gpu(format!("readback: {e}")))?
        .to_vec();
    staging.unmap();
    Ok(bytes)
}
