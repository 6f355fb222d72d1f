//! Constrained generation: a grammar (GBNF, or one made from a JSON Schema)
//! decides which tokens may come next. The matcher is a pushdown automaton
//! over code points as in llama.cpp: a state is a set of stacks of positions
//! in the grammar's elements, each stack's top a character element. The mask
//! over the vocabulary walks a trie of the tokens' characters (built once),
//! so tokens sharing a prefix share the work; masks are cached per state
//! (inside a JSON string, every character leads back to the same state).

pub mod json_schema;
mod parse;

pub use parse::{Elem, Grammar};

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
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
}

#[derive(Default)]
struct TrieNode {
    children: Vec<(u32, u32)>,
    /// Tokens whose characters end here.
    tokens: Vec<u32>,
    /// Tokens that end here with an unfinished character, and its range.
    tails: Vec<(u32, u32, u32)>,
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
        TokenTable { bytes, nodes }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
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
    /// Stack sets met while masking, by id, and the transitions between
    /// them: walking the trie is then mostly look-ups.
    sets: Vec<Vec<Stack>>,
    set_ids: HashMap<Vec<Stack>, u32>,
    transitions: HashMap<(u32, u32), u32, BuildHasherDefault<PairHasher>>,
}

/// A multiplicative hash for the (set, character) keys of the transition
/// table: the default SipHash made the trie walk several times slower.
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// No stack accepts the character.
const DEAD: u32 = u32::MAX;

/// Transitions remembered at most before they are forgotten.
const TRANSITION_LIMIT: usize = 1 << 20;

/// Masks cached at most (each is a vocabulary of bools).
const CACHE_LIMIT: usize = 256;

impl Constraint {
    pub fn new(grammar: Grammar, table: Rc<TokenTable>, eos_ids: Vec<u32>) -> Constraint {
        let state = State {
            stacks: grammar.initial(),
            pending: Vec::new(),
        };
        Constraint {
            grammar,
            table,
            eos_ids,
            state,
            cache: HashMap::new(),
            bits: HashMap::new(),
            sets: Vec::new(),
            set_ids: HashMap::new(),
            transitions: HashMap::default(),
        }
    }

    fn intern(&mut self, stacks: Vec<Stack>) -> u32 {
        if let Some(&id) = self.set_ids.get(&stacks) {
            return id;
        }
        let id = self.sets.len() as u32;
        self.sets.push(stacks.clone());
        self.set_ids.insert(stacks, id);
        id
    }

    fn step(&mut self, set: u32, c: u32) -> u32 {
        if let Some(&next) = self.transitions.get(&(set, c)) {
            return next;
        }
        let stacks = self.grammar.accept(&self.sets[set as usize], c);
        let next = if stacks.is_empty() {
            DEAD
        } else {
            self.intern(stacks)
        };
        self.transitions.insert((set, c), next);
        next
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
    /// the grammar is complete.
    pub fn mask(&mut self) -> Rc<Vec<bool>> {
        if let Some(m) = self.cache.get(&self.state) {
            return m.clone();
        }
        let mut mask = vec![false; self.table.len()];
        if self.state.pending.is_empty() {
            if self.transitions.len() > TRANSITION_LIMIT {
                self.transitions.clear();
                self.sets.clear();
                self.set_ids.clear();
            }
            let start = self.intern(self.state.stacks.clone());
            let table = self.table.clone();
            self.walk(&table, 0, start, &mut mask);
        } else {
            // A character left unfinished: the next token's bytes go on it.
            for (id, b) in self.table.bytes.iter().enumerate() {
                let Some(b) = b.as_deref().filter(|b| !b.is_empty()) else {
                    continue;
                };
                let mut all = self.state.pending.clone();
                all.extend_from_slice(b);
                mask[id] = self.after(&self.state.stacks, &all).is_some();
            }
        }
        if self.is_complete() {
            for &e in &self.eos_ids {
                if let Some(m) = mask.get_mut(e as usize) {
                    *m = true;
                }
            }
        }
        let mask = Rc::new(mask);
        if self.cache.len() >= CACHE_LIMIT {
            self.cache.clear();
        }
        self.cache.insert(self.state.clone(), mask.clone());
        mask
    }

    /// [`Constraint::mask`] as a bitmap: token `id` allowed when bit
    /// `id % 32` of word `id / 32` is set (what the GPU applies to the
    /// logits, [`crate::cpu::masked_argmax`]). Kept per state, as the masks.
    pub fn mask_bits(&mut self) -> Rc<Vec<u32>> {
        if let Some(b) = self.bits.get(&self.state) {
            return b.clone();
        }
        let mask = self.mask();
        let mut words = vec![0u32; mask.len().div_ceil(32)];
        for (i, _) in mask.iter().enumerate().filter(|(_, &ok)| ok) {
            words[i / 32] |= 1 << (i % 32);
        }
        let words = Rc::new(words);
        if self.bits.len() >= CACHE_LIMIT {
            self.bits.clear();
        }
        self.bits.insert(self.state.clone(), words.clone());
        words
    }

    fn walk(&mut self, table: &TokenTable, node: usize, set: u32, mask: &mut [bool]) {
        let n = &table.nodes[node];
        if node != 0 {
            for &t in &n.tokens {
                mask[t as usize] = true;
            }
        }
        for &(t, lo, hi) in &n.tails {
            if self.grammar.accepts_some(&self.sets[set as usize], lo, hi) {
                mask[t as usize] = true;
            }
        }
        for &(c, child) in &n.children {
            let next = self.step(set, c);
            if next != DEAD {
                self.walk(table, child as usize, next, mask);
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
        if let Some(m) = self.cache.get(&self.state) {
            return m.get(id as usize).copied().unwrap_or(false);
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

    #[test]
    fn finished_when_nothing_can_follow() {
        let table = Rc::new(TokenTable::new(vec![Some(b"ok".to_vec()), None]));
        let mut c = Constraint::new(g(r#"root ::= "ok""#), table, vec![1]);
        c.accept(0).unwrap();
        assert!(c.is_finished());
    }
}
