//! GPU timestamps between the dispatches of one compute pass, for finding
//! where a decode step's or a prefill's time goes (`scoreboard --profile`). Needs the
//! adapter's timestamp queries inside passes (Vulkan and DX12 drivers mostly
//! have them; WebGPU does not).

use super::Gpu;
use crate::error::{Error, Result};
use serde::Serialize;
use web_time::Instant;

/// A query set of timestamps written between dispatches, resolved into a
/// buffer and read back after the submission.
pub struct PassTimer {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    staging: wgpu::Buffer,
    capacity: u32,
    /// Nanoseconds per timestamp tick.
    period: f64,
}

impl PassTimer {
    /// Room for `capacity` timestamps; an error when the adapter has no
    /// timestamp queries inside passes.
    pub fn new(gpu: &Gpu, capacity: u32) -> Result<PassTimer> {
        if !gpu.caps.timestamps {
            return Err(Error::gpu(format!(
                "{}: no timestamp queries inside compute passes on this adapter",
                gpu.info.name
            )));
        }
        // wgpu's cap on the queries of one set.
        let capacity = capacity.clamp(2, 4096);
        let bytes = capacity as u64 * 8;
        let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("pass timer"),
            ty: wgpu::QueryType::Timestamp,
            count: capacity,
        });
        let resolved = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("pass timer"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Ok(PassTimer {
            set,
            resolved,
            staging: gpu.staging("pass timer", bytes),
            capacity,
            period: gpu.queue.get_timestamp_period() as f64,
        })
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Writes timestamp `i` at this point of the pass.
    pub fn mark(&self, pass: &mut wgpu::ComputePass<'_>, i: u32) {
        pass.write_timestamp(&self.set, i);
    }

    /// Copies the first `n` timestamps towards the staging buffer; record
    /// after the pass ends.
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder, n: u32) {
        enc.resolve_query_set(&self.set, 0..n, &self.resolved, 0);
        enc.copy_buffer_to_buffer(&self.resolved, 0, &self.staging, 0, n as u64 * 8);
    }

    /// The first `n` timestamps in nanoseconds after the first, once
    /// submission `done`, which resolved them, has finished.
    pub fn read(&self, gpu: &Gpu, n: u32, done: wgpu::SubmissionIndex) -> Result<Vec<f64>> {
        let ticks: Vec<u64> =
            bytemuck::pod_collect_to_vec(&gpu.read_staging(&self.staging, n as u64 * 8, done)?);
        let t0 = ticks.first().copied().unwrap_or(0);
        Ok(ticks
            .iter()
            .map(|&t| t.saturating_sub(t0) as f64 * self.period)
            .collect())
    }
}

/// The timestamps of one profiled pass as it is recorded: one before the
/// first dispatch, one after each, with the kernel names between them.
pub struct PassMarks<'t> {
    timer: &'t PassTimer,
    names: Vec<&'static str>,
}

impl<'t> PassMarks<'t> {
    /// Writes the pass's first timestamp.
    pub fn start(timer: &'t PassTimer, pass: &mut wgpu::ComputePass<'_>) -> PassMarks<'t> {
        timer.mark(pass, 0);
        PassMarks {
            timer,
            names: Vec::new(),
        }
    }

    /// The timestamp after the dispatch just recorded, `name`'s (counted
    /// past the timer's capacity too, so that [`PassMarks::resolve`] can
    /// refuse the pass).
    pub fn after(&mut self, pass: &mut wgpu::ComputePass<'_>, name: &'static str) {
        self.names.push(name);
        let i = self.names.len() as u32;
        if i < self.timer.capacity() {
            self.timer.mark(pass, i);
        }
    }

    /// Copies the timestamps towards the host; record after the pass ends.
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder) -> Result<()> {
        let marks = self.names.len() as u32 + 1;
        if marks > self.timer.capacity() {
            return Err(Error::gpu(format!(
                "profile: {} dispatches are more than one pass's {} timestamps",
                self.names.len(),
                self.timer.capacity()
            )));
        }
        self.timer.resolve(enc, marks);
        Ok(())
    }

    /// Waits for submission `done` and adds the pass to `prof`; `host` are
    /// the first four instants [`StepProfile::add_step`] takes (prepare,
    /// record, finish/submit, wait), the end is when the timestamps are in.
    pub fn add_to(
        self,
        prof: &mut StepProfile,
        gpu: &Gpu,
        done: wgpu::SubmissionIndex,
        host: [Instant; 4],
    ) -> Result<()> {
        let ts = self.timer.read(gpu, self.names.len() as u32 + 1, done)?;
        let [prepare, record, submit, wait] = host;
        prof.add_step(
            [prepare, record, submit, wait, Instant::now()],
            &self.names,
            &ts,
        );
        Ok(())
    }
}

/// Where the time of a decode step or of a prefill submission goes,
/// averaged over the profiled steps.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepProfile {
    /// What one step is: "decode step", "prefill of 512 tokens".
    pub what: String,
    pub steps: usize,
    /// Host time from building the step's dispatches to having the result
    /// back.
    pub wall_us: f64,
    /// Host time preparing the step: building its buffers and bind groups
    /// (prefill; a decode step reuses the plan built at load), writing its
    /// inputs (a batched decode step).
    pub prepare_us: f64,
    /// Host time recording the dispatches into the pass.
    pub record_us: f64,
    /// Host time in `CommandEncoder::finish` and `Queue::submit`.
    pub submit_us: f64,
    /// Host time waiting for the device and mapping the result.
    pub wait_us: f64,
    /// Device time from the first dispatch's start to the last one's end.
    pub gpu_us: f64,
    pub dispatches: usize,
    /// Per kernel, in order of first use.
    pub kernels: Vec<KernelTime>,
}

#[derive(Clone, Debug, Serialize)]
pub struct KernelTime {
    pub name: String,
    /// Dispatches of it per step.
    pub calls: f64,
    /// Device time per step: from the end of the previous dispatch to the
    /// end of this one, so barriers and launch gaps count too.
    pub us: f64,
}

impl StepProfile {
    /// Adds one step: the host's instants at the start of its phases and at
    /// its end (`[prepare, record, finish/submit, wait, done]`), the kernel
    /// name of each dispatch and the timestamps around them
    /// (`names.len() + 1`, in ns from the first).
    pub fn add_step(&mut self, host: [Instant; 5], names: &[&str], ts: &[f64]) {
        let us = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e6;
        let [prepare, record, submit, wait, done] = host;
        self.prepare_us += us(prepare, record);
        self.record_us += us(record, submit);
        self.submit_us += us(submit, wait);
        self.wait_us += us(wait, done);
        self.wall_us += us(prepare, done);
        self.steps += 1;
        self.dispatches = names.len();
        self.gpu_us += ts.last().copied().unwrap_or(0.0) / 1e3;
        for (i, name) in names.iter().enumerate() {
            let dt = (ts[i + 1] - ts[i]).max(0.0) / 1e3;
            match self.kernels.iter_mut().find(|k| k.name == *name) {
                Some(k) => {
                    k.calls += 1.0;
                    k.us += dt;
                }
                None => self.kernels.push(KernelTime {
                    name: name.to_string(),
                    calls: 1.0,
                    us: dt,
                }),
            }
        }
    }

    /// Turns the sums into per-step averages.
    pub fn finish(mut self) -> StepProfile {
        let n = self.steps.max(1) as f64;
        for v in [
            &mut self.wall_us,
            &mut self.prepare_us,
            &mut self.record_us,
            &mut self.submit_us,
            &mut self.wait_us,
            &mut self.gpu_us,
        ] {
            *v /= n;
        }
        for k in &mut self.kernels {
            k.calls /= n;
            k.us /= n;
        }
        self
    }

    /// A markdown table for stderr.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{}, mean of {} runs: wall {:.1} us = prepare {:.1} + record {:.1} + finish/submit \
             {:.1} + wait {:.1}; device busy {:.1} us over {} dispatches ({:.2} us each)\n\n\
             | kernel | calls/step | us/step | share | us/call |\n|---|---:|---:|---:|---:|\n",
            self.what,
            self.steps,
            self.wall_us,
            self.prepare_us,
            self.record_us,
            self.submit_us,
            self.wait_us,
            self.gpu_us,
            self.dispatches,
            self.gpu_us / self.dispatches.max(1) as f64,
        );
        let mut ks = self.kernels.clone();
        ks.sort_by(|a, b| b.us.total_cmp(&a.us));
        for k in ks {
            s += &format!(
                "| {} | {:.0} | {:.1} | {:.1}% | {:.2} |\n",
                k.name,
                k.calls,
                k.us,
                100.0 * k.us / self.gpu_us.max(1e-9),
                k.us / k.calls.max(1e-9)
            );
        }
        s
    }
}

impl Gpu {
    /// Records `work` into one submission with a timestamp before the first
    /// dispatch and after each, waits for it and adds the step to `prof`;
    /// `start` is when the caller began building the step (its prepare time).
    pub fn run_timed(
        &self,
        work: &[&super::ops::Dispatch],
        start: Instant,
        prof: &mut StepProfile,
    ) -> Result<()> {
        let t0 = Instant::now();
        let timer = PassTimer::new(self, work.len() as u32 + 1)?;
        let mut enc = self.device.create_command_encoder(&Default::default());
        let marks = {
            let mut pass = enc.begin_compute_pass(&Default::default());
            let mut marks = PassMarks::start(&timer, &mut pass);
            for d in work {
                d.record(&mut pass);
                marks.after(&mut pass, d.bound.name);
            }
            marks
        };
        marks.resolve(&mut enc)?;
        let t1 = Instant::now();
        let done = self.queue.submit([enc.finish()]);
        let t2 = Instant::now();
        marks.add_to(prof, self, done, [start, t0, t1, t2])
    }
}
