//! The paged KV cache's bookkeeping, independent of where the keys and
//! values live: fixed-size blocks of positions, a block table per sequence,
//! reference counts, and a prefix cache that lets a sequence start on blocks
//! another sequence already computed (vLLM's automatic prefix caching).
//!
//! A block is *full* when all [`BLOCK`] of its positions hold a token. A full
//! block is keyed by its tokens and a hash of every token before it
//! ([`chain`]), so equal keys mean equal prefixes whichever sequence computed
//! them; once its last user lets go it stays cached (evicted least recently
//! used first) until a new block is needed.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// Positions per block.
pub const BLOCK: usize = 16;

/// The hash of the empty prefix.
pub const ROOT: u64 = 0;

/// A full block's identity: the hash of the prefix before it and its tokens.
type Key = (u64, Vec<u32>);

/// The hash of a prefix `parent` followed by `tokens`.
pub fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// Block counts for admission and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockUsage {
    /// Blocks some sequence holds.
    pub in_use: usize,
    /// Blocks no sequence holds that keep a cached prefix.
    pub cached: usize,
    /// All blocks the pool may hand out.
    pub total: usize,
}

pub struct BlockPool {
    total: usize,
    /// Blocks handed out so far (ids below it exist); the pool grows lazily.
    created: usize,
    refs: Vec<u32>,
    /// Ids of created blocks that are neither held nor cached.
    free: Vec<u32>,
    key_of: Vec<Option<Key>>,
    index: HashMap<Key, u32>,
    /// Cached blocks nobody holds, by when they were last released.
    lru: BTreeMap<u64, u32>,
    released_at: Vec<u64>,
    clock: u64,
    /// Blocks promised to admitted sequences but not yet taken.
    reserved: usize,
    /// Blocks with a reference (kept as a count: the gauges read it every
    /// step).
    held: usize,
}

impl BlockPool {
    pub fn new(total: usize) -> BlockPool {
        BlockPool {
            total,
            created: 0,
            refs: Vec::new(),
            free: Vec::new(),
            key_of: Vec::new(),
            index: HashMap::new(),
            lru: BTreeMap::new(),
            released_at: Vec::new(),
            clock: 0,
            reserved: 0,
            held: 0,
        }
    }

    /// Blocks that exist (the storage behind them must cover these ids).
    pub fn created(&self) -> usize {
        self.created
    }

    pub fn usage(&self) -> BlockUsage {
        BlockUsage {
            in_use: self.held,
            cached: self.lru.len(),
            total: self.total,
        }
    }

    /// Blocks that could be taken now without breaking a reservation.
    pub fn available(&self) -> usize {
        let idle = self.total - self.created + self.free.len() + self.lru.len();
        idle.saturating_sub(self.reserved)
    }

    /// Promises `n` blocks to a sequence; false (and nothing promised) when
    /// they are not there.
    pub fn reserve(&mut self, n: usize) -> bool {
        if self.available() < n {
            return false;
        }
        self.reserved += n;
        true
    }

    /// Gives back the unused part of a promise.
    pub fn unreserve(&mut self, n: usize) {
        assert!(n <= self.reserved, "unreserving more than was reserved");
        self.reserved -= n;
    }

    /// A block for new positions, out of a reservation when `reserved`;
    /// None when every block is held.
    pub fn allocate(&mut self, reserved: bool) -> Option<u32> {
        if reserved {
            self.unreserve(1);
        } else if self.available() == 0 {
            return None;
        }
        let id = if let Some(id) = self.free.pop() {
            id
        } else if self.created < self.total {
            self.created += 1;
            self.refs.push(0);
            self.key_of.push(None);
            self.released_at.push(0);
            (self.created - 1) as u32
        } else {
            let (&t, &id) = self.lru.iter().next()?;
            self.lru.remove(&t);
            if let Some(k) = self.key_of[id as usize].take() {
                self.index.remove(&k);
            }
            id
        };
        self.refs[id as usize] = 1;
        self.held += 1;
        Some(id)
    }

    /// The cached full block that follows the prefix hashed `parent` with
    /// `tokens`, taken for one more user.
    pub fn lookup(&mut self, parent: u64, tokens: &[u32]) -> Option<u32> {
        let id = *self.index.get(&(parent, tokens.to_vec()))?;
        let i = id as usize;
        if self.refs[i] == 0 {
            self.lru.remove(&self.released_at[i]);
            self.held += 1;
        }
        self.refs[i] += 1;
        Some(id)
    }

    /// The cached full blocks `prompt` starts with, each taken for one more
    /// user, and the hash of the prefix they end: at most all but the
    /// prompt's last token (whose logits must be computed), and only as far
    /// as `usable` accepts each block (given its id and the position its
    /// end is at; a hybrid model continues only from a block whose conv
    /// state it has).
    pub fn lookup_prefix(
        &mut self,
        prompt: &[u32],
        mut usable: impl FnMut(u32, usize) -> bool,
    ) -> (Vec<u32>, u64) {
        let mut table = Vec::new();
        let mut parent = ROOT;
        let Some((_, head)) = prompt.split_last() else {
            return (table, parent);
        };
        for block in head.chunks_exact(BLOCK) {
            let Some(id) = self.lookup(parent, block) else {
                break;
            };
            if !usable(id, (table.len() + 1) * BLOCK) {
                self.release(id);
                break;
            }
            table.push(id);
            parent = chain(parent, block);
        }
        (table, parent)
    }

    /// Records a block that just became full, so later sequences can reuse
    /// it; a block with the same key already cached keeps that place.
    /// Returns whether `id` was registered.
    pub fn register(&mut self, id: u32, parent: u64, tokens: &[u32]) -> bool {
        debug_assert_eq!(tokens.len(), BLOCK);
        let key = (parent, tokens.to_vec());
        if self.key_of[id as usize].is_some() || self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), id);
        self.key_of[id as usize] = Some(key);
        true
    }

    /// Lets go of one use of `id`.
    pub fn release(&mut self, id: u32) {
        let i = id as usize;
        assert!(self.refs[i] > 0, "releasing block {id}, which nobody holds");
        self.refs[i] -= 1;
        if self.refs[i] > 0 {
            return;
        }
        self.held -= 1;
        if self.key_of[i].is_some() {
            self.clock += 1;
            self.released_at[i] = self.clock;
            self.lru.insert(self.clock, id);
        } else {
            self.free.push(id);
        }
    }
}

/// Blocks needed to hold `positions`.
pub fn blocks_for(positions: usize) -> usize {
    positions.div_ceil(BLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(v: u32) -> Vec<u32> {
        vec![v; BLOCK]
    }

    #[test]
    fn released_full_blocks_stay_cached_until_needed() {
        let mut p = BlockPool::new(2);
        let a = p.allocate(false).unwrap();
        p.register(a, ROOT, &toks(1));
        let b = p.allocate(false).unwrap();
        assert_eq!(p.allocate(false), None, "both blocks are held");
        p.release(a);
        p.release(b);
        assert_eq!(
            p.usage(),
            BlockUsage {
                in_use: 0,
                cached: 1,
                total: 2
            }
        );
        assert_eq!(p.lookup(ROOT, &toks(1)), Some(a), "the prefix is reused");
        assert_eq!(p.lookup(ROOT, &toks(2)), None);
        p.release(a);
        // Two new blocks: the free one, then the cached one is evicted.
        let x = p.allocate(false).unwrap();
        let y = p.allocate(false).unwrap();
        assert_eq!((x, y), (b, a));
        assert_eq!(p.lookup(ROOT, &toks(1)), None, "evicted");
    }

    #[test]
    fn reservations_hold_blocks_back() {
        let mut p = BlockPool::new(3);
        assert!(p.reserve(2));
        assert_eq!(p.available(), 1);
        assert!(!p.reserve(2));
        let a = p.allocate(true).unwrap();
        let _b = p.allocate(false).unwrap();
        assert_eq!(p.allocate(false), None, "the last block is promised");
        let c = p.allocate(true).unwrap();
        assert_ne!(a, c);
        assert_eq!(p.usage().in_use, 3);
    }
}
