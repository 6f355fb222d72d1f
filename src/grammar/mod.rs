//! Constrained generation: a grammar (GBNF, or one made from a JSON Schema)
//! decides which tokens may come next. The matcher is a pushdown automaton
//! over code points as in llama.cpp: a state is a set of stacks of positions
//! in the grammar's elements, each stack's top a character element. The mask
//! over the vocabulary walks a trie of the tokens' characters (built once),
//! so tokens sharing a prefix share the work; masks are cached per state
//! (inside a JSON string, every character leads back to the same state).
//! Characters the grammar cannot tell apart (no character class splits
//! them) form one class, so transitions are a dense table over classes. A
//! subtree of the trie whose characters all take the walk's stack set to
//! one same next set, level after level, as far down as the subtree goes,
//! is allowed whole without visiting it: inside a JSON string (bounded by
//! maxLength or not) only the branches towards a quote, a backslash or a
//! control character are walked. The walk writes a bitmap over the trie's
//! depth-first order (a subtree is a range of bits); the mask over token
//! ids is set from it, or, when most tokens are allowed, cleared from the
//! whole vocabulary for the few rejected.

pub mod json_schema;
mod parse;

pub use parse::{Elem, Grammar};

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;

type Stack = Vec<u32>;

/// The matcher's state: the stacks still alive (an empty stack has matched
/// the whole grammar).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    stacks: Vec<Stack>,
    /// Bytes of a character a token began and the next must finish.
    pending: Vec<u8>,
}

impl Grammar {
    fn push_unique(out: &mut Vec<Stack>, stack: Stack) {
        if !out.contains(&stack) {
            out.push(stack);
        }
    }

    /// Expands rule references on top of `stack` until every resulting
    /// stack is empty or has a character element on top.
    fn advance(&self, stack: Stack, out: &mut Vec<Stack>) {
        let Some(&top) = stack.last() else {
            Self::push_unique(out, stack);
            return;
        };
        match &self.elems[top as usize] {
            Elem::Chars { .. } => Self::push_unique(out, stack),
            Elem::Ref(rule) => {
                let mut base = stack;
                base.pop();
                if !self.is_end(top + 1) {
                    base.push(top + 1);
                }
                for &start in &self.rules[*rule as usize] {
                    let mut next = base.clone();
                    if !self.is_end(start) {
                        next.push(start);
                    }
                    self.advance(next, out);
                }
            }
            Elem::End => unreachable!("End is never pushed"),
        }
    }

    fn initial(&self) -> Vec<Stack> {
        let mut out = Vec::new();
        for &start in &self.rules[self.root as usize] {
            self.advance(
                if self.is_end(start) {
                    vec![]
                } else {
                    vec![start]
                },
                &mut out,
            );
        }
        out
    }

    /// The stacks after `c`; empty when nothing accepts it.
    fn accept(&self, stacks: &[Stack], c: u32) -> Vec<Stack> {
        let mut out = Vec::new();
        for stack in stacks {
            let Some(&top) = stack.last() else { continue };
            if self.elems[top as usize].matches(c) {
                let mut next = stack.clone();
                next.pop();
                if !self.is_end(top + 1) {
                    next.push(top + 1);
                }
                self.advance(next, &mut out);
            }
        }
        out
    }

    /// Whether some stack accepts a code point in `lo..=hi`.
    fn accepts_some(&self, stacks: &[Stack], lo: u32, hi: u32) -> bool {
        stacks.iter().any(|s| {
            s.last()
                .is_some_and(|&top| self.elems[top as usize].matches_some(lo, hi))
        })
    }

    /// Whether the grammar matches all of `text`, start to end.
    pub fn matches(&self, text: &str) -> bool {
        let mut stacks = self.initial();
        for c in text.chars() {
            stacks = self.accept(&stacks, c as u32);
            if stacks.is_empty() {
                return false;
            }
        }
        stacks.iter().any(Vec::is_empty)
    }
}

/// A token's text split for matching: whole characters, then the first
/// bytes of a character it leaves unfinished.
#[derive(Clone, Debug)]
struct Piece {
    chars: Vec<u32>,
    /// (lowest, highest) code point the unfinished tail can still become.
    tail: Option<(u32, u32)>,
}

/// Decodes as much of `bytes` as forms whole characters. None when the
/// bytes cannot be UTF-8 whatever follows.
fn split_utf8(bytes: &[u8]) -> Option<(Vec<u32>, Vec<u8>)> {
    let mut chars = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let len = match b {
            0x00..=0x7F => 1,
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return None,
        };
        if i + len > bytes.len() {
            // Check what is there of the unfinished character.
            let tail = &bytes[i..];
            if !tail[1..].iter().all(|&c| c & 0xC0 == 0x80) || tail_range(tail).is_none() {
                return None;
            }
            return Some((chars, tail.to_vec()));
        }
        let s = std::str::from_utf8(&bytes[i..i + len]).ok()?;
        chars.push(s.chars().next().expect("one char") as u32);
        i += len;
    }
    Some((chars, Vec::new()))
}

/// The code points an unfinished UTF-8 sequence can still become; None
/// when it can only become an overlong or out-of-range sequence.
fn tail_range(tail: &[u8]) -> Option<(u32, u32)> {
    let len = match tail[0] {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        _ => 4,
    };
    let lead_bits = [0, 0, 5, 4, 3][len];
    let mut v = (tail[0] as u32) & ((1 << lead_bits) - 1);
    for &b in &tail[1..] {
        v = (v << 6) | (b as u32 & 0x3F);
    }
    let missing = 6 * (len - tail.len()) as u32;
    let (lo, hi) = (v << missing, (v << missing) | ((1 << missing) - 1));
    // The shortest form only: a 3-byte sequence is at least U+0800, etc.
    let (min, max) = [
        (0, 0),
        (0, 0),
        (0x80, 0x7FF),
        (0x800, 0xFFFF),
        (0x10000, 0x10FFFF),
    ][len];
    let (lo, hi) = (lo.max(min), hi.min(max));
    (lo <= hi).then_some((lo, hi))
}

fn piece(bytes: &[u8]) -> Option<Piece> {
    let (chars, tail) = split_utf8(bytes)?;
    Some(Piece {
        chars,
        tail: if tail.is_empty() {
            None
        } else {
            tail_range(&tail)
        },
    })
}

/// The vocabulary arranged for masking: a trie over the tokens' characters.
pub struct TokenTable {
    bytes: Vec<Option<Vec<u8>>>,
    nodes: Vec<TrieNode>,
    /// Every token ending at a node, in depth-first order of the nodes, so
    /// a subtree's tokens are one range ([`TrieNode::tokens_below`]).
    ordered_tokens: Vec<u32>,
    /// The same for the tokens with an unfinished last character: id,
    /// the range of that character, the depth of its node.
    ordered_tails: Vec<(u32, u32, u32, u32)>,
    /// `by_depth[d]`: where in `ordered_tokens` the tokens of `d`
    /// characters are, ascending (a subtree's are a range of it).
    by_depth: Vec<Vec<u32>>,
    /// `depths[p]`: the characters of token `ordered_tokens[p]` (a small
    /// subtree's tokens up to a depth are found by a scan, not by
    /// searching `by_depth`).
    depths: Vec<u32>,
    /// The tokens of `ordered_tokens` as a bitmap over ids (bit `id % 32`
    /// of word `id / 32`): a mask allowing most of them starts from it and
    /// clears the few rejected.
    in_trie: Vec<u32>,
}

#[derive(Default)]
struct TrieNode {
    children: Vec<(u32, u32)>,
    /// Tokens whose characters end here.
    tokens: Vec<u32>,
    /// Tokens that end here with an unfinished character, and its range.
    tails: Vec<(u32, u32, u32)>,
    /// The tokens of this node's subtree (itself included) in
    /// `ordered_tokens`, and its tails in `ordered_tails`.
    tokens_below: Range<u32>,
    tails_below: Range<u32>,
    /// Characters from the root to here, and the most below it.
    depth: u32,
    height: u32,
}

impl TokenTable {
    /// `bytes[id]`: the text of each token, None for special tokens (never
    /// allowed by a grammar; end-of-sequence is handled apart).
    pub fn new(bytes: Vec<Option<Vec<u8>>>) -> TokenTable {
        let mut nodes = vec![TrieNode::default()];
        for (id, b) in bytes.iter().enumerate() {
            // Empty tokens would let generation loop without progress.
            let Some(p) = b.as_deref().filter(|b| !b.is_empty()).and_then(piece) else {
                continue;
            };
            let mut node = 0usize;
            for &c in &p.chars {
                node = match nodes[node].children.iter().find(|(k, _)| *k == c) {
                    Some(&(_, n)) => n as usize,
                    None => {
                        nodes.push(TrieNode::default());
                        let n = nodes.len() - 1;
                        nodes[node].children.push((c, n as u32));
                        n
                    }
                };
            }
            match p.tail {
                Some((lo, hi)) => nodes[node].tails.push((id as u32, lo, hi)),
                None => nodes[node].tokens.push(id as u32),
            }
        }
        let mut table = TokenTable {
            bytes,
            nodes,
            ordered_tokens: Vec::new(),
            ordered_tails: Vec::new(),
            by_depth: Vec::new(),
            depths: Vec::new(),
            in_trie: Vec::new(),
        };
        table.order(0, 0);
        table
            .by_depth
            .resize(table.nodes[0].height as usize + 1, Vec::new());
        table.depths = vec![0; table.ordered_tokens.len()];
        for node in &table.nodes {
            for p in node.tokens_below.start..node.tokens_below.start + node.tokens.len() as u32 {
                table.by_depth[node.depth as usize].push(p);
                table.depths[p as usize] = node.depth;
            }
        }
        for at in &mut table.by_depth {
            at.sort_unstable();
        }
        table.in_trie = vec![0; table.bytes.len().div_ceil(32)];
        for &t in &table.ordered_tokens {
            table.in_trie[t as usize / 32] |= 1 << (t % 32);
        }
        table
    }

    /// Lays out the subtree of `node`, `depth` characters deep, depth first.
    fn order(&mut self, node: usize, depth: u32) {
        let (t0, l0) = (self.ordered_tokens.len(), self.ordered_tails.len());
        self.ordered_tokens
            .extend_from_slice(&self.nodes[node].tokens);
        let tails = self.nodes[node].tails.iter();
        self.ordered_tails
            .extend(tails.map(|&(t, lo, hi)| (t, lo, hi, depth)));
        let mut height = 0;
        for i in 0..self.nodes[node].children.len() {
            let child = self.nodes[node].children[i].1 as usize;
            self.order(child, depth + 1);
            height = height.max(self.nodes[child].height + 1);
        }
        let n = &mut self.nodes[node];
        n.tokens_below = t0 as u32..self.ordered_tokens.len() as u32;
        n.tails_below = l0 as u32..self.ordered_tails.len() as u32;
        n.depth = depth;
        n.height = height;
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// The grammar's character classes: code points no character element tells
/// apart share a class (the class of `c` is how many range bounds are <= c).
struct CharClasses {
    bounds: Vec<u32>,
    ascii: [u16; 128],
}

impl CharClasses {
    fn new(grammar: &Grammar) -> CharClasses {
        let mut bounds = Vec::new();
        for e in &grammar.elems {
            if let Elem::Chars { ranges, .. } = e {
                for &(lo, hi) in ranges {
                    bounds.push(lo);
                    bounds.push(hi.saturating_add(1));
                }
            }
        }
        bounds.sort_unstable();
        bounds.dedup();
        let mut ascii = [0u16; 128];
        for (c, a) in ascii.iter_mut().enumerate() {
            *a = bounds.partition_point(|&b| b <= c as u32) as u16;
        }
        CharClasses { bounds, ascii }
    }

    fn len(&self) -> usize {
        self.bounds.len() + 1
    }

    fn of(&self, c: u32) -> usize {
        match self.ascii.get(c as usize) {
            Some(&k) => k as usize,
            None => self.bounds.partition_point(|&b| b <= c),
        }
    }

    /// A code point of class `k`.
    fn member(&self, k: usize) -> u32 {
        if k == 0 {
            0
        } else {
            self.bounds[k - 1]
        }
    }
}

/// From a stack set, the sets that most characters lead to, level after
/// level: below a trie node whose characters all belong to the classes
/// common to the first `l` levels, every token up to `l` characters deep
/// continues the output.
struct Chain {
    /// `sets[d]`: the set `d` such characters below the start.
    sets: Vec<u32>,
    /// Per level, the classes that lead each set of the chain so far to
    /// the next (u64 words a level).
    common: Vec<u64>,
    /// Per set of the chain, the classes it accepts at all.
    alive: Vec<u64>,
    /// The last set leads back to itself: the chain goes on without end.
    looped: bool,
    /// No more levels: the last set accepts nothing, or the trie is no
    /// deeper.
    ended: bool,
}

impl Chain {
    fn new(set: u32) -> Chain {
        Chain {
            sets: vec![set],
            common: Vec::new(),
            alive: Vec::new(),
            looped: false,
            ended: false,
        }
    }

    /// The levels known (without end when looped).
    fn levels(&self, words: usize) -> usize {
        if self.looped {
            usize::MAX
        } else {
            self.common.len() / words
        }
    }

    /// The classes common to the first `levels` levels (at least one).
    fn common(&self, levels: usize, words: usize) -> &[u64] {
        let l = levels.min(self.common.len() / words) - 1;
        &self.common[l * words..(l + 1) * words]
    }

    /// The set `d` characters below the start, and what it accepts.
    fn set(&self, d: usize) -> u32 {
        self.sets[d.min(self.sets.len() - 1)]
    }

    fn alive(&self, d: usize, words: usize) -> &[u64] {
        let d = d.min(self.sets.len() - 1);
        &self.alive[d * words..(d + 1) * words]
    }
}

/// A grammar following a generation: which tokens may come next, and the
/// state after each token taken.
pub struct Constraint {
    grammar: Grammar,
    table: Rc<TokenTable>,
    eos_ids: Vec<u32>,
    state: State,
    cache: HashMap<State, Rc<Vec<bool>>>,
    /// The same masks as bitmaps ([`Constraint::mask_bits`]).
    bits: HashMap<State, Rc<Vec<u32>>>,
    classes: CharClasses,
    /// u64 words of a set of classes.
    words: usize,
    /// Per trie node, the classes of the characters below it.
    below: Vec<u64>,
    /// Per trie node, the class of the character that leads to it (the
    /// walk looks no character up).
    edge_class: Vec<u32>,
    /// Stack sets met while masking, by id: walking the trie is then
    /// mostly look-ups.
    sets: Vec<Vec<Stack>>,
    set_ids: HashMap<Vec<Stack>, u32>,
    /// `transitions[set * classes + k]`: the set after a character of
    /// class k (DEAD when none accepts it, UNSEEN until asked).
    transitions: Vec<u32>,
    /// Per set, as far as asked for: where most characters lead it,
    /// level after level ([`Chain`]).
    chains: Vec<Option<Chain>>,
    /// Subtrees allowed without a walk, so tests see that path taken.
    #[cfg(test)]
    skipped: usize,
}

/// No stack accepts the character.
const DEAD: u32 = u32::MAX;

/// A transition not computed yet.
const UNSEEN: u32 = u32::MAX - 1;

/// Transitions remembered at most before they are forgotten.
const TRANSITION_LIMIT: usize = 1 << 22;

/// The fewest tokens below a trie node worth checking for a whole-subtree
/// allow (smaller subtrees are walked).
const WHOLE_SUBTREE_MIN: usize = 2;

/// The most tokens below a trie node allowed up to a depth by a scan of
/// their depths (larger subtrees search `by_depth`, a search per level).
#[cfg(not(test))]
const DEPTH_SCAN_MAX: usize = 4096;
/// Small enough that the tests' vocabulary takes both paths.
#[cfg(test)]
const DEPTH_SCAN_MAX: usize = 64;

/// Masks cached at most (each is a vocabulary of bools).
const CACHE_LIMIT: usize = 256;

/// What a walk of the trie allowed: tokens by their place in
/// [`TokenTable::ordered_tokens`] (a subtree is a range of bits), and the
/// tokens with an unfinished last character.
struct Walked {
    ordered: Vec<u64>,
    tails: Vec<u32>,
}

impl Walked {
    /// The bitmap over token ids: from nothing, setting the allowed, or
    /// (most allowed, as inside a string) from every token of the trie,
    /// clearing the rest.
    fn by_id(&self, table: &TokenTable) -> Vec<u32> {
        let n = table.ordered_tokens.len();
        let ones: usize = self.ordered.iter().map(|w| w.count_ones() as usize).sum();
        let most = 2 * ones > n;
        let mut out = if most {
            table.in_trie.clone()
        } else {
            vec![0u32; table.bytes.len().div_ceil(32)]
        };
        for (w, &word) in self.ordered.iter().enumerate() {
            let mut left = if most { !word } else { word };
            while left != 0 {
                let p = w * 64 + left.trailing_zeros() as usize;
                left &= left - 1;
                if p >= n {
                    break;
                }
                let t = table.ordered_tokens[p] as usize;
                if most {
                    out[t / 32] &= !(1 << (t % 32));
                } else {
                    out[t / 32] |= 1 << (t % 32);
                }
            }
        }
        for &t in &self.tails {
            out[t as usize / 32] |= 1 << (t % 32);
        }
        out
    }
}

/// Sets bits `range` of a bitmap, whole words at a time in the middle.
fn set_range(bits: &mut [u64], range: Range<usize>) {
    let (mut lo, hi) = (range.start, range.end);
    while lo < hi && lo % 64 != 0 {
        bits[lo / 64] |= 1 << (lo % 64);
        lo += 1;
    }
    while lo + 64 <= hi {
        bits[lo / 64] = u64::MAX;
        lo += 64;
    }
    while lo < hi {
        bits[lo / 64] |= 1 << (lo % 64);
        lo += 1;
    }
}

impl Constraint {
    pub fn new(grammar: Grammar, table: Rc<TokenTable>, eos_ids: Vec<u32>) -> Constraint {
        let state = State {
            stacks: grammar.initial(),
            pending: Vec::new(),
        };
        let classes = CharClasses::new(&grammar);
        let words = classes.len().div_ceil(64);
        // Children come after their parent in the node list, so one pass
        // from the end sees every child before its parent.
        let mut below = vec![0u64; table.nodes.len() * words];
        let mut edge_class = vec![0u32; table.nodes.len()];
        for n in (0..table.nodes.len()).rev() {
            for &(c, child) in &table.nodes[n].children {
                let k = classes.of(c);
                edge_class[child as usize] = k as u32;
                let (head, tail) = below.split_at_mut(child as usize * words);
                let own = &mut head[n * words..(n + 1) * words];
                own[k / 64] |= 1 << (k % 64);
                for (o, b) in own.iter_mut().zip(&tail[..words]) {
                    *o |= b;
                }
            }
        }
        Constraint {
            grammar,
            table,
            eos_ids,
            state,
            cache: HashMap::new(),
            bits: HashMap::new(),
            classes,
            words,
            below,
            edge_class,
            sets: Vec::new(),
            set_ids: HashMap::new(),
            transitions: Vec::new(),
            chains: Vec::new(),
            #[cfg(test)]
            skipped: 0,
        }
    }

    fn intern(&mut self, stacks: Vec<Stack>) -> u32 {
        if let Some(&id) = self.set_ids.get(&stacks) {
            return id;
        }
        let id = self.sets.len() as u32;
        self.sets.push(stacks.clone());
        self.set_ids.insert(stacks, id);
        let k = self.classes.len();
        self.transitions.resize(self.transitions.len() + k, UNSEEN);
        self.chains.push(None);
        id
    }

    /// The set after a character of class `k` from `set`.
    fn step(&mut self, set: u32, k: usize) -> u32 {
        let at = set as usize * self.classes.len() + k;
        let next = self.transitions[at];
        if next != UNSEEN {
            return next;
        }
        let c = self.classes.member(k);
        let stacks = self.grammar.accept(&self.sets[set as usize], c);
        let next = if stacks.is_empty() {
            DEAD
        } else {
            self.intern(stacks)
        };
        self.transitions[at] = next;
        next
    }

    /// Adds a level to `chain`: where most character classes lead its
    /// last set. False when it cannot grow.
    fn grow(&mut self, chain: &mut Chain) -> bool {
        let words = self.words;
        let levels = chain.common.len() / words;
        if chain.looped || chain.ended {
            return false;
        }
        if levels >= self.table.nodes[0].height as usize {
            chain.ended = true;
            return false;
        }
        let s = *chain.sets.last().expect("a set");
        // Classes by the set they lead to; the largest group wins.
        let mut groups: Vec<(u32, Vec<u64>)> = Vec::new();
        let mut alive = vec![0u64; words];
        for w in 0..words {
            let mut left = self.below[w];
            while left != 0 {
                let k = w * 64 + left.trailing_zeros() as usize;
                left &= left - 1;
                let t = self.step(s, k);
                if t == DEAD {
                    continue;
                }
                alive[k / 64] |= 1 << (k % 64);
                let g = match groups.iter().position(|(n, _)| *n == t) {
                    Some(g) => g,
                    None => {
                        groups.push((t, vec![0; words]));
                        groups.len() - 1
                    }
                };
                groups[g].1[k / 64] |= 1 << (k % 64);
            }
        }
        chain.alive.extend_from_slice(&alive);
        let count = |g: &[u64]| g.iter().map(|w| w.count_ones()).sum::<u32>();
        let Some((next, group)) = groups.into_iter().max_by_key(|(_, g)| count(g)) else {
            chain.ended = true;
            return false;
        };
        let mut common = match levels {
            0 => self.below[..words].to_vec(),
            l => chain.common[(l - 1) * words..l * words].to_vec(),
        };
        for (c, g) in common.iter_mut().zip(&group) {
            *c &= g;
        }
        chain.common.extend_from_slice(&common);
        if next == s {
            chain.looped = true;
        } else {
            chain.sets.push(next);
        }
        true
    }

    /// The grammar has matched a whole output (end-of-sequence may come).
    pub fn is_complete(&self) -> bool {
        self.state.pending.is_empty() && self.state.stacks.iter().any(Vec::is_empty)
    }

    /// Complete, and nothing more could follow.
    pub fn is_finished(&self) -> bool {
        self.state.pending.is_empty() && self.state.stacks.iter().all(Vec::is_empty)
    }

    /// Which tokens may come next (`mask[id]`); end-of-sequence tokens when
    /// the grammar is complete. [`Constraint::mask_bits`] unpacked.
    pub fn mask(&mut self) -> Rc<Vec<bool>> {
        if let Some(m) = self.cache.get(&self.state) {
            return m.clone();
        }
        let bits = self.mask_bits();
        let mask = Rc::new(
            (0..self.table.len())
                .map(|i| bits[i / 32] >> (i % 32) & 1 == 1)
                .collect::<Vec<bool>>(),
        );
        if self.cache.len() >= CACHE_LIMIT {
            self.cache.clear();
        }
        self.cache.insert(self.state.clone(), mask.clone());
        mask
    }

    /// Which tokens may come next as a bitmap: token `id` allowed when bit
    /// `id % 32` of word `id / 32` is set (what the GPU applies to the
    /// logits, [`crate::cpu::masked_argmax`]); end-of-sequence tokens when
    /// the grammar is complete. Kept per state.
    pub fn mask_bits(&mut self) -> Rc<Vec<u32>> {
        if let Some(b) = self.bits.get(&self.state) {
            return b.clone();
        }
        let mut words = if self.state.pending.is_empty() {
            if self.transitions.len() > TRANSITION_LIMIT {
                self.transitions.clear();
                self.chains.clear();
                self.sets.clear();
                self.set_ids.clear();
            }
            let start = self.intern(self.state.stacks.clone());
            let table = self.table.clone();
            let mut walked = Walked {
                ordered: vec![0; table.ordered_tokens.len().div_ceil(64)],
                tails: Vec::new(),
            };
            self.walk(&table, 0, start, &mut walked);
            walked.by_id(&table)
        } else {
            // A character left unfinished: the next token's bytes go on it.
            let mut words = vec![0u32; self.table.len().div_ceil(32)];
            for (id, b) in self.table.bytes.iter().enumerate() {
                let Some(b) = b.as_deref().filter(|b| !b.is_empty()) else {
                    continue;
                };
                let mut all = self.state.pending.clone();
                all.extend_from_slice(b);
                if self.after(&self.state.stacks, &all).is_some() {
                    words[id / 32] |= 1 << (id % 32);
                }
            }
            words
        };
        if self.is_complete() {
            for &e in &self.eos_ids {
                if (e as usize) < self.table.len() {
                    words[e as usize / 32] |= 1 << (e % 32);
                }
            }
        }
        let words = Rc::new(words);
        if self.bits.len() >= CACHE_LIMIT {
            self.bits.clear();
        }
        self.bits.insert(self.state.clone(), words.clone());
        words
    }

    /// How deep below trie node `node` every token continues the output
    /// from `set` with nothing deeper allowed, when that can be told from
    /// the set's chain without walking: the subtree's characters belong to
    /// the chain's common classes for its whole height, or for `l` levels
    /// after which the chain's set accepts none of them. The chain grows
    /// only as far as the answer needs.
    fn allowed_depth(&mut self, set: u32, node: usize) -> Option<usize> {
        let height = self.table.nodes[node].height as usize;
        let words = self.words;
        let mut chain = self.chains[set as usize]
            .take()
            .unwrap_or_else(|| Chain::new(set));
        let at = node * words..(node + 1) * words;
        let within = |below: &[u64], c: &[u64]| below.iter().zip(c).all(|(b, c)| b & !c == 0);
        let mut l = 0;
        while l < height {
            if l + 1 > chain.levels(words) && !self.grow(&mut chain) {
                break;
            }
            if !within(&self.below[at.clone()], chain.common(l + 1, words)) {
                break;
            }
            l += 1;
        }
        let below = &self.below[at];
        let allowed = l == height
            || below
                .iter()
                .zip(chain.alive(l, words))
                .all(|(b, a)| b & a == 0);
        self.chains[set as usize] = Some(chain);
        allowed.then_some(l)
    }

    fn walk(&mut self, table: &TokenTable, node: usize, set: u32, out: &mut Walked) {
        let n = &table.nodes[node];
        if node != 0 && n.tokens_below.len() >= WHOLE_SUBTREE_MIN {
            if let Some(depth) = self.allowed_depth(set, node) {
                #[cfg(test)]
                {
                    self.skipped += 1;
                }
                let chain = self.chains[set as usize].as_ref().expect("grown");
                let range = n.tokens_below.start as usize..n.tokens_below.end as usize;
                let deepest = n.depth as usize + depth;
                if deepest >= n.depth as usize + n.height as usize {
                    set_range(&mut out.ordered, range);
                } else if range.len() <= DEPTH_SCAN_MAX {
                    for p in range {
                        if table.depths[p] as usize <= deepest {
                            out.ordered[p / 64] |= 1 << (p % 64);
                        }
                    }
                } else {
                    for at in table.by_depth[n.depth as usize..=deepest].iter() {
                        let lo = at.partition_point(|&p| (p as usize) < range.start);
                        let hi = at.partition_point(|&p| (p as usize) < range.end);
                        for &p in &at[lo..hi] {
                            out.ordered[p as usize / 64] |= 1 << (p % 64);
                        }
                    }
                }
                let tails =
                    &table.ordered_tails[n.tails_below.start as usize..n.tails_below.end as usize];
                for &(t, lo, hi, d) in tails {
                    let d = (d - n.depth) as usize;
                    if d <= depth
                        && self
                            .grammar
                            .accepts_some(&self.sets[chain.set(d) as usize], lo, hi)
                    {
                        out.tails.push(t);
                    }
                }
                return;
            }
        }
        if node != 0 {
            // A node's own tokens come first in its subtree's range.
            let own = n.tokens_below.start as usize;
            set_range(&mut out.ordered, own..own + n.tokens.len());
        }
        for &(t, lo, hi) in &n.tails {
            if self.grammar.accepts_some(&self.sets[set as usize], lo, hi) {
                out.tails.push(t);
            }
        }
        for &(_, child) in &n.children {
            let next = self.step(set, self.edge_class[child as usize] as usize);
            if next != DEAD {
                self.walk(table, child as usize, next, out);
            }
        }
    }

    /// The state after `bytes` from `stacks`, None when they do not fit.
    fn after(&self, stacks: &[Stack], bytes: &[u8]) -> Option<State> {
        let (chars, tail) = split_utf8(bytes)?;
        let mut stacks = stacks.to_vec();
        for c in chars {
            stacks = self.grammar.accept(&stacks, c);
            if stacks.is_empty() {
                return None;
            }
        }
        if !tail.is_empty() {
            let (lo, hi) = tail_range(&tail)?;
            if !self.grammar.accepts_some(&stacks, lo, hi) {
                return None;
            }
        }
        Some(State {
            stacks,
            pending: tail,
        })
    }

    /// Whether token `id` may come next: the mask's answer, from the
    /// cached mask when there is one, else by running the token's bytes
    /// through the grammar (a few steps, not a walk of the vocabulary).
    pub fn allows(&mut self, id: u32) -> bool {
        if let Some(b) = self.bits.get(&self.state) {
            return (id as usize) < self.table.len() && b[id as usize / 32] >> (id % 32) & 1 == 1;
        }
        if self.eos_ids.contains(&id) {
            return self.is_complete();
        }
        let Some(b) = self
            .table
            .bytes
            .get(id as usize)
            .and_then(|b| b.as_deref())
            .filter(|b| !b.is_empty())
        else {
            return false;
        };
        let mut all = self.state.pending.clone();
        all.extend_from_slice(b);
        self.after(&self.state.stacks, &all).is_some()
    }

    /// Takes token `id` (one the mask allowed; end-of-sequence leaves the
    /// state as it is).
    pub fn accept(&mut self, id: u32) -> Result<()> {
        if self.eos_ids.contains(&id) {
            return Ok(());
        }
        let bytes = self
            .table
            .bytes
            .get(id as usize)
            .and_then(|b| b.as_deref())
            .ok_or_else(|| Error::invalid(format!("token {id} has no text for the grammar")))?;
        let mut all = self.state.pending.clone();
        all.extend_from_slice(bytes);
        self.state = self
            .after(&self.state.stacks, &all)
            .ok_or_else(|| Error::invalid(format!("token {id} does not fit the grammar")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(text: &str) -> Grammar {
        Grammar::parse(text, "test.gbnf").unwrap()
    }

    fn err(text: &str) -> String {
        Grammar::parse(text, "test.gbnf").unwrap_err().to_string()
    }

    #[test]
    fn literals_classes_and_repetitions() {
        let gr = g(
            r#"root ::= "a" [0-9]+ ("x" | "yz")? [^q]{2,3} "\n" # comment
"#,
        );
        for ok in ["a1ab\n", "a12xabc\n", "a0yzqq\n".replace('q', "r").as_str()] {
            assert!(gr.matches(ok), "{ok:?}");
        }
        for bad in ["a\n", "ab\n", "a1x\n", "a1abcd\n", "a1qq\n"] {
            assert!(!gr.matches(bad), "{bad:?}");
        }
    }

    #[test]
    fn multi_line_rules_escapes_and_any() {
        let gr = g(r#"
root ::= item ("," ws item)*
item ::=
  "\x41" . "\u00e9"
ws ::= [ \t]*
"#);
        assert!(gr.matches("A?é"));
        assert!(gr.matches("A?é,  Aßé"));
        assert!(!gr.matches("A?é,"));
    }

    #[test]
    fn errors_say_where() {
        assert_eq!(
            err("root ::= \"a\"\nfoo ::= bar\n"),
            "test.gbnf:2:9: undefined rule bar"
        );
        assert_eq!(
            err("root ::= [abc"),
            "test.gbnf:1:14: unterminated character class"
        );
        assert!(err("root ::= \"a").ends_with("unterminated string literal"));
        assert_eq!(
            err("x ::= \"a\""),
            "test.gbnf: the grammar has no root rule"
        );
        assert_eq!(
            err("root ::= root \"a\""),
            "test.gbnf: left recursion in rule root"
        );
        assert_eq!(
            err("root \"a\""),
            "test.gbnf:1:6: expected ::= after rule name root"
        );
        assert_eq!(
            err("root ::= \"\\q\""),
            "test.gbnf:1:11: unknown escape \\q"
        );
        assert_eq!(
            err("root ::= \"a\"{3,1}"),
            "test.gbnf:1:17: repetition {m,n} with n < m"
        );
    }

    #[test]
    fn token_mask_follows_partial_characters() {
        // Tokens: "a", "b", "ab", the first byte of "é", its second, "é", "".
        let table = Rc::new(TokenTable::new(vec![
            Some(b"a".to_vec()),
            Some(b"b".to_vec()),
            Some(b"ab".to_vec()),
            Some(vec![0xC3]),
            Some(vec![0xA9]),
            Some("é".as_bytes().to_vec()),
            Some(Vec::new()),
            None,
        ]));
        let mut c = Constraint::new(g(r#"root ::= "a" "é"+"#), table, vec![7]);
        assert_eq!(
            *c.mask(),
            [true, false, false, false, false, false, false, false]
        );
        c.accept(0).unwrap();
        assert_eq!(
            *c.mask(),
            [false, false, false, true, false, true, false, false]
        );
        c.accept(3).unwrap();
        assert!(!c.is_complete());
        assert_eq!(
            *c.mask(),
            [false, false, false, false, true, false, false, false]
        );
        c.accept(4).unwrap();
        assert!(c.is_complete() && !c.is_finished());
        assert_eq!(
            *c.mask(),
            [false, false, false, true, false, true, false, true]
        );
        assert_eq!(*c.mask_bits(), [0b1010_1000]);
    }

    #[test]
    fn a_lead_byte_is_allowed_only_where_its_characters_are() {
        // 0xE0 begins U+0800..U+0FFF: never an ASCII letter.
        let table = Rc::new(TokenTable::new(vec![Some(vec![0xE0]), Some(b"t".to_vec())]));
        let mut c = Constraint::new(g(r#"root ::= [a-z]+"#), table.clone(), vec![]);
        assert_eq!(*c.mask(), [false, true]);
        let mut c = Constraint::new(g(r#"root ::= [\u0800-\u0801]"#), table, vec![]);
        assert_eq!(*c.mask(), [true, false]);
        assert_eq!(tail_range(&[0xE0, 0x81]), None);
        assert_eq!(tail_range(&[0xE0, 0xA0]), Some((0x800, 0x83F)));
    }

    /// What the mask must be: each token's bytes run through the grammar.
    fn mask_by_token(c: &Constraint) -> Vec<bool> {
        let mut mask: Vec<bool> = (0..c.table.len())
            .map(|id| {
                let Some(b) = c.table.bytes[id].as_deref().filter(|b| !b.is_empty()) else {
                    return false;
                };
                let mut all = c.state.pending.clone();
                all.extend_from_slice(b);
                c.after(&c.state.stacks, &all).is_some()
            })
            .collect();
        if c.is_complete() {
            for &e in &c.eos_ids {
                mask[e as usize] = true;
            }
        }
        mask
    }

    #[test]
    fn masks_skipping_looping_subtrees_equal_token_by_token_checks() {
        // A vocabulary of random strings over characters the JSON grammar
        // treats apart (quote, backslash, digits, braces, a control
        // character, multi-byte letters and a split one), plus an end token.
        let alphabet: Vec<&[u8]> = vec![
            b"\"",
            b"\\",
            b"a",
            b"b",
            b"z",
            b"0",
            b"7",
            b"-",
            b".",
            b"e",
            b"{",
            b"}",
            b"[",
            b"]",
            b":",
            b",",
            b" ",
            b"\n",
            b"\x01",
            b"t",
            b"r",
            b"u",
            b"n",
            b"l",
            "\u{e9}".as_bytes(),
            "\u{4e2d}".as_bytes(),
            &[0xC3],
            &[0xA9],
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        // Half the tokens, as in real vocabularies, are words: letters,
        // spaces and multi-byte letters only.
        let words = [2usize, 3, 4, 16, 19, 20, 21, 22, 24, 25];
        let mut bytes: Vec<Option<Vec<u8>>> = (0..3000)
            .map(|i| {
                let len = 1 + next() as usize % 5;
                let pick = |r: u64| match i % 2 {
                    0 => alphabet[r as usize % alphabet.len()],
                    _ => alphabet[words[r as usize % words.len()]],
                };
                Some((0..len).flat_map(|_| pick(next()).to_vec()).collect())
            })
            .collect();
        bytes.push(None);
        let eos = bytes.len() as u32 - 1;
        let table = Rc::new(TokenTable::new(bytes));
        let object = r#"{"type": "object", "properties": {"name": {"type": "string"},
            "n": {"type": "integer"}, "x": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "ok": {"type": "boolean"}, "none": {"type": "null"}},
            "required": ["name", "n", "x", "tags", "ok", "none"]}"#;
        // A bare string: the walk spends its steps inside one.
        let string = r#"{"type": "string"}"#;
        let bounded = r#"{"type": "string", "maxLength": 9}"#;
        let mut skipped = 0;
        for schema in [object, string, bounded] {
            let schema: serde_json::Value = serde_json::from_str(schema).unwrap();
            let grammar = g(&json_schema::to_gbnf(&schema, "schema").unwrap());
            for run in 0..4 {
                let mut c = Constraint::new(grammar.clone(), table.clone(), vec![eos]);
                for step in 0..60 {
                    let mask = c.mask();
                    assert_eq!(*mask, mask_by_token(&c), "run {run}, step {step}");
                    let allowed: Vec<u32> = (0..mask.len() as u32)
                        .filter(|&i| mask[i as usize] && i != eos)
                        .collect();
                    if allowed.is_empty() {
                        break;
                    }
                    c.accept(allowed[next() as usize % allowed.len()]).unwrap();
                }
                skipped += c.skipped;
            }
        }
        // The walk did allow subtrees whole (the path under test).
        assert!(skipped > 100, "{skipped} subtrees allowed without a walk");
    }

    #[test]
    fn finished_when_nothing_can_follow() {
        let table = Rc::new(TokenTable::new(vec![Some(b"ok".to_vec()), None]));
        let mut c = Constraint::new(g(r#"root ::= "ok""#), table, vec![1]);
        c.accept(0).unwrap();
        assert!(c.is_finished());
    }
}
