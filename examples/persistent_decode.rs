//! What a persistent decode kernel would buy (issue 18, item 2): the chain of
//! GEMVs one decode token of LFM2 multiplies (Q4_0 weights of the real
//! shapes, random), with stand-ins for the light steps between them, run two
//! ways by the same kernel (`persistent_decode.wgsl`):
//!
//! - `chain`: one dispatch per step, as `generate` runs a token today;
//! - `persistent`: one dispatch per token whose workgroups meet at a grid-wide
//!   barrier (atomics) between steps, for each `--workgroups` count.
//!
//! Same rows for every team in both, so their outputs must be equal bit for
//! bit; both are checked against an f64 reference of the chain on the host.
//!
//! The `ahead` rows run a second kernel (`persistent_ahead.wgsl`), chained
//! and persistent: each team owns fixed rows of every step and loads its
//! weights of the next step into registers before it waits at the barrier
//! (`ahead, loaded after the barrier`: the same kernel without that).
//! A `barriers` row runs the same number of empty steps, to separate the
//! barrier's cost from the work. Weights total more than the L2, so they come
//! from DRAM every token.
//!
//!     cargo run --release --example persistent_decode -- [--model 350m|tiny]
//!         [--workgroups 132,264] [--tokens 32] [--reps 5] [--spin-limit 20000]
//!         [--split 1|2|4|8 (teams per row group; default: enough to busy every team)]
//!         [--rows-cap N (every step computes at most N rows: a step's fixed cost)]
//!         [--ladder 1 (the ahead kernel with parts of a step left out)]
//!
//! Prints a markdown table: microseconds per token, GB/s of weights, and the
//! barrier timeouts counted (non-zero: the adapter did not hold all the
//! workgroups at once, and that row's output is wrong).

use anyhow::{bail, Context};
use lfm::gpu::preprocess::preprocess;
use lfm::gpu::{Gpu, GpuOptions};
use lfm::util::rng::Rng;
use std::time::Instant;
use wgpu::util::DeviceExt;

const MAXK: usize = 4608;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    first: u32,
    last: u32,
    nwg: u32,
    spin_limit: u32,
    base: u32,
    /// persistent_ahead.wgsl only: how much of a step runs (0: all), and
    /// which memory barriers it leaves out (see its Params).
    stage: u32,
    flags: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Step {
    kind: u32,
    parts: u32,
    rows: u32,
    k: u32,
    w_off: u32,
    d_off: u32,
    x_off: u32,
    y_off: u32,
    norm: u32,
    r_off: u32,
    split: u32,
    pad: u32,
    /// persistent_ahead.wgsl's cut of the step (see its Step).
    blocks: u32,
    pnb: u32,
    chunk: u32,
    chunks: u32,
    rpc: u32,
    pad2: [u32; 3],
    slots: [u32; 8],
}

const STORE: u32 = 0;
const ADD: u32 = 1;
const SWIGLU: u32 = 2;
const GATED3: u32 = 3;
const COPY: u32 = 4;
const NOP: u32 = 5;
/// persistent_ahead.wgsl only: every workgroup adds a vector of `rows`
/// floats into y with compare-and-swap (a split-k accumulation's cost), or
/// in fixed point with integer atomicAdd.
const ACCUM_CAS: u32 = 6;
const ACCUM_INT: u32 = 7;

/// Shapes: hidden d, FFN width f, key/value width, vocabulary, which layers
/// are attention (the rest are LFM2 short-conv layers).
struct Shape {
    d: usize,
    f: usize,
    kv: usize,
    vocab: usize,
    attention: Vec<bool>,
}

fn shape(name: &str) -> anyhow::Result<Shape> {
    // LFM2's layer pattern (models/lfm2.rs): attention at these indices.
    let pattern = |n: usize, attn: &[usize]| (0..n).map(|i| attn.contains(&i)).collect();
    Ok(match name {
        "350m" => Shape {
            d: 1024,
            f: 4608,
            kv: 512,
            vocab: 65536,
            attention: pattern(16, &[2, 5, 8, 10, 12, 14]),
        },
        "tiny" => Shape {
            d: 256,
            f: 512,
            kv: 128,
            vocab: 2048,
            attention: pattern(4, &[1, 3]),
        },
        _ => bail!("--model is 350m or tiny (the kernel holds k <= {MAXK})"),
    })
}

/// The weights of every step, packed as the kernel reads them, and the steps.
struct Program {
    words: Vec<u32>,
    steps: Vec<Step>,
    /// Floats of the activation buffer.
    act_len: usize,
    /// Where the residual stream and the logits are.
    resid: usize,
    logits: usize,
    weight_bytes: usize,
}

/// `rows_cap`: every step computes at most that many rows (its output region
/// keeps the full size), to price a step's fixed cost apart from its bytes.
fn build(s: &Shape, rng: &mut Rng, rows_cap: usize) -> Program {
    let d = s.d;
    // Every step's output gets a region of its own (the kernel's header says
    // why), 1 KiB-aligned.
    let mut act_len = 0;
    let mut region = |n: usize| {
        let at = act_len;
        act_len += n.div_ceil(256) * 256;
        at
    };
    let mut resid = region(d);
    let mut words = Vec::new();
    let mut steps = Vec::new();
    let mut weight_bytes = 0;
    let mut matrix = |words: &mut Vec<u32>, parts: usize, rows: usize, k: usize| {
        let blocks = parts * rows * k / 32;
        // 16-byte aligned: the ahead kernel reads a block's nibbles as one vec4.
        words.resize(words.len().next_multiple_of(4), 0);
        let w_off = words.len();
        words.extend((0..blocks * 4).map(|_| rng.next_u64() as u32));
        let d_off = words.len();
        // Scales so that an output of unit-rms inputs has rms about 0.3.
        let scale = 0.3 / (4.6 * (k as f32).sqrt());
        for _ in 0..blocks.div_ceil(2) {
            let a = half::f16::from_f32(scale * (0.5 + rng.next_f32()));
            let b = half::f16::from_f32(scale * (0.5 + rng.next_f32()));
            words.push(a.to_bits() as u32 | (b.to_bits() as u32) << 16);
        }
        weight_bytes += blocks * 18;
        (w_off as u32, d_off as u32)
    };
    // One step reading x; returns where it wrote.
    let mut step = |words: &mut Vec<u32>,
                    region: &mut dyn FnMut(usize) -> usize,
                    kind,
                    parts: usize,
                    rows: usize,
                    k: usize,
                    x: usize,
                    r: usize,
                    norm: bool| {
        let (w_off, d_off) = if kind == COPY {
            (0, 0)
        } else {
            matrix(words, parts, rows.min(rows_cap), k)
        };
        let y = region(rows);
        let rows = rows.min(rows_cap);
        steps.push(Step {
            kind,
            parts: parts as u32,
            rows: rows as u32,
            k: k as u32,
            w_off,
            d_off,
            x_off: x as u32,
            y_off: y as u32,
            norm: norm as u32,
            r_off: r as u32,
            split: 1,
            ..Default::default()
        });
        y
    };
    let w = &mut words;
    for &attn in &s.attention {
        let mixed = if attn {
            let qkv = step(w, &mut region, STORE, 1, d + 2 * s.kv, d, resid, 0, true);
            // Attention at one position: its output is the values (here the
            // first d of q, k, v), a light step that still needs all of qkv.
            step(w, &mut region, COPY, 0, d, 0, qkv, 0, false)
        } else {
            step(w, &mut region, GATED3, 3, d, d, resid, 0, true)
        };
        resid = step(w, &mut region, ADD, 1, d, d, mixed, resid, false);
        let h = step(w, &mut region, SWIGLU, 2, s.f, d, resid, 0, true);
        resid = step(w, &mut region, ADD, 1, d, s.f, h, resid, false);
    }
    let logits = step(w, &mut region, STORE, 1, s.vocab, d, resid, 0, true);
    Program {
        words,
        steps,
        act_len,
        resid,
        logits,
        weight_bytes,
    }
}

/// Teams per group of rows for `nwg` workgroups of 8 teams: enough that
/// every team has work where a matrix has fewer 4-row groups than teams.
fn with_splits(steps: &[Step], nwg: u32, fixed: Option<u32>) -> Vec<Step> {
    steps
        .iter()
        .map(|s| {
            let chunks = s.rows.div_ceil(4).max(1);
            let auto = ((nwg * 8) / chunks).clamp(1, 8);
            let split = fixed.unwrap_or(1 << (31 - auto.leading_zeros()));
            ahead_cut(&Step { split, ..*s }, nwg)
        })
        .collect()
}

/// Units a thread of persistent_ahead.wgsl holds.
const AHEAD_UNITS: u32 = 8;

/// persistent_ahead.wgsl's cut of a step for `nwg` workgroups of 8 teams:
/// units (local row, block column, part; part fastest) in chunks of whole
/// rows, and where each of a chunk's unit slots is.
fn ahead_cut(s: &Step, nwg: u32) -> Step {
    let teams = nwg * 8;
    let blocks = s.k / 32;
    let parts = s.parts.max(1);
    let pnb = parts * blocks.div_ceil(32).max(1);
    let chunk = (AHEAD_UNITS / pnb) * pnb;
    let most = s.rows.div_ceil(teams);
    let mut slots = [0u32; 8];
    for (i, slot) in slots.iter_mut().enumerate() {
        let i = i as u32;
        let rem = i % pnb;
        let (lr, j, part) = (i / pnb, rem / parts, rem % parts);
        let used = (i < chunk) as u32;
        *slot = lr | j << 8 | part << 16 | used << 24;
    }
    Step {
        blocks,
        pnb,
        chunk,
        chunks: (most * pnb).div_ceil(chunk.max(1)),
        rpc: chunk / pnb,
        slots,
        ..*s
    }
}

/// The chain on the host, in f64, from `act` (one token).
fn reference(prog: &Program, act: &mut [f32]) {
    let w = &prog.words;
    let scale = |d_off: u32, blk: usize| {
        let word = w[d_off as usize + blk / 2];
        let bits = if blk % 2 == 1 {
            word >> 16
        } else {
            word & 0xffff
        };
        half::f16::from_bits(bits as u16).to_f64()
    };
    for s in &prog.steps {
        if s.kind == COPY {
            for i in 0..s.rows as usize {
                act[s.y_off as usize + i] = act[s.x_off as usize + i];
            }
            continue;
        }
        let k = s.k as usize;
        let mut x: Vec<f64> = act[s.x_off as usize..][..k]
            .iter()
            .map(|&v| v as f64)
            .collect();
        if s.norm == 1 {
            let ms = x.iter().map(|v| v * v).sum::<f64>() / k as f64;
            let inv = 1.0 / (ms + 1e-5).sqrt();
            x.iter_mut().for_each(|v| *v *= inv);
        }
        let dot = |row: usize| {
            let mut acc = 0.0;
            for b in 0..k / 32 {
                let blk = row * (k / 32) + b;
                let mut sum = 0.0;
                for i in 0..16 {
                    let word = w[s.w_off as usize + blk * 4 + i / 4];
                    let byte = (word >> (8 * (i % 4))) & 0xff;
                    sum += ((byte & 15) as f64 - 8.0) * x[32 * b + i];
                    sum += ((byte >> 4) as f64 - 8.0) * x[32 * b + 16 + i];
                }
                acc += scale(s.d_off, blk) * sum;
            }
            acc
        };
        let rows = s.rows as usize;
        let act_r: Vec<f32> = act[s.r_off as usize..][..rows].to_vec();
        for r in 0..rows {
            let a = dot(r);
            let y = &mut act[s.y_off as usize + r];
            *y = match s.kind {
                STORE => a as f32,
                ADD => (act_r[r] as f64 + a) as f32,
                SWIGLU => (a / (1.0 + (-a).exp()) * dot(rows + r)) as f32,
                _ => (a * dot(rows + r) * dot(2 * rows + r)) as f32,
            };
        }
    }
}

/// The kernels compared: persistent_decode.wgsl without and with PREFETCH,
/// and persistent_ahead.wgsl loading the next step's weights before or after
/// the barrier.
#[derive(Clone, Copy, PartialEq)]
enum Kernel {
    Plain,
    Prefetch,
    Ahead,
    AheadAfter,
}

impl Kernel {
    const ALL: [Kernel; 4] = [
        Kernel::Plain,
        Kernel::Prefetch,
        Kernel::Ahead,
        Kernel::AheadAfter,
    ];
}

/// Stage and flags of a run that leaves nothing out.
const FULL: (u32, u32) = (0, 0);

struct Probe {
    gpu: Gpu,
    /// One per `Kernel`.
    pipelines: Vec<wgpu::ComputePipeline>,
    layout: wgpu::BindGroupLayout,
    weights: wgpu::Buffer,
    act: wgpu::Buffer,
    sync: wgpu::Buffer,
    n_steps: u32,
}

impl Probe {
    fn new(gpu: Gpu, prog: &Program) -> anyhow::Result<Probe> {
        let subgroups = gpu.caps.subgroups && gpu.caps.subgroup_min == 32;
        let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = gpu
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("persistent_decode"),
                entries: &[
                    wgpu::BindGroupLayoutEntry {
                        binding: 0,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Uniform,
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    },
                    storage(1, true),
                    storage(2, true),
                    storage(3, false),
                    storage(4, false),
                    storage(5, false),
                    storage(6, true),
                ],
            });
        let pl = gpu
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("persistent_decode"),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let compile = |kernel: Kernel| -> anyhow::Result<wgpu::ComputePipeline> {
            let mut defines = Vec::new();
            if subgroups {
                defines.push("SUBGROUPS");
            }
            let (name, source) = match kernel {
                Kernel::Plain => (
                    "persistent_decode.wgsl",
                    include_str!("persistent_decode.wgsl"),
                ),
                Kernel::Prefetch => {
                    defines.push("PREFETCH");
                    (
                        "persistent_decode.wgsl",
                        include_str!("persistent_decode.wgsl"),
                    )
                }
                Kernel::Ahead => (
                    "persistent_ahead.wgsl",
                    include_str!("persistent_ahead.wgsl"),
                ),
                Kernel::AheadAfter => {
                    defines.push("AFTER");
                    (
                        "persistent_ahead.wgsl",
                        include_str!("persistent_ahead.wgsl"),
                    )
                }
            };
            let text = preprocess(source, &defines).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            let module = gpu
                .device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some("persistent_decode"),
                    source: wgpu::ShaderSource::Wgsl(text.into()),
                });
            Ok(gpu
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some("persistent_decode"),
                    layout: Some(&pl),
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: Default::default(),
                    cache: None,
                }))
        };
        let pipelines = Kernel::ALL
            .iter()
            .map(|&k| compile(k))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let weights = gpu.upload_u32("weights", &prog.words)?;
        let act = gpu.scratch("act", (prog.act_len * 4) as u64)?;
        let sync = gpu.scratch("sync", 16)?;
        eprintln!(
            "{}; team reduction: {}",
            gpu.describe(),
            if subgroups {
                "subgroups"
            } else {
                "workgroup memory"
            }
        );
        Ok(Probe {
            gpu,
            pipelines,
            layout,
            weights,
            act,
            sync,
            n_steps: prog.steps.len() as u32,
        })
    }

    fn bind(&self, steps: &wgpu::Buffer, params: Params) -> wgpu::BindGroup {
        let uniform = self
            .gpu
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("params"),
                contents: bytemuck::bytes_of(&params),
                usage: wgpu::BufferUsages::UNIFORM,
            });
        self.gpu
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("persistent_decode"),
                layout: &self.layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: uniform.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: steps.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: self.weights.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 3,
                        resource: self.act.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 4,
                        resource: self.sync.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 5,
                        resource: self.act.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 6,
                        resource: self.weights.as_entire_binding(),
                    },
                ],
            })
    }

    /// `tokens` tokens in one submission: per token one dispatch of `nwg`
    /// workgroups over all steps (persistent) or one per step (chain).
    /// Returns the host-timed seconds and the barrier timeouts.
    fn run(
        &self,
        steps: &wgpu::Buffer,
        nwg: u32,
        (persistent, kernel, (stage, flags)): (bool, Kernel, (u32, u32)),
        tokens: u32,
        spin_limit: u32,
    ) -> anyhow::Result<(f64, u32)> {
        let params = |first, last, base| Params {
            first,
            last,
            nwg,
            spin_limit,
            base,
            stage,
            flags,
            pad: 0,
        };
        let groups: Vec<wgpu::BindGroup> = if persistent {
            (0..tokens)
                .map(|t| self.bind(steps, params(0, self.n_steps, t * (self.n_steps - 1))))
                .collect()
        } else {
            (0..self.n_steps)
                .map(|i| self.bind(steps, params(i, i + 1, 0)))
                .collect()
        };
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        enc.clear_buffer(&self.sync, 0, None);
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipelines[kernel as usize]);
            for t in 0..tokens as usize {
                if persistent {
                    pass.set_bind_group(0, &groups[t], &[]);
                    pass.dispatch_workgroups(nwg, 1, 1);
                } else {
                    for g in &groups {
                        pass.set_bind_group(0, g, &[]);
                        pass.dispatch_workgroups(nwg, 1, 1);
                    }
                }
            }
        }
        let start = Instant::now();
        self.gpu.submit_and_wait(enc)?;
        let secs = start.elapsed().as_secs_f64();
        let sync = self.gpu.read_u32(&self.sync)?;
        Ok((secs, sync[1]))
    }
}

fn parse_list(v: &str) -> anyhow::Result<Vec<u32>> {
    v.split(',')
        .map(|s| s.trim().parse().context("--workgroups: a list of counts"))
        .collect()
}

fn main() -> anyhow::Result<()> {
    let mut model = "350m".to_string();
    let mut workgroups = vec![132, 264];
    let mut tokens = 32u32;
    let mut reps = 5;
    let mut spin_limit = 20_000u32;
    let mut force_split = None;
    let mut rows_cap = usize::MAX;
    let mut ladder = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().context("flag needs a value")?;
        match a.as_str() {
            "--model" => model = v,
            "--workgroups" => workgroups = parse_list(&v)?,
            "--tokens" => tokens = v.parse()?,
            "--reps" => reps = v.parse()?,
            "--spin-limit" => spin_limit = v.parse()?,
            "--split" => force_split = Some(v.parse()?),
            "--rows-cap" => rows_cap = v.parse()?,
            "--ladder" => ladder = v == "1",
            _ => bail!("unknown flag {a}"),
        }
    }
    let shape = shape(&model)?;
    let mut rng = Rng::new(18);
    let prog = build(&shape, &mut rng, rows_cap);
    let gpu = Gpu::new(&GpuOptions {
        required: true,
        ..Default::default()
    })?;
    if gpu.caps.max_workgroup_storage < (MAXK as u32 * 33 / 32 + 256) * 4 + 4096 {
        bail!("the adapter's workgroup memory is too small for the probe kernel");
    }
    if gpu.is_software() {
        // Software Vulkan ends loops past lfm::gpu::SOFTWARE_LOOP_LIMIT
        // iterations silently: the spin must give up before that.
        spin_limit = spin_limit.min(lfm::gpu::SOFTWARE_LOOP_LIMIT as u32 / 4);
    }
    let probe = Probe::new(gpu, &prog)?;
    let input: Vec<f32> = (0..prog.act_len).map(|_| rng.next_f32() - 0.5).collect();
    let mut expect = input.clone();
    reference(&prog, &mut expect);
    let nop_steps: Vec<Step> = (0..probe.n_steps)
        .map(|_| Step {
            kind: NOP,
            ..Default::default()
        })
        .collect();
    let nops = probe.gpu.upload("nops", bytemuck::cast_slice(&nop_steps))?;
    let accumulating = |kind| {
        let steps: Vec<Step> = (0..probe.n_steps)
            .map(|_| Step {
                kind,
                rows: shape.d as u32,
                y_off: prog.resid as u32,
                ..Default::default()
            })
            .collect();
        probe.gpu.upload("accumulate", bytemuck::cast_slice(&steps))
    };
    let (accum_cas, accum_int) = (accumulating(ACCUM_CAS)?, accumulating(ACCUM_INT)?);

    println!(
        "model {model}: {} steps a token ({} barriers), {:.1} MB of Q4_0 weights, {tokens} tokens a submission, best of {reps}\n",
        prog.steps.len(),
        prog.steps.len() - 1,
        prog.weight_bytes as f64 / 1e6
    );
    println!("| mode | workgroups | us / token | weight GB/s | timeouts | logits error (rms share) | equal to chain |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    let mut chain_out: Option<Vec<f32>> = None;
    for &nwg in &workgroups {
        let upload = |steps: Vec<Step>| probe.gpu.upload("steps", bytemuck::cast_slice(&steps));
        let split = upload(with_splits(&prog.steps, nwg, force_split))?;
        let unsplit = upload(with_splits(&prog.steps, nwg, Some(1)))?;
        let mut modes = vec![
            ("chain", false, Kernel::Plain, &split, FULL),
            ("persistent, k unsplit", true, Kernel::Plain, &unsplit, FULL),
            ("persistent", true, Kernel::Plain, &split, FULL),
            ("persistent, prefetch", true, Kernel::Prefetch, &split, FULL),
            ("ahead, chain", false, Kernel::Ahead, &split, FULL),
            ("ahead", true, Kernel::Ahead, &split, FULL),
            (
                "ahead, loaded after the barrier",
                true,
                Kernel::AheadAfter,
                &split,
                FULL,
            ),
        ];
        if ladder {
            modes.extend([
                (
                    "ahead, steps read x only",
                    true,
                    Kernel::Ahead,
                    &split,
                    (1, 0),
                ),
                (
                    "ahead, steps without stores",
                    true,
                    Kernel::Ahead,
                    &split,
                    (2, 0),
                ),
                (
                    "ahead, no barrier after the wait",
                    true,
                    Kernel::Ahead,
                    &split,
                    (0, 1),
                ),
                (
                    "ahead, no barrier before the arrival",
                    true,
                    Kernel::Ahead,
                    &split,
                    (0, 2),
                ),
            ]);
        }
        if ladder {
            modes.extend([
                (
                    "ahead, steps only accumulate (CAS)",
                    true,
                    Kernel::Ahead,
                    &accum_cas,
                    FULL,
                ),
                (
                    "ahead, steps only accumulate (integer)",
                    true,
                    Kernel::Ahead,
                    &accum_int,
                    FULL,
                ),
            ]);
        }
        modes.push(("barriers only", true, Kernel::Plain, &nops, FULL));
        for (mode, persistent, kernel, steps, variant) in modes {
            // One token from the known input, for the checks.
            probe
                .gpu
                .queue
                .write_buffer(&probe.act, 0, bytemuck::cast_slice(&input));
            let (_, timeouts) =
                probe.run(steps, nwg, (persistent, kernel, variant), 1, spin_limit)?;
            let out = probe.gpu.read_f32(&probe.act)?;
            let timing_only = [&nops, &accum_cas, &accum_int]
                .iter()
                .any(|b| std::ptr::eq(steps, *b));
            let (error, equal) = if timing_only {
                ("-".to_string(), "-".to_string())
            } else {
                let range = prog.logits..prog.logits + shape.vocab;
                let rms = (expect[range.clone()].iter().map(|v| v * v).sum::<f32>()
                    / shape.vocab as f32)
                    .sqrt();
                let err = out[range.clone()]
                    .iter()
                    .zip(&expect[range])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                let resid_ok = out[prog.resid..prog.resid + shape.d]
                    .iter()
                    .all(|v| v.is_finite());
                if !resid_ok {
                    bail!("{mode} at {nwg} workgroups: non-finite residual stream");
                }
                let equal = match &chain_out {
                    Some(c) if persistent && std::ptr::eq(steps, &split) => {
                        if c.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()) {
                            "yes"
                        } else {
                            "NO"
                        }
                    }
                    _ => "-",
                };
                if !persistent {
                    chain_out = Some(out.clone());
                }
                (format!("{:.1e}", err / rms), equal.to_string())
            };
            let mut best = f64::MAX;
            let mut timeouts_total = timeouts;
            for _ in 0..reps {
                let (secs, t) = probe.run(
                    steps,
                    nwg,
                    (persistent, kernel, variant),
                    tokens,
                    spin_limit,
                )?;
                best = best.min(secs);
                timeouts_total += t;
            }
            let us = best * 1e6 / tokens as f64;
            let gbs = if timing_only {
                "-".to_string()
            } else {
                format!("{:.0}", prog.weight_bytes as f64 / (us * 1e3))
            };
            println!("| {mode} | {nwg} | {us:.1} | {gbs} | {timeouts_total} | {error} | {equal} |");
        }
        chain_out = None;
    }
    Ok(())
}
