//! Many sequences over one set of weights: the model as a server sees it.
//!
//! A [`BatchedLm`] holds open sequences; each [`BatchedLm::step`] appends
//! tokens to any of them (a prompt chunk, or the one token a decode step
//! consumes) in one pass and returns each one's next-token logits. The CPU
//! backend ([`super::llm_cpu::CpuBatch`]) batches for real over a paged KV
//! cache with prefix reuse; the GPU ([`super::llm_gpu::GpuBatch`]) decodes
//! every sequence's token in one submission over the same kind of paged
//! cache ([`super::kv_blocks`] keeps the books for both); any other
//! [`CausalLm`] serves through [`SingleSlot`], one sequence at a time.

use super::kv_blocks::BlockUsage;
use super::llm::{CausalLm, LlmConfig};
use crate::error::{Error, Result};
use crate::sampling::{Draw, Sampler};

/// A row's most likely tokens as (id, logit), most likely first.
pub type Candidates = Vec<(u32, f32)>;

pub type SeqId = u64;

/// Tokens to append to one sequence in a step.
pub struct SeqWork<'a> {
    pub id: SeqId,
    pub tokens: &'a [u32],
    /// Compute each token as a decode step would (one at a time, with the
    /// decode products' rounding) rather than as a prompt: how tokens
    /// that were generated are recomputed, so that they come out exactly
    /// as they did. [`CausalLm::forward`] treats one token as decode and
    /// more as a prompt.
    pub as_decode: bool,
}

pub trait BatchedLm {
    fn config(&self) -> &LlmConfig;
    /// Most sequences open at once.
    fn max_sequences(&self) -> usize;
    /// Opens a sequence for `prompt`, reserving the cache its prompt and
    /// first generated token need; None when the cache cannot hold them now
    /// (try again once others finish). Returns its id and how many leading
    /// prompt tokens are already computed (a cached prefix); the caller
    /// steps the rest.
    fn open(&mut self, prompt: &[u32]) -> Result<Option<(SeqId, usize)>>;
    /// Cache blocks that appending `n` tokens to `id` would take from the
    /// free ones (beyond what it has reserved).
    fn blocks_needed(&self, id: SeqId, n: usize) -> usize;
    /// Cache blocks free for growth.
    fn free_blocks(&self) -> usize;
    /// Ends a sequence and frees its cache (what is full stays cached as a
    /// prefix for later sequences).
    fn close(&mut self, id: SeqId);
    /// Appends each entry's tokens to its sequence, all in one pass, and
    /// returns the next-token logits after each entry's last token.
    fn step(&mut self, work: &[SeqWork]) -> Result<Vec<Vec<f32>>>;
    fn usage(&self) -> BlockUsage;
    /// Tokens one serving step takes at most unless told
    /// (`serve --step-tokens`): decode tokens first, then prompt chunks, so
    /// a long prompt does not stall the running streams for long. 256 on the
    /// CPU, where a step of 2,048 prompt tokens takes seconds.
    fn default_step_tokens(&self) -> usize {
        256
    }
    /// Starts timing every batched step on the device (per kernel); false
    /// when the backend has no such profile.
    fn start_profile(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// The profile since [`BatchedLm::start_profile`], per step, ending it.
    fn take_profile(&mut self) -> Option<crate::gpu::profile::StepProfile> {
        None
    }
    fn backend_name(&self) -> &'static str;
    /// One decode step of `id` alone that draws the next token with
    /// `sampler` on the backend's fast path (a GPU reads back a token id or
    /// the top candidates rather than every logit); None when the backend
    /// has none, and the caller steps and samples the logits itself.
    fn step_sampled(
        &mut self,
        _id: SeqId,
        _token: u32,
        _sampler: &mut Sampler,
        _history: &[u32],
    ) -> Option<Result<u32>> {
        None
    }
    /// One decode step of every `(id, token)` together (each consumes its
    /// token), each drawing its next token greedily on the backend, so only
    /// the token ids come back rather than every row's logits; None when
    /// the backend has no such path (the caller steps and samples).
    fn step_greedy_many(&mut self, _rows: &[(SeqId, u32)]) -> Option<Result<Vec<u32>>> {
        None
    }
    /// How many of each row's most likely tokens
    /// [`BatchedLm::step_candidates_many`] gives (0: it is not there).
    fn candidates_on_device(&self) -> usize {
        0
    }
    /// One decode step of every `(id, token, k)` together, each row's `k`
    /// most likely tokens (at most [`BatchedLm::candidates_on_device`],
    /// sorted as `cpu::top_k` sorts) selected on the backend, so only those
    /// come back for the host's draw ([`Sampler::sample_top`]); None when
    /// the backend has no such path.
    fn step_candidates_many(
        &mut self,
        _rows: &[(SeqId, u32, usize)],
    ) -> Option<Result<Vec<Candidates>>> {
        None
    }
    /// Whether [`BatchedLm::step_drawn_many`] is there (asked before the
    /// draws are taken from the samplers).
    fn draws_on_device(&self) -> bool {
        false
    }
    /// One decode step of every `(id, token, draw)` together, each drawing
    /// its next token on the backend as `draw` says
    /// ([`crate::sampling::Sampler::device_draw`]), so only the token ids
    /// come back; None when the backend has no such path.
    fn step_drawn_many(&mut self, _rows: &[(SeqId, u32, Draw)]) -> Option<Result<Vec<u32>>> {
        None
    }
    /// Greedy decoding of every `(id, token)` together, as repeated
    /// [`BatchedLm::step_greedy_many`] with the device a step ahead: each
    /// step's tokens (in the rows' order) go to `emit` until it returns
    /// false, `max` steps are produced or the cache has no room for another
    /// step (the last tokens are not consumed). Returns the steps produced;
    /// None when the backend has no such path for these rows (the GPU
    /// batch: fewer than two, or while profiling). After an error the
    /// sequences' states are unknown: close them.
    fn greedy_run_many(
        &mut self,
        _rows: &[(SeqId, u32)],
        _max: usize,
        _emit: &mut dyn FnMut(&[u32]) -> bool,
    ) -> Option<Result<usize>> {
        None
    }
    /// Greedy decoding of `id` alone, as [`CausalLm::greedy_run`]: consumes
    /// `token`, passes each produced token to `emit` until it returns false
    /// or `max` are produced (the last one is not consumed), keeping the
    /// device a step ahead; None when the backend has no such path.
    fn greedy_run(
        &mut self,
        _id: SeqId,
        _token: u32,
        _max: usize,
        _emit: &mut dyn FnMut(u32) -> bool,
    ) -> Option<Result<usize>> {
        None
    }
}

/// Any single-sequence model as a batch of one (its usage counts the one
/// slot as one block). A new sequence continues
/// from the last one's state for the part of its prompt they share (the next
/// turn of a conversation), as far as the model can be cut back, and starts
/// over otherwise.
pub struct SingleSlot {
    model: Box<dyn CausalLm>,
    name: &'static str,
    open: Option<SeqId>,
    next_id: SeqId,
    /// Tokens the model's state holds.
    consumed: Vec<u32>,
}

impl SingleSlot {
    pub fn new(model: Box<dyn CausalLm>, name: &'static str) -> SingleSlot {
        SingleSlot {
            model,
            name,
            open: None,
            next_id: 1,
            consumed: Vec::new(),
        }
    }
}

impl SingleSlot {
    /// Forgets the state (after a failed step its contents are unknown).
    fn start_over(&mut self) {
        self.model.reset();
        self.consumed.clear();
    }
}

impl BatchedLm for SingleSlot {
    fn config(&self) -> &LlmConfig {
        self.model.config()
    }

    fn max_sequences(&self) -> usize {
        1
    }

    fn open(&mut self, prompt: &[u32]) -> Result<Option<(SeqId, usize)>> {
        if prompt.is_empty() {
            return Err(Error::invalid("the prompt is empty"));
        }
        if self.open.is_some() {
            return Ok(None);
        }
        // Keep what the new prompt shares with the state (all but its last
        // token, which is computed again for its logits), as far as the
        // model can be cut back.
        let shared = self
            .consumed
            .iter()
            .zip(&prompt[..prompt.len() - 1])
            .take_while(|(a, b)| a == b)
            .count();
        let kept = shared == self.consumed.len()
            || (shared >= self.model.min_truncate_pos() && self.model.truncate(shared).is_ok());
        if kept {
            self.consumed.truncate(shared);
        } else {
            self.start_over();
        }
        let id = self.next_id;
        self.next_id += 1;
        self.open = Some(id);
        Ok(Some((id, self.consumed.len())))
    }

    fn blocks_needed(&self, _id: SeqId, _n: usize) -> usize {
        0
    }

    /// The model's own cache grows as needed.
    fn free_blocks(&self) -> usize {
        usize::MAX
    }

    fn close(&mut self, id: SeqId) {
        if self.open == Some(id) {
            self.open = None;
        }
    }

    fn step(&mut self, work: &[SeqWork]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(work.len());
        for w in work {
            if self.open != Some(w.id) {
                return Err(Error::invalid(format!("no open sequence {}", w.id)));
            }
            match self.model.forward(w.tokens, false) {
                Ok(l) => {
                    self.consumed.extend_from_slice(w.tokens);
                    out.push(l);
                }
                Err(e) => {
                    self.start_over();
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn usage(&self) -> BlockUsage {
        BlockUsage {
            in_use: usize::from(self.open.is_some()),
            cached: 0,
            total: 1,
        }
    }

    fn backend_name(&self) -> &'static str {
        self.name
    }

    fn step_sampled(
        &mut self,
        id: SeqId,
        token: u32,
        sampler: &mut Sampler,
        history: &[u32],
    ) -> Option<Result<u32>> {
        if self.open != Some(id) {
            return Some(Err(Error::invalid(format!("no open sequence {id}"))));
        }
        let next = if sampler.is_greedy() {
            self.model.step_greedy(token)
        } else {
            self.model.step_sample(token, sampler, history)
        };
        match &next {
            Ok(_) => self.consumed.push(token),
            Err(_) => self.start_over(),
        }
        Some(next)
    }

    fn greedy_run(
        &mut self,
        id: SeqId,
        token: u32,
        max: usize,
        emit: &mut dyn FnMut(u32) -> bool,
    ) -> Option<Result<usize>> {
        if self.open != Some(id) {
            return Some(Err(Error::invalid(format!("no open sequence {id}"))));
        }
        let mut produced = Vec::new();
        let result = self.model.greedy_run(token, max, &mut |t| {
            produced.push(t);
            emit(t)
        });
        match &result {
            Ok(_) => {
                // `token` and every produced token but the last are consumed.
                self.consumed.push(token);
                produced.pop();
                self.consumed.extend(produced);
            }
            Err(_) => self.start_over(),
        }
        Some(result)
    }
}
