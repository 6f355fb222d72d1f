//! Checking drafted tokens (speculative decoding) in one submission: the
//! tokens are the rows of a batched step (`batch.rs`) at consecutive
//! positions of this one sequence. Row j writes its key and value at
//! pos + j and attends to the positions up to it in the same cache; LFM2's
//! conv blocks run row by row, each reading the gated inputs the rows
//! before it wrote into the ring, which ends as that many decode steps
//! leave it (rejected rows are undone by [`CausalLm::truncate`]). The
//! products are the batched GEMVs, each column bit-equal to the single
//! decode's, so every row's logits are a decode step's, bit for bit, and
//! greedy speculative output is plain greedy output.
//!
//! [`CausalLm::truncate`]: crate::models::llm::CausalLm::truncate

use super::batch::{BatchIo, ChainRow, LayerBufs, Plan, RowsTarget, Want};
use super::{GpuLlm, GpuState};
use crate::error::Result;
use crate::gpu::llm_ops;
use crate::models::kv_blocks::blocks_for;
use crate::models::llm::conv_ring_rows;
use std::collections::HashMap;

/// Most tokens one verifying submission takes: speculative decoding's
/// longest draft (`run::speculative::MAX_DRAFT`) and the token before it.
pub const VERIFY_ROWS: usize = 17;

/// The buffers and recorded steps of verification, made on first use.
pub(super) struct Verify {
    io: BatchIo,
    /// Each row's record and conv output, for the conv blocks run row by
    /// row.
    chain: Vec<ChainRow>,
    /// The step of n rows, by n, over the current KV caches (dropped when
    /// they grow).
    plans: HashMap<usize, Plan>,
}

impl Verify {
    fn new(m: &GpuLlm) -> Result<Verify> {
        let g = &*m.gpu;
        let max_splits = llm_ops::attention_splits(m.cfg.context);
        let chain = (0..VERIFY_ROWS)
            .map(|_| {
                Ok(ChainRow {
                    record: g.scratch("verify row", (llm_ops::ROW_RECORD * 4) as u64)?,
                    conv_out: g.scratch("verify conv_out", (m.cfg.hidden.max(1) * 4) as u64)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // Every row's block table is the identity over the model's own
        // cache (contiguous), written once after the records.
        let blocks = blocks_for(m.cfg.context.max(1));
        let io = BatchIo::new(m, VERIFY_ROWS, max_splits, blocks, None)?;
        let identity: Vec<u32> = (0..blocks as u32).collect();
        let at = (VERIFY_ROWS * llm_ops::ROW_RECORD * 4) as u64;
        g.queue
            .write_buffer(&io.rows, at, bytemuck::cast_slice(&identity));
        Ok(Verify {
            io,
            chain,
            plans: HashMap::new(),
        })
    }

    /// Forgets the recorded steps (the caches they bind were replaced).
    pub(super) fn invalidate(&mut self) {
        self.plans.clear();
    }
}

impl GpuLlm {
    /// Appends `tokens` (checked; at most [`VERIFY_ROWS`]) in one
    /// submission; returns what `want` asks for of each row.
    pub(super) fn verify_rows(&mut self, tokens: &[u32], want: Want) -> Result<Vec<u8>> {
        let n = tokens.len();
        assert!((1..=VERIFY_ROWS).contains(&n), "verify_rows: {n} tokens");
        self.ensure_capacity(self.pos + n)?;
        let mut v = match self.verify.take() {
            Some(v) => v,
            None => Verify::new(self)?,
        };
        let out = self.run_verify(&mut v, tokens, want);
        self.verify = Some(v);
        self.pos += n;
        out
    }

    fn run_verify(&self, v: &mut Verify, tokens: &[u32], want: Want) -> Result<Vec<u8>> {
        let (n, rd, pos) = (tokens.len(), self.cfg.rope_dim, self.pos);
        let g = &*self.gpu;
        // One sequence: its ring starts at row 0, its table after the records.
        let mut records = vec![0u32; n * llm_ops::ROW_RECORD];
        for (j, r) in records.chunks_exact_mut(llm_ops::ROW_RECORD).enumerate() {
            r[1] = (pos + j) as u32;
            r[2] = (pos + j + 1) as u32;
            r[3] = llm_ops::attention_splits(pos + j + 1) as u32;
            r[4] = (VERIFY_ROWS * llm_ops::ROW_RECORD) as u32;
        }
        let angles = |t: &[f32]| t.get(pos * rd..(pos + n) * rd).unwrap_or_default().to_vec();
        v.io.write(
            g,
            Some(tokens),
            &records,
            &angles(&self.rope),
            &angles(&self.rope_local),
        );
        for (row, r) in v
            .chain
            .iter()
            .zip(records.chunks_exact(llm_ops::ROW_RECORD))
        {
            g.queue
                .write_buffer(&row.record, 0, bytemuck::cast_slice(r));
        }
        if !v.plans.contains_key(&n) {
            let state = self
                .state
                .iter()
                .map(|s| match s {
                    GpuState::Kv { k, v } => LayerBufs::Kv(k, v),
                    GpuState::Conv(c) => LayerBufs::Conv(c),
                })
                .collect();
            let target = RowsTarget {
                m: self,
                io: &v.io,
                state,
                ring: conv_ring_rows(self.cfg.conv_kernel),
                max_splits: llm_ops::attention_splits(self.cfg.context),
                chain: Some(&v.chain),
                gemm: None,
            };
            let plan = Plan::new(target, n)?;
            v.plans.insert(n, plan);
        }
        let plan = &v.plans[&n];
        let mut enc = g.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            let most_splits = llm_ops::attention_splits(pos + n);
            plan.record(&mut pass, most_splits, want, &mut |_, _| {});
        }
        let len = v.io.copy_out(&mut enc, want, n, self.cfg.vocab, 0);
        g.submit_and_read(enc, v.io.staging(want, 0), len)
    }
}
