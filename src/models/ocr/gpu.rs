//! The PaddleOCR networks on the GPU. Their shapes change with every
//! image (detection: the page size; recognition: the line width), so a
//! plan is made per input shape and kept: the device part of the graph
//! (from the first node up to the first op the device does not run:
//! convolutions with their fused elementwise tails, transposed
//! convolutions, squeeze-and-excitation scaling, residual adds, pooling,
//! resizing, channel concatenation) is bound once for that shape, with
//! activations in buffers shared by liveness. A run writes the input,
//! records every dispatch and the read-back copies into one command
//! buffer, submits once, and the rest of the graph (the recogniser's
//! attention and CTC head, the classifier's head) runs on the CPU
//! interpreter from the values read back. The weights are uploaded once
//! per network, shared by every plan.

use super::net::{Binary, Net, Node, Op, Tensor};
use crate::cpu::{Conv2d, ConvTranspose2d};
use crate::error::{Error, Result};
use crate::gpu::ops::{self, Dispatch};
use crate::gpu::{vision, Gpu};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Plans kept per network: a page's recognition groups come in a few
/// widths; more than this and the oldest plan is dropped.
const PLANS_KEPT: usize = 16;

/// A network's weights on the device and its plans by input shape.
pub struct GpuNet {
    gpu: Arc<Gpu>,
    /// Per node: the weight, bias and per-channel affine buffers it uses.
    weights: Vec<NodeWeights>,
    /// Bound where a kernel's affine binding is unused.
    dummy: wgpu::Buffer,
    /// Most recently used last.
    plans: Mutex<Vec<(Vec<usize>, SharedPlan)>>,
    /// Summed over runs: the device part, the CPU part.
    times: Mutex<(Duration, Duration)>,
}

type SharedPlan = Arc<Mutex<Plan>>;

#[derive(Default)]
struct NodeWeights {
    weight: Option<wgpu::Buffer>,
    bias: Option<wgpu::Buffer>,
    affine: Option<wgpu::Buffer>,
}

/// One input shape's device work.
struct Plan {
    input: wgpu::Buffer,
    /// Activation buffers; values share them by liveness.
    buffers: Vec<wgpu::Buffer>,
    work: Vec<Dispatch>,
    /// The first node the CPU runs.
    split: usize,
    /// Values the CPU part reads: (slot, buffer, shape, byte offset in staging).
    readback: Vec<(usize, usize, Vec<usize>, u64)>,
    staging: wgpu::Buffer,
    staging_len: u64,
}

impl GpuNet {
    /// Uploads the weights of `net`.
    pub fn new(gpu: Arc<Gpu>, net: &Net) -> Result<GpuNet> {
        let mut weights = Vec::with_capacity(net.nodes.len());
        for node in &net.nodes {
            let mut w = NodeWeights::default();
            let tail = match &node.op {
                Op::Conv {
                    weight, bias, tail, ..
                }
                | Op::ConvTranspose {
                    weight, bias, tail, ..
                } => {
                    w.weight = Some(gpu.upload_f32(&node.name, weight)?);
                    w.bias = Some(gpu.upload_f32(&node.name, bias)?);
                    Some(tail)
                }
                Op::Chain(chain) => Some(chain),
                _ => None,
            };
            if let Some(t) = tail.filter(|t| !t.affine.is_empty()) {
                w.affine = Some(gpu.upload_f32(&node.name, &t.affine)?);
            }
            weights.push(w);
        }
        let dummy = gpu.upload_f32("pointwise dummy", &[0.0; 4])?;
        Ok(GpuNet {
            gpu,
            weights,
            dummy,
            plans: Mutex::new(Vec::new()),
            times: Mutex::default(),
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Runs `net` (the network these weights came from) on `input`: the
    /// device part, then the rest on the CPU. Outputs as [`Net::run`].
    pub fn run(&self, net: &Net, input: Tensor) -> Result<Vec<Tensor>> {
        let Tensor::F32(data, shape) = &input else {
            return Err(Error::invalid("the network input must be floats"));
        };
        let plan = self.plan(net, shape)?;
        let mut plan = plan.lock().expect("a plan is not poisoned");
        let t0 = Instant::now();
        let mut values = plan.run(&self.gpu, net, data)?;
        values[net.input] = Some(Arc::new(input));
        let t1 = Instant::now();
        let out = net
            .run_from(plan.split, values)
            .map_err(|e| Error::gpu(format!("{}: {e}", net.path.display())));
        let mut times = self.times.lock().expect("the times are not poisoned");
        times.0 += t1 - t0;
        times.1 += t1.elapsed();
        out
    }

    /// Time spent so far in the device part of runs and in the CPU part
    /// after it.
    pub fn times(&self) -> (Duration, Duration) {
        *self.times.lock().expect("the times are not poisoned")
    }

    /// How many nodes of `net` run on the device for an input of `shape`.
    pub fn device_nodes(&self, net: &Net, shape: &[usize]) -> Result<usize> {
        let plan = self.plan(net, shape)?;
        let split = plan.lock().expect("a plan is not poisoned").split;
        Ok(split)
    }

    fn plan(&self, net: &Net, shape: &[usize]) -> Result<SharedPlan> {
        let mut plans = self.plans.lock().expect("the plan cache is not poisoned");
        if let Some(k) = plans.iter().position(|(s, _)| s == shape) {
            let entry = plans.remove(k);
            let plan = entry.1.clone();
            plans.push(entry);
            return Ok(plan);
        }
        let plan = Arc::new(Mutex::new(self.make_plan(net, shape).map_err(|e| {
            Error::gpu(format!(
                "{}: planning input {shape:?}: {e}",
                net.path.display()
            ))
        })?));
        if plans.len() >= PLANS_KEPT {
            plans.remove(0);
        }
        plans.push((shape.to_vec(), plan.clone()));
        Ok(plan)
    }

    fn make_plan(&self, net: &Net, input_shape: &[usize]) -> Result<Plan> {
        let gpu = &self.gpu;
        let slots = net.constants.len();
        let mut shapes: Vec<Option<Vec<usize>>> = vec![None; slots];
        shapes[net.input] = Some(input_shape.to_vec());
        // The device part: nodes up to the first the device does not run.
        let mut split = 0;
        for node in &net.nodes {
            match device_shape(node, &shapes) {
                Some(s) => {
                    shapes[node.output] = Some(s);
                    split += 1;
                }
                None => break,
            }
        }
        // Device values the CPU part reads.
        let computed = |s: usize| net.nodes[..split].iter().any(|n| n.output == s);
        let mut needed: Vec<usize> = net.nodes[split..]
            .iter()
            .flat_map(|n| n.inputs.iter().copied())
            .chain(net.outputs.iter().copied())
            .filter(|&s| computed(s))
            .collect();
        needed.sort_unstable();
        needed.dedup();

        let bytes = |s: usize| {
            shapes[s]
                .as_ref()
                .map_or(0, |v| v.iter().product::<usize>()) as u64
                * 4
        };
        let input = gpu.scratch("ocr input", bytes(net.input).max(16))?;
        let mut buffers: Vec<wgpu::Buffer> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut slot: Vec<Option<usize>> = vec![None; slots];
        let mut work = Vec::new();
        for (i, node) in net.nodes[..split].iter().enumerate() {
            let x = node.inputs[0];
            // A chain runs in place: on its input's buffer when the input
            // dies here.
            let in_place = matches!(node.op, Op::Chain(_))
                && x != net.input
                && net.last_use[x] == i
                && !needed.contains(&x);
            let need = bytes(node.output).max(16);
            slot[node.output] = Some(if in_place {
                slot[x].expect("device values have buffers")
            } else {
                let pick = free
                    .iter()
                    .enumerate()
                    .filter(|(_, &b)| buffers[b].size() >= need)
                    .min_by_key(|(_, &b)| buffers[b].size())
                    .map(|(k, _)| k);
                match pick {
                    Some(k) => free.swap_remove(k),
                    None => {
                        buffers.push(gpu.scratch(&node.name, need)?);
                        buffers.len() - 1
                    }
                }
            });
            let buf = |s: usize| -> &wgpu::Buffer {
                if s == net.input {
                    &input
                } else {
                    &buffers[slot[s].expect("device values have buffers")]
                }
            };
            self.bind(net, i, &shapes, &buf, in_place, &mut work)
                .map_err(|e| Error::gpu(format!("node '{}': {e}", node.name)))?;
            for &s in &node.inputs {
                let dies = net.last_use[s] == i && s != net.input && !needed.contains(&s);
                if dies && !(in_place && s == x) {
                    if let Some(b) = slot[s] {
                        if !free.contains(&b) {
                            free.push(b);
                        }
                    }
                }
            }
        }
        let mut readback = Vec::new();
        let mut offset = 0u64;
        for &s in &needed {
            let shape = shapes[s].clone().expect("device values have shapes");
            readback.push((
                s,
                slot[s].expect("device values have buffers"),
                shape,
                offset,
            ));
            offset += bytes(s);
        }
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("ocr readback"),
            size: offset.max(16),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(Plan {
            input,
            buffers,
            work,
            split,
            readback,
            staging,
            staging_len: offset,
        })
    }

    /// Binds node `i`; its buffers come from `buf`.
    fn bind<'b>(
        &self,
        net: &Net,
        i: usize,
        shapes: &[Option<Vec<usize>>],
        buf: &dyn Fn(usize) -> &'b wgpu::Buffer,
        in_place: bool,
        work: &mut Vec<Dispatch>,
    ) -> Result<()> {
        let gpu = &*self.gpu;
        let node = &net.nodes[i];
        let shape = |s: usize| shapes[s].as_deref().expect("planned values have shapes");
        let len = |s: usize| shape(s).iter().product::<usize>();
        let w = &self.weights[i];
        let x = buf(node.inputs[0]);
        let y = buf(node.output);
        let tail = |chain: &super::net::Chain, work: &mut Vec<Dispatch>| -> Result<()> {
            if chain.steps.is_empty() {
                return Ok(());
            }
            let out = shape(node.output);
            let plane: usize = out[2..].iter().product();
            let affine = w.affine.as_ref().unwrap_or(&self.dummy);
            work.push(vision::pointwise(
                gpu,
                &chain.steps,
                y,
                affine,
                len(node.output),
                plane,
                chain.affine.len() / 2,
            )?);
            Ok(())
        };
        match &node.op {
            Op::Conv { act, tail: t, .. } => {
                let geom = conv_geometry(node, shape(node.inputs[0])).expect("planned");
                let variant = vision::conv2d_variant(&geom);
                let (wb, bb) = (w.weight.as_ref(), w.bias.as_ref());
                work.push(vision::conv2d(
                    gpu,
                    &variant,
                    &geom,
                    *act,
                    x,
                    wb.expect("uploaded"),
                    bb.expect("uploaded"),
                    y,
                )?);
                tail(t, work)?;
            }
            Op::ConvTranspose { tail: t, .. } => {
                let geom = transpose_geometry(node, shape(node.inputs[0])).expect("planned");
                work.push(vision::conv_transpose2d(
                    gpu,
                    &geom,
                    x,
                    w.weight.as_ref().expect("uploaded"),
                    w.bias.as_ref().expect("uploaded"),
                    y,
                )?);
                tail(t, work)?;
            }
            Op::Chain(chain) => {
                if !in_place {
                    work.push(ops::copy(gpu, x, y, len(node.output), 256)?);
                }
                tail(chain, work)?;
            }
            Op::Binary(Binary::Add) => {
                let b = buf(node.inputs[1]);
                work.push(ops::add(gpu, x, b, y, len(node.output))?);
            }
            Op::Binary(Binary::Mul) => {
                // [1, c, h, w] times [1, c, 1, 1], either order.
                let (a, s) = if len(node.inputs[0]) >= len(node.inputs[1]) {
                    (node.inputs[0], node.inputs[1])
                } else {
                    (node.inputs[1], node.inputs[0])
                };
                let c = shape(a)[1];
                work.push(vision::scale_channels(
                    gpu,
                    buf(a),
                    buf(s),
                    y,
                    c,
                    len(a) / c,
                )?);
            }
            Op::GlobalAveragePool => {
                let s = shape(node.inputs[0]);
                work.push(vision::global_avg_pool(gpu, x, y, s[1], s[2] * s[3])?);
            }
            Op::ResizeNearest { scale } => {
                let (s, o) = (shape(node.inputs[0]), shape(node.output));
                work.push(vision::resize_nearest(
                    gpu,
                    x,
                    y,
                    s[1],
                    [s[2], s[3]],
                    [o[2], o[3]],
                    *scale,
                )?);
            }
            Op::Concat { .. } => {
                let mut offset = 0;
                for &s in &node.inputs {
                    work.push(vision::concat_part(gpu, buf(s), y, len(s), offset)?);
                    offset += len(s);
                }
            }
            _ => unreachable!("device_shape admits only the ops bound here"),
        }
        Ok(())
    }
}

impl Plan {
    /// Runs the device part on `input`; returns the slot values the CPU
    /// part starts from (constants, then the read-back values).
    fn run(&mut self, gpu: &Gpu, net: &Net, input: &[f32]) -> Result<Vec<Option<Arc<Tensor>>>> {
        gpu.queue
            .write_buffer(&self.input, 0, bytemuck::cast_slice(input));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for d in &self.work {
                d.record(&mut pass);
            }
        }
        for (_, b, shape, offset) in &self.readback {
            let n = shape.iter().product::<usize>() as u64 * 4;
            enc.copy_buffer_to_buffer(&self.buffers[*b], 0, &self.staging, *offset, n);
        }
        let bytes = gpu.submit_and_read(enc, &self.staging, self.staging_len.max(16))?;
        let mut values = net.constants.clone();
        for (s, _, shape, offset) in &self.readback {
            let n = shape.iter().product::<usize>() * 4;
            let data: Vec<f32> =
                bytemuck::pod_collect_to_vec(&bytes[*offset as usize..*offset as usize + n]);
            values[*s] = Some(Arc::new(Tensor::F32(data, shape.clone())));
        }
        Ok(values)
    }
}

fn conv_geometry(node: &Node, x: &[usize]) -> Option<Conv2d> {
    let Op::Conv {
        weight,
        bias,
        kernel,
        stride,
        pad,
        dilation,
        groups,
        ..
    } = &node.op
    else {
        return None;
    };
    let &[1, c, h, w] = x else {
        return None;
    };
    let g = Conv2d {
        c_in: c,
        h_in: h,
        w_in: w,
        c_out: bias.len(),
        kh: kernel[0],
        kw: kernel[1],
        stride: *stride,
        pad: *pad,
        dilation: *dilation,
        groups: *groups,
    };
    (g.check().is_ok() && g.weight_len() == weight.len()).then_some(g)
}

fn transpose_geometry(node: &Node, x: &[usize]) -> Option<ConvTranspose2d> {
    let Op::ConvTranspose {
        weight,
        bias,
        kernel,
        stride,
        pad,
        groups,
        ..
    } = &node.op
    else {
        return None;
    };
    let &[1, c, h, w] = x else {
        return None;
    };
    let g = ConvTranspose2d {
        c_in: c,
        h_in: h,
        w_in: w,
        c_out: bias.len(),
        kh: kernel[0],
        kw: kernel[1],
        stride: *stride,
        pad: *pad,
        groups: *groups,
    };
    (g.check().is_ok() && g.weight_len() == weight.len()).then_some(g)
}

/// The output shape of `node` when the device runs it on inputs of the
/// planned `shapes`; None when it does not (an op or shape it lacks).
fn device_shape(node: &Node, shapes: &[Option<Vec<usize>>]) -> Option<Vec<usize>> {
    // Device values only: constants and integer shape arithmetic stay on
    // the CPU.
    let ins: Vec<&[usize]> = node
        .inputs
        .iter()
        .map(|&s| shapes[s].as_deref())
        .collect::<Option<_>>()?;
    let x = ins[0];
    let image = matches!(x, &[1, _, _, _]);
    match &node.op {
        Op::Conv { tail, .. } => {
            let g = conv_geometry(node, x)?;
            let channels = tail.affine.len() / 2;
            (channels == 0 || channels == g.c_out).then(|| vec![1, g.c_out, g.h_out(), g.w_out()])
        }
        Op::ConvTranspose { tail, .. } => {
            let g = transpose_geometry(node, x)?;
            let channels = tail.affine.len() / 2;
            (channels == 0 || channels == g.c_out).then(|| vec![1, g.c_out, g.h_out(), g.w_out()])
        }
        Op::Chain(chain) => {
            let channels = chain.affine.len() / 2;
            let n: usize = x.iter().product();
            // A chain not run in place copies its input first: whole vec4s.
            let fits = image && (channels == 0 || channels == x[1]) && n.is_multiple_of(4);
            fits.then(|| x.to_vec())
        }
        Op::Binary(Binary::Add) => (ins.len() == 2 && ins[0] == ins[1]).then(|| x.to_vec()),
        Op::Binary(Binary::Mul) if ins.len() == 2 => {
            let (a, s) = if ins[0].iter().product::<usize>() >= ins[1].iter().product() {
                (ins[0], ins[1])
            } else {
                (ins[1], ins[0])
            };
            match (a, s) {
                (&[1, c, _, _], &[1, cs, 1, 1]) if c == cs => Some(a.to_vec()),
                _ => None,
            }
        }
        Op::GlobalAveragePool if image => Some(vec![1, x[1], 1, 1]),
        Op::ResizeNearest { scale } if image => {
            let (ho, wo) = (
                (x[2] as f32 * scale[0]).floor() as usize,
                (x[3] as f32 * scale[1]).floor() as usize,
            );
            (ho > 0 && wo > 0).then(|| vec![1, x[1], ho, wo])
        }
        Op::Concat { axis } if *axis == 1 || *axis == -3 => {
            let ok = ins
                .iter()
                .all(|s| s.len() == 4 && s[0] == 1 && s[2..] == x[2..]);
            ok.then(|| vec![1, ins.iter().map(|s| s[1]).sum(), x[2], x[3]])
        }
        _ => None,
    }
}

/// A network, run on the GPU once [`Network::use_gpu`] has uploaded it.
pub struct Network {
    pub net: Net,
    pub(super) gpu: Option<GpuNet>,
}

impl std::ops::Deref for Network {
    type Target = Net;
    fn deref(&self) -> &Net {
        &self.net
    }
}

impl Network {
    pub fn cpu(net: Net) -> Network {
        Network { net, gpu: None }
    }

    pub fn gpu(&self) -> Option<&GpuNet> {
        self.gpu.as_ref()
    }

    /// As [`Net::run`], on the GPU when the network is there.
    pub fn run(&self, input: Tensor) -> Result<Vec<Tensor>> {
        match &self.gpu {
            Some(g) => g.run(&self.net, input),
            None => self.net.run(input),
        }
    }
}
