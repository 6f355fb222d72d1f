//! GBNF, llama.cpp's grammar format (`grammars/README.md` there): rules
//! `name ::= alternatives`, string literals, character classes, `.`, groups,
//! and the repetitions `* + ? {m} {m,} {m,n}`; `#` comments. Parsed into
//! rules of elements, repetitions rewritten into extra rules as llama.cpp
//! does, and checked for undefined rules and left recursion.

use crate::error::{Error, Result};
use std::collections::HashMap;

/// One element of an alternative.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// A code point in one of `ranges` (inclusive), or not in any when
    /// `negated` (`.` is a negated empty set).
    Chars {
        negated: bool,
        ranges: Vec<(u32, u32)>,
    },
    /// Another rule.
    Ref(u32),
    /// The end of an alternative.
    End,
}

impl Elem {
    pub fn matches(&self, c: u32) -> bool {
        match self {
            Elem::Chars { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }
            _ => false,
        }
    }

    /// Whether some code point in `lo..=hi` matches (for a character whose
    /// first bytes are known).
    pub fn matches_some(&self, lo: u32, hi: u32) -> bool {
        match self {
            Elem::Chars {
                negated: false,
                ranges,
            } => ranges.iter().any(|&(a, b)| a <= hi && lo <= b),
            Elem::Chars {
                negated: true,
                ranges,
            } => {
                // Some point of lo..=hi lies outside every range.
                let mut sorted = ranges.clone();
                sorted.sort_unstable();
                let mut next = lo;
                for (a, b) in sorted {
                    if a > next {
                        break;
                    }
                    next = next.max(b.saturating_add(1));
                    if next > hi {
                        return false;
                    }
                }
                next <= hi
            }
            _ => false,
        }
    }
}

/// A compiled grammar: every alternative's elements in one array, each
/// alternative ending with [`Elem::End`].
#[derive(Clone, Debug)]
pub struct Grammar {
    pub elems: Vec<Elem>,
    /// Per rule, where each of its alternatives starts in `elems`.
    pub rules: Vec<Vec<u32>>,
    pub names: Vec<String>,
    pub root: u32,
}

#[derive(Clone, Debug)]
enum Atom {
    Literal(Vec<u32>),
    Chars {
        negated: bool,
        ranges: Vec<(u32, u32)>,
    },
    Ref {
        name: String,
        at: usize,
    },
    Group(Vec<Vec<Term>>),
}

#[derive(Clone, Debug)]
struct Term {
    atom: Atom,
    min: u32,
    max: Option<u32>,
}

/// The most repetitions `{m,n}` may ask for (each one is a copy).
const MAX_REPEAT: u32 = 4096;

struct Parser<'a> {
    src: &'a [char],
    pos: usize,
}

impl Grammar {
    /// Parses GBNF text; `what` names its source in errors.
    pub fn parse(text: &str, what: &str) -> Result<Grammar> {
        let chars: Vec<char> = text.chars().collect();
        let mut p = Parser {
            src: &chars,
            pos: 0,
        };
        let rules = p.rules().map_err(|(at, msg)| {
            let (line, col) = line_col(&chars, at);
            Error::invalid(format!("{what}:{line}:{col}: {msg}"))
        })?;
        compile(rules).map_err(|(at, msg)| match at {
            Some(at) => {
                let (line, col) = line_col(&chars, at);
                Error::invalid(format!("{what}:{line}:{col}: {msg}"))
            }
            None => Error::invalid(format!("{what}: {msg}")),
        })
    }

    pub fn is_end(&self, pos: u32) -> bool {
        self.elems[pos as usize] == Elem::End
    }
}

fn line_col(chars: &[char], at: usize) -> (usize, usize) {
    let before = &chars[..at.min(chars.len())];
    let line = before.iter().filter(|&&c| c == '\n').count() + 1;
    let col = before.iter().rev().take_while(|&&c| c != '\n').count() + 1;
    (line, col)
}

type PResult<T> = std::result::Result<T, (usize, String)>;

/// A parsed rule: name, where it starts, alternatives.
type ParsedRule = (String, usize, Vec<Vec<Term>>);

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.src.get(self.pos).copied()
    }

    fn at(&self, s: &str) -> bool {
        s.chars()
            .enumerate()
            .all(|(i, c)| self.src.get(self.pos + i) == Some(&c))
    }

    fn err<T>(&self, msg: impl Into<String>) -> PResult<T> {
        Err((self.pos, msg.into()))
    }

    /// Skips blanks and comments, and newlines when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.pos += 1;
                    }
                }
                '\r' | '\n' if newlines => self.pos += 1,
                _ => break,
            }
        }
    }

    fn name(&mut self) -> PResult<String> {
        let start = self.pos;
        while self.peek().is_some_and(is_word_char) {
            self.pos += 1;
        }
        if self.pos == start {
            return self.err("expected a rule name");
        }
        Ok(self.src[start..self.pos].iter().collect())
    }

    fn rules(&mut self) -> PResult<Vec<ParsedRule>> {
        let mut out = Vec::new();
        self.space(true);
        while self.peek().is_some() {
            let at = self.pos;
            let name = self.name()?;
            self.space(false);
            if !self.at("::=") {
                return self.err(format!("expected ::= after rule name {name}"));
            }
            self.pos += 3;
            self.space(true);
            let alts = self.alternatives(false)?;
            match self.peek() {
                None | Some('\n') | Some('\r') => {}
                Some(c) => return self.err(format!("unexpected {c:?}")),
            }
            out.push((name, at, alts));
            self.space(true);
        }
        Ok(out)
    }

    fn alternatives(&mut self, nested: bool) -> PResult<Vec<Vec<Term>>> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> PResult<Vec<Term>> {
        let mut seq: Vec<Term> = Vec::new();
        loop {
            let atom = match self.peek() {
                Some('"') => {
                    self.pos += 1;
                    let mut lit = Vec::new();
                    loop {
                        match self.peek() {
                            None => return self.err("unterminated string literal"),
                            Some('"') => break,
                            Some(_) => lit.push(self.char_in_literal()?),
                        }
                    }
                    self.pos += 1;
                    Atom::Literal(lit)
                }
                Some('[') => {
                    self.pos += 1;
                    let negated = self.peek() == Some('^');
                    if negated {
                        self.pos += 1;
                    }
                    let mut ranges = Vec::new();
                    loop {
                        match self.peek() {
                            None => return self.err("unterminated character class"),
                            Some(']') => break,
                            Some(_) => {
                                let lo = self.char_in_literal()?;
                                let hi = if self.peek() == Some('-')
                                    && self.src.get(self.pos + 1).is_some_and(|&c| c != ']')
                                {
                                    self.pos += 1;
                                    self.char_in_literal()?
                                } else {
                                    lo
                                };
                                if hi < lo {
                                    return self.err("character range ends before it starts");
                                }
                                ranges.push((lo, hi));
                            }
                        }
                    }
                    self.pos += 1;
                    Atom::Chars { negated, ranges }
                }
                Some('.') => {
                    self.pos += 1;
                    Atom::Chars {
                        negated: true,
                        ranges: Vec::new(),
                    }
                }
                Some('(') => {
                    self.pos += 1;
                    self.space(true);
                    let alts = self.alternatives(true)?;
                    if self.peek() != Some(')') {
                        return self.err("expected )");
                    }
                    self.pos += 1;
                    Atom::Group(alts)
                }
                Some('<') | Some('!') => {
                    return self.err("token references (<...>) are not supported")
                }
                Some(c) if is_word_char(c) => {
                    let at = self.pos;
                    let name = self.name()?;
                    Atom::Ref { name, at }
                }
                _ => break,
            };
            seq.push(Term {
                atom,
                min: 1,
                max: Some(1),
            });
            self.space(nested);
            // Postfix repetitions apply to the last term.
            loop {
                let (min, max) = match self.peek() {
                    Some('*') => (0, None),
                    Some('+') => (1, None),
                    Some('?') => (0, Some(1)),
                    Some('{') => {
                        self.pos += 1;
                        self.space(false);
                        let min = self.number()?;
                        self.space(false);
                        let max = if self.peek() == Some(',') {
                            self.pos += 1;
                            self.space(false);
                            if self.peek() == Some('}') {
                                None
                            } else {
                                Some(self.number()?)
                            }
                        } else {
                            Some(min)
                        };
                        self.space(false);
                        if self.peek() != Some('}') {
                            return self.err("expected } to close the repetition");
                        }
                        if max.is_some_and(|m| m < min) {
                            return self.err("repetition {m,n} with n < m");
                        }
                        if max.unwrap_or(min) > MAX_REPEAT {
                            return self.err(format!("repetitions are limited to {MAX_REPEAT}"));
                        }
                        (min, max)
                    }
                    _ => break,
                };
                self.pos += 1;
                let last = seq.pop().expect("a term precedes the repetition");
                let term = if last.min == 1 && last.max == Some(1) {
                    Term { min, max, ..last }
                } else {
                    Term {
                        atom: Atom::Group(vec![vec![last]]),
                        min,
                        max,
                    }
                };
                seq.push(term);
                self.space(nested);
            }
        }
        if seq.is_empty() && !matches!(self.peek(), None | Some('|' | ')' | '\n' | '\r')) {
            if let Some(c) = self.peek() {
                return self.err(format!("unexpected {c:?}"));
            }
        }
        Ok(seq)
    }

    fn number(&mut self) -> PResult<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let s: String = self.src[start..self.pos].iter().collect();
        s.parse().or_else(|_| {
            self.pos = start;
            self.err("expected a number")
        })
    }

    /// One character of a literal or class, escapes decoded.
    fn char_in_literal(&mut self) -> PResult<u32> {
        let c = self.peek().expect("caller checked");
        self.pos += 1;
        if c != '\\' {
            return Ok(c as u32);
        }
        let Some(e) = self.peek() else {
            return self.err("unterminated escape");
        };
        self.pos += 1;
        let hex = |p: &mut Self, n: usize| -> PResult<u32> {
            let start = p.pos;
            let digits: String = p.src[start..(start + n).min(p.src.len())].iter().collect();
            if digits.len() != n || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
                return p.err(format!("expected {n} hex digits"));
            }
            p.pos += n;
            Ok(u32::from_str_radix(&digits, 16).expect("checked hex"))
        };
        Ok(match e {
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            't' => '\t' as u32,
            'r' => '\r' as u32,
            'n' => '\n' as u32,
            '\\' | '"' | '[' | ']' | '-' | '^' => e as u32,
            _ => {
                self.pos -= 2;
                return self.err(format!("unknown escape \\{e}"));
            }
        })
    }
}

type CResult<T> = std::result::Result<T, (Option<usize>, String)>;

struct Compiler {
    ids: HashMap<String, u32>,
    names: Vec<String>,
    /// Per rule, its alternatives' elements (without the End markers).
    bodies: Vec<Vec<Vec<Elem>>>,
}

impl Compiler {
    fn new_rule(&mut self, parent: u32) -> u32 {
        let id = self.names.len() as u32;
        self.names
            .push(format!("{}-{}", self.names[parent as usize], id));
        self.bodies.push(Vec::new());
        id
    }

    fn alternatives(&mut self, rule: u32, alts: &[Vec<Term>]) -> CResult<Vec<Vec<Elem>>> {
        alts.iter().map(|seq| self.sequence(rule, seq)).collect()
    }

    fn sequence(&mut self, rule: u32, seq: &[Term]) -> CResult<Vec<Elem>> {
        let mut out = Vec::new();
        for term in seq {
            let x = self.atom(rule, &term.atom)?;
            for _ in 0..term.min {
                out.extend(x.iter().cloned());
            }
            match term.max {
                // x* as `s ::= x s | ` (right recursion).
                None => {
                    let s = self.new_rule(rule);
                    let mut first = x.clone();
                    first.push(Elem::Ref(s));
                    self.bodies[s as usize] = vec![first, Vec::new()];
                    out.push(Elem::Ref(s));
                }
                // Up to n - m more as nested optionals: `o ::= x o' | `.
                Some(max) if max > term.min => {
                    let mut inner: Option<u32> = None;
                    for _ in term.min..max {
                        let o = self.new_rule(rule);
                        let mut first = x.clone();
                        first.extend(inner.map(Elem::Ref));
                        self.bodies[o as usize] = vec![first, Vec::new()];
                        inner = Some(o);
                    }
                    out.push(Elem::Ref(inner.expect("max > min")));
                }
                Some(_) => {}
            }
        }
        Ok(out)
    }

    fn atom(&mut self, rule: u32, atom: &Atom) -> CResult<Vec<Elem>> {
        Ok(match atom {
            Atom::Literal(cs) => cs
                .iter()
                .map(|&c| Elem::Chars {
                    negated: false,
                    ranges: vec![(c, c)],
                })
                .collect(),
            Atom::Chars { negated, ranges } => vec![Elem::Chars {
                negated: *negated,
                ranges: ranges.clone(),
            }],
            Atom::Ref { name, at } => match self.ids.get(name) {
                Some(&id) => vec![Elem::Ref(id)],
                None => return Err((Some(*at), format!("undefined rule {name}"))),
            },
            Atom::Group(alts) => {
                let g = self.new_rule(rule);
                let body = self.alternatives(g, alts)?;
                self.bodies[g as usize] = body;
                vec![Elem::Ref(g)]
            }
        })
    }
}

fn compile(rules: Vec<ParsedRule>) -> CResult<Grammar> {
    let mut c = Compiler {
        ids: HashMap::new(),
        names: Vec::new(),
        bodies: Vec::new(),
    };
    for (name, at, _) in &rules {
        if c.ids.contains_key(name) {
            return Err((Some(*at), format!("rule {name} is defined twice")));
        }
        c.ids.insert(name.clone(), c.names.len() as u32);
        c.names.push(name.clone());
        c.bodies.push(Vec::new());
    }
    let Some(&root) = c.ids.get("root") else {
        return Err((None, "the grammar has no root rule".into()));
    };
    for (i, (_, _, alts)) in rules.iter().enumerate() {
        let body = c.alternatives(i as u32, alts)?;
        c.bodies[i] = body;
    }
    check_left_recursion(&c.bodies, &c.names)?;
    let mut elems = Vec::new();
    let mut starts = Vec::new();
    for body in &c.bodies {
        let mut alts = Vec::new();
        for alt in body {
            alts.push(elems.len() as u32);
            elems.extend(alt.iter().cloned());
            elems.push(Elem::End);
        }
        starts.push(alts);
    }
    Ok(Grammar {
        elems,
        rules: starts,
        names: c.names,
        root,
    })
}

/// A rule that can begin with itself (through rules that may match
/// nothing) would expand forever; llama.cpp refuses them too.
fn check_left_recursion(bodies: &[Vec<Vec<Elem>>], names: &[String]) -> CResult<()> {
    let n = bodies.len();
    let mut nullable = vec![false; n];
    loop {
        let mut changed = false;
        for r in 0..n {
            if !nullable[r]
                && bodies[r].iter().any(|alt| {
                    alt.iter()
                        .all(|e| matches!(e, Elem::Ref(q) if nullable[*q as usize]))
                })
            {
                nullable[r] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Rules each rule may start with.
    let firsts: Vec<Vec<usize>> = bodies
        .iter()
        .map(|alts| {
            let mut f = Vec::new();
            for alt in alts {
                for e in alt {
                    match e {
                        Elem::Ref(q) => {
                            f.push(*q as usize);
                            if !nullable[*q as usize] {
                                break;
                            }
                        }
                        _ => break,
                    }
                }
            }
            f
        })
        .collect();
    // Depth-first search for a cycle: 0 unvisited, 1 on the path, 2 done.
    let mut mark = vec![0u8; n];
    for start in 0..n {
        if mark[start] != 0 {
            continue;
        }
        let mut stack = vec![(start, 0usize)];
        mark[start] = 1;
        while let Some(&mut (r, ref mut i)) = stack.last_mut() {
            if let Some(&q) = firsts[r].get(*i) {
                *i += 1;
                match mark[q] {
                    0 => {
                        mark[q] = 1;
                        stack.push((q, 0));
                    }
                    1 => {
                        return Err((None, format!("left recursion in rule {}", names[q])));
                    }
                    _ => {}
                }
            } else {
                mark[r] = 2;
                stack.pop();
            }
        }
    }
    Ok(())
}
