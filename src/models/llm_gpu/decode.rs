//! Decode: the recipe recorded once as fused dispatches over the decode
//! buffers (rebuilt when the KV cache grows), then one submission per token.

use super::{GpuFfn, GpuLlm, GpuMixer, GpuState, GreedyGuide, Op, Readback};
use crate::error::Result;
use crate::gpu::llm_ops::{self, AttnBuffers, GemvEpilogue};
use crate::gpu::ops::{self, Dispatch};
use crate::gpu::profile::{PassMarks, PassTimer, StepProfile};
use crate::gpu::Variant;
use crate::models::llm::{attn_shape, conv_ring_rows};
use crate::models::recipe::{self, DecoderOps, Residual};
use std::rc::Rc;
use web_time::Instant;

/// Records the recipe's operations for one token.
struct DecodeRecorder<'a> {
    m: &'a GpuLlm,
    plan: Vec<Op>,
    /// The last block's output, the input of its projection.
    y: Option<&'a wgpu::Buffer>,
}

impl DecodeRecorder<'_> {
    fn fixed(&mut self, ds: Vec<Dispatch>) {
        self.plan.extend(ds.into_iter().map(Op::Fixed));
    }
}

impl<'a> DecoderOps for DecodeRecorder<'a> {
    fn embed(&mut self) -> Result<()> {
        let m = self.m;
        let io = &m.io;
        let scale = m.cfg.embed_scale;
        self.fixed(llm_ops::embedding(
            &m.gpu, &m.embed, &io.token, 0, 1, scale, &io.x, 1,
        )?);
        Ok(())
    }

    fn attention(&mut self, li: usize) -> Result<()> {
        let m: &'a GpuLlm = self.m;
        let (g, io, sub) = (&*m.gpu, &m.io, m.subgroups);
        let layer = &m.layers[li];
        let (GpuMixer::Attention { qkv, consts, .. }, GpuState::Kv { k, v }) =
            (&layer.mixer, &m.state[li])
        else {
            unreachable!("the recipe runs attention on attention layers")
        };
        let norm1 = GemvEpilogue::Norm {
            nw: &layer.norm1,
            eps: m.cfg.norm_eps,
        };
        for (mat, off) in qkv {
            self.fixed(llm_ops::gemv(g, mat, &norm1, &io.x, 0, &io.qkv, *off)?);
        }
        let kv = AttnBuffers {
            step: &io.step,
            k_cache: k,
            v_cache: v,
        };
        let shape = attn_shape(&m.cfg, li);
        let cs = if m.cfg.uses_local_rope(li) {
            &io.cs_local
        } else {
            &io.cs
        };
        let fused = llm_ops::flash_attention_prep(
            g,
            sub,
            &shape,
            &io.qkv,
            consts.as_ref(),
            cs,
            &kv,
            &io.att,
            &io.part,
        )?;
        let att = match fused {
            Some(att) => att,
            None => {
                let consts = consts.as_ref();
                let rope = llm_ops::qk_rope(g, &shape, &io.qkv, consts, cs, &kv, &io.q, 1)?;
                self.plan.push(Op::Fixed(rope));
                llm_ops::flash_attention(g, sub, &shape, &io.q, &kv, &io.att, &io.part, 1)?
            }
        };
        self.plan.push(Op::Attention(att));
        self.y = Some(&io.att);
        Ok(())
    }

    fn short_conv(&mut self, li: usize) -> Result<()> {
        let m: &'a GpuLlm = self.m;
        let (g, io) = (&*m.gpu, &m.io);
        let layer = &m.layers[li];
        let (GpuMixer::Conv { in_proj, conv, .. }, GpuState::Conv(st)) =
            (&layer.mixer, &m.state[li])
        else {
            unreachable!("the recipe runs the conv block on conv layers")
        };
        let epi = GemvEpilogue::Conv {
            nw: &layer.norm1,
            eps: m.cfg.norm_eps,
            conv,
            state: st,
            step: &io.step,
            taps: m.cfg.conv_kernel,
            ring: conv_ring_rows(m.cfg.conv_kernel),
        };
        self.fixed(llm_ops::gemv(g, in_proj, &epi, &io.x, 0, &io.conv_out, 0)?);
        self.y = Some(&io.conv_out);
        Ok(())
    }

    fn ffn(&mut self, li: usize) -> Result<()> {
        let m: &'a GpuLlm = self.m;
        let (g, io) = (&*m.gpu, &m.io);
        let (layer, eps, act) = (&m.layers[li], m.cfg.norm_eps, m.cfg.ffn_act);
        match &layer.ffn {
            GpuFfn::Fused(mat) => {
                let epi = GemvEpilogue::Swiglu {
                    nw: &layer.norm2,
                    eps,
                    act,
                };
                self.fixed(llm_ops::gemv(g, mat, &epi, &io.x, 0, &io.g, 0)?);
            }
            GpuFfn::Split(gate, up) => {
                let norm2 = GemvEpilogue::Norm {
                    nw: &layer.norm2,
                    eps,
                };
                let f = m.cfg.ffn;
                self.fixed(llm_ops::gemv(g, gate, &norm2, &io.x, 0, &io.gu, 0)?);
                self.fixed(llm_ops::gemv(g, up, &norm2, &io.x, 0, &io.gu, f)?);
                self.plan
                    .push(Op::Fixed(llm_ops::swiglu(g, &io.gu, &io.g, f, 1, act)?));
            }
        }
        self.y = Some(&io.g);
        Ok(())
    }

    fn residual(&mut self, li: usize, which: Residual) -> Result<()> {
        let m: &'a GpuLlm = self.m;
        let (g, io, sub) = (&*m.gpu, &m.io, m.subgroups);
        let layer = &m.layers[li];
        let (w, post) = layer.residual(which);
        let y = self.y.take().expect("a block ran before its projection");
        match post {
            None => self.fixed(llm_ops::gemv(g, w, &GemvEpilogue::Add, y, 0, &io.x, 0)?),
            Some(pw) => {
                self.fixed(llm_ops::gemv(g, w, &GemvEpilogue::Store, y, 0, &io.mix, 0)?);
                let variant = norm_add_variant(sub);
                let d = m.cfg.hidden;
                let add = ops::rms_norm(g, &variant, &io.mix, pw, &io.x, d, 1, m.cfg.norm_eps)?;
                self.plan.push(Op::Fixed(add));
            }
        }
        Ok(())
    }

    fn head(&mut self) -> Result<()> {
        let m = self.m;
        let head = GemvEpilogue::Norm {
            nw: &m.final_norm,
            eps: m.cfg.norm_eps,
        };
        let io = &m.io;
        self.fixed(llm_ops::gemv(
            &m.gpu,
            m.head(),
            &head,
            &io.x,
            0,
            &io.logits,
            0,
        )?);
        Ok(())
    }
}

/// The rms_norm variant that adds a post-norm into the residual stream.
pub(super) fn norm_add_variant(subgroups: bool) -> Variant {
    if subgroups {
        Variant::new(&["ADD", "SUBGROUPS"])
    } else {
        Variant::new(&["ADD"])
    }
}

impl GpuLlm {
    /// The decode plan over the current buffers (rebuilt when the KV cache
    /// grows).
    pub(super) fn build_plan(&self) -> Result<Vec<Op>> {
        let mut rec = DecodeRecorder {
            m: self,
            plan: Vec::new(),
            y: None,
        };
        recipe::decoder(&self.cfg, &mut rec)?;
        Ok(rec.plan)
    }

    /// One decode step: appends `token`; returns the bytes `what` asks for.
    pub(super) fn decode(&mut self, token: u32, what: Readback) -> Result<Vec<u8>> {
        self.check_tokens(&[token])?;
        self.write_token(token);
        let splits = self.begin_step()?;
        let mut enc = self.encode_step(splits, what);
        let g = &*self.gpu;
        let io = &self.io;
        let (src, staging, len) = match what {
            Readback::Token | Readback::Drawn => (&io.token, &io.token_staging, super::TOKEN_BYTES),
            Readback::Candidates => (&io.cand, &io.cand_staging, 8 * self.top_k as u64),
            Readback::Logits => (&io.logits, &io.logits_staging, (self.cfg.vocab * 4) as u64),
        };
        enc.copy_buffer_to_buffer(src, 0, staging, 0, len);
        let out = g.submit_and_read(enc, staging, len)?;
        self.pos += 1;
        Ok(out)
    }

    /// Makes room for one more position and writes its step values; returns
    /// the attention splits the step records.
    fn begin_step(&mut self) -> Result<usize> {
        self.ensure_capacity(self.pos + 1)?;
        let splits = llm_ops::attention_splits(self.pos + 1);
        self.write_step(1, splits, &self.io.cs, &self.io.cs_local);
        Ok(splits)
    }

    /// An encoder holding one decode step's pass (the readback copy is the
    /// caller's).
    fn encode_step(&self, splits: usize, what: Readback) -> wgpu::CommandEncoder {
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            self.record_step(&mut pass, splits, what, &mut |_, _| {});
        }
        enc
    }

    /// Sets the token the next decode step consumes (otherwise it consumes
    /// the one the previous step's argmax left in io.token).
    fn write_token(&self, token: u32) {
        self.gpu
            .queue
            .write_buffer(&self.io.token, 0, bytemuck::bytes_of(&token));
    }

    /// Sets the tokens the next masked argmax or top-k may choose (`mask`:
    /// bit id % 32 of word id / 32; bits past its end are clear).
    pub(super) fn write_mask(&self, mask: &[u32]) {
        let words = self.cfg.vocab.div_ceil(32);
        let q = &self.gpu.queue;
        if mask.len() == words {
            q.write_buffer(&self.io.mask, 0, bytemuck::cast_slice(mask));
        } else {
            let mut padded = mask[..mask.len().min(words)].to_vec();
            padded.resize(words, 0);
            q.write_buffer(&self.io.mask, 0, bytemuck::cast_slice(&padded));
        }
    }

    /// Submits one greedy decode step consuming the token in io.token, its
    /// argmax copied into `staging`; advances the position.
    fn submit_greedy(&mut self, staging: &wgpu::Buffer) -> Result<wgpu::SubmissionIndex> {
        self.check_room(1)?;
        let splits = self.begin_step()?;
        let mut enc = self.encode_step(splits, Readback::Token);
        enc.copy_buffer_to_buffer(&self.io.token, 0, staging, 0, super::TOKEN_BYTES);
        let done = self.gpu.queue.submit([enc.finish()]);
        self.pos += 1;
        Ok(done)
    }

    /// Greedy decoding with the GPU one step ahead of the host: step i + 1
    /// is submitted, consuming the token step i left on the GPU, before the
    /// host reads step i's token, so recording and submitting overlap the
    /// device's work. When `emit` stops the run, the step that ran ahead is
    /// undone (the position goes back; its KV row and conv-state ring row
    /// are rewritten by the next token), so the sequence is what a loop of
    /// [`CausalLm::step_greedy`] leaves.
    pub(super) fn greedy_pipelined(
        &mut self,
        token: u32,
        max: usize,
        emit: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        self.check_tokens(&[token])?;
        self.write_token(token);
        let staging = [
            self.io.token_staging.clone(),
            self.io.token_staging2.clone(),
        ];
        // Submission of each step in flight, oldest first; step s reads
        // back through staging[s % 2].
        let mut flight = std::collections::VecDeque::new();
        let (mut submitted, mut produced) = (0, 0);
        loop {
            while flight.len() < 2 && submitted < max {
                flight.push_back(self.submit_greedy(&staging[submitted % 2])?);
                submitted += 1;
            }
            let done = flight.pop_front().expect("a step in flight");
            let bytes = self
                .gpu
                .read_staging(&staging[produced % 2], super::TOKEN_BYTES, done)?;
            // Damaged logits end the run (the step that ran ahead, never
            // mapped, finishes on its own).
            let next = super::greedy_token(&bytes)?;
            produced += 1;
            if !emit(next) || produced == max {
                // The step that ran ahead consumed `next`: take it back.
                self.undo_ahead(&mut flight, &staging[produced % 2])?;
                return Ok(produced);
            }
        }
    }

    /// Records the forward of one decode step at the current position (the
    /// logits, no argmax), consuming the token in io.token, and writes its
    /// step values: queue writes land after the submissions before them,
    /// so this may run while the previous forward is in flight.
    fn encode_forward(&mut self) -> Result<wgpu::CommandBuffer> {
        self.check_room(1)?;
        let splits = self.begin_step()?;
        Ok(self.encode_step(splits, Readback::Logits).finish())
    }

    /// One top-k step under a grammar, the host's mask work overlapping the
    /// device's forward: the forward of `token` is submitted first, `mask`
    /// computes the grammar's mask while it runs, then the masked selection
    /// is submitted and its candidates read back. Returns the mask and the
    /// candidates' bytes. When `mask` fails, the position goes back (as
    /// [`GpuLlm::greedy_pipelined`] takes a step back).
    pub(super) fn decode_masked_candidates(
        &mut self,
        token: u32,
        mask: &mut dyn FnMut() -> Result<Rc<Vec<u32>>>,
    ) -> Result<(Rc<Vec<u32>>, Vec<u8>)> {
        self.check_tokens(&[token])?;
        self.write_token(token);
        let forward = self.encode_forward()?;
        self.gpu.queue.submit([forward]);
        self.pos += 1;
        let bits = match mask() {
            Ok(bits) => bits,
            Err(e) => {
                self.high = self.high.max(self.pos);
                self.pos -= 1;
                return Err(e);
            }
        };
        self.write_mask(&bits);
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for d in &self.masked_select {
                d.record(&mut pass);
            }
        }
        let io = &self.io;
        let len = 8 * self.top_k as u64;
        enc.copy_buffer_to_buffer(&io.cand, 0, &io.cand_staging, 0, len);
        let raw = self.gpu.submit_and_read(enc, &io.cand_staging, len)?;
        Ok((bits, raw))
    }

    /// Greedy decoding under `guide`'s masks with the mask applied on the
    /// device: the logits never come back, only the token. The queue holds
    /// forward i, masked argmax i (its token copied to a staging buffer),
    /// forward i + 1 (reading that token on the device); while forward
    /// i + 1 runs the host reads token i, passes it to the guide, writes
    /// the next mask and submits masked argmax i + 1 and forward i + 2
    /// (recorded before the wait). When the guide stops the run, the
    /// forward queued ahead is undone (the position goes back, as
    /// [`GpuLlm::greedy_pipelined`] does), so the sequence is what a loop
    /// of single masked steps leaves.
    pub(super) fn greedy_masked(
        &mut self,
        token: u32,
        max: usize,
        guide: &mut dyn GreedyGuide,
    ) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        self.check_tokens(&[token])?;
        self.write_token(token);
        let first = self.encode_forward()?;
        self.gpu.queue.submit([first]);
        self.pos += 1;
        let staging = self.io.token_staging.clone();
        let read = |m: &GpuLlm, done| -> Result<u32> {
            super::greedy_token(&m.gpu.read_staging(&staging, super::TOKEN_BYTES, done)?)
        };
        // The masked argmax whose token the host has not read yet.
        let mut pending = None;
        let mut submitted = 0;
        loop {
            // The forward after argmax `submitted`, needed when another
            // argmax follows, recorded while the device works.
            let ahead = if submitted + 1 < max {
                Some(self.encode_forward()?)
            } else {
                None
            };
            if let Some(done) = pending.take() {
                if !guide.emit(read(self, done)?) {
                    // The forward in flight consumed that token.
                    self.high = self.high.max(self.pos);
                    self.pos -= 1;
                    return Ok(submitted);
                }
            }
            self.write_mask(&guide.mask()?);
            let mut enc = self.gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for d in &self.masked_argmax {
                    d.record(&mut pass);
                }
            }
            enc.copy_buffer_to_buffer(&self.io.token, 0, &staging, 0, super::TOKEN_BYTES);
            let done = self.gpu.queue.submit([enc.finish()]);
            submitted += 1;
            let Some(ahead) = ahead else {
                guide.emit(read(self, done)?);
                return Ok(submitted);
            };
            self.gpu.queue.submit([ahead]);
            self.pos += 1;
            pending = Some(done);
        }
    }

    /// Waits for the step in flight ahead of the host, if any (its staging
    /// buffer must be unmapped for reuse), and takes it back.
    fn undo_ahead(
        &mut self,
        flight: &mut std::collections::VecDeque<wgpu::SubmissionIndex>,
        staging: &wgpu::Buffer,
    ) -> Result<()> {
        if let Some(done) = flight.pop_front() {
            self.gpu.read_staging(staging, super::TOKEN_BYTES, done)?;
            self.high = self.high.max(self.pos);
            self.pos -= 1;
        }
        Ok(())
    }

    /// Records one decode step into `pass`, calling `after` after each
    /// dispatch with its kernel name.
    fn record_step(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        splits: usize,
        what: Readback,
        after: &mut dyn FnMut(&mut wgpu::ComputePass<'_>, &'static str),
    ) {
        let last = match what {
            Readback::Token => &self.argmax[..],
            Readback::Drawn => std::slice::from_ref(&self.drawn),
            Readback::Candidates => &self.select[..],
            Readback::Logits => &[],
        };
        for op in &self.plan {
            match op {
                Op::Fixed(d) => {
                    d.record(pass);
                    after(pass, d.bound.name);
                }
                Op::Attention(a) => a.record_with(pass, splits, after),
            }
        }
        for d in last {
            d.record(pass);
            after(pass, d.bound.name);
        }
    }

    /// Runs `steps` greedy decode steps from `token` with a device timestamp
    /// after every dispatch, and says where the time went: host recording,
    /// submission and waiting, and device time per kernel.
    pub fn profile_decode(&mut self, mut token: u32, steps: usize) -> Result<StepProfile> {
        // Every attention layer may add a merge.
        let timer = PassTimer::new(&self.gpu, 2 * self.plan.len() as u32 + 2)?;
        let mut prof = StepProfile {
            what: "decode step".into(),
            ..Default::default()
        };
        for _ in 0..steps {
            self.check_tokens(&[token])?;
            self.write_token(token);
            let splits = self.begin_step()?;
            let g = &*self.gpu;
            let t0 = Instant::now();
            let mut enc = g.device.create_command_encoder(&Default::default());
            let marks = {
                let mut pass = enc.begin_compute_pass(&Default::default());
                let mut marks = PassMarks::start(&timer, &mut pass);
                self.record_step(&mut pass, splits, Readback::Token, &mut |p, name| {
                    marks.after(p, name)
                });
                marks
            };
            marks.resolve(&mut enc)?;
            enc.copy_buffer_to_buffer(&self.io.token, 0, &self.io.token_staging, 0, 4);
            let t1 = Instant::now();
            let done = g.queue.submit([enc.finish()]);
            let t2 = Instant::now();
            let out = g.read_staging(&self.io.token_staging, 4, done.clone())?;
            marks.add_to(&mut prof, g, done, [t0, t0, t1, t2])?;
            self.pos += 1;
            token = u32::from_le_bytes(out[..4].try_into().expect("4 bytes"));
        }
        Ok(prof.finish())
    }
}
