// whisper_select_common: what whisper_select_part, whisper_select and
// whisper_sample share: their params, the row's logits, rules and token
// masks, and which tokens a row allows (CPU twin: cpu::whisper::filter_row):
//   banned(t) = !RAW && (mask0[t] || FIRST && mask1[t] || t < text_end
//               || timestamp_begin <= t < ts_from || t >= ts_end);
//   a NaN is never allowed either.
// The vocabulary is cut into chunks of CHUNK tokens, each wholly text
// (below timestamp_begin: chunks 0 .. text_chunks) or wholly timestamps
// (chunks text_chunks .. chunks), so that openai-whisper's last rule (when
// the timestamps' log-sum-exp beats the best allowed text logit, every
// text token is banned too) drops whole chunks.
// bindings: 0 params, 1 logits: array<f32> [rows, vocab], 2 rules:
//           array<u32> [rows, 8] {text_end, ts_from, ts_end, flags (1 FIRST,
//           2 RAW), probe (0xffffffff: none), 3 unused}, 3 masks:
//           array<u32> [2, words] (bit t % 32 of word t / 32: never
//           sampled, not sampled first); each kernel's own from 4 on.
// part: [rows, chunks, 4 + 2k] u32: flags (1 an allowed token, 2 a NaN or
// an infinity seen), max, sum of exp(x - max), sum of exp((x - max) / T)
// (0 without a temperature) over the chunk's allowed tokens, then their k
// first (token, logit) in the order (logit descending, id ascending),
// NONE past them.

struct Params {
    vocab: u32, timestamp_begin: u32, k: u32, timestamps: u32,
    words: u32, neg_inf_bits: u32, text_chunks: u32, chunks: u32,
    temperature: f32, _p0: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> rules: array<u32>;
@group(0) @binding(3) var<storage, read> masks: array<u32>;

const WG: u32 = 256u;
const CHUNK: u32 = 512u;
const NONE: u32 = 0xffffffffu;
const EXPONENT: u32 = 0x7f800000u;
const MANTISSA: u32 = 0x007fffffu;
const FIRST: u32 = 1u;
const RAW: u32 = 2u;
const FOUND: u32 = 1u;
const NONFINITE: u32 = 2u;
// whisper_select's row flags (its word 1).
const DAMAGED: u32 = 1u;
const BAN_TEXT: u32 = 2u;

struct Rule { text_end: u32, ts_from: u32, ts_end: u32, flags: u32, probe: u32 }

fn rule(r: u32) -> Rule {
    return Rule(rules[8u * r], rules[8u * r + 1u], rules[8u * r + 2u], rules[8u * r + 3u],
                rules[8u * r + 4u]);
}

fn is_nan(x: f32) -> bool {
    let b = bitcast<u32>(x);
    return (b & EXPONENT) == EXPONENT && (b & MANTISSA) != 0u;
}

fn bit(which: u32, t: u32) -> bool {
    return ((masks[which * p.words + (t >> 5u)] >> (t & 31u)) & 1u) == 1u;
}

fn allowed(t: u32, x: f32, ru: Rule) -> bool {
    if (is_nan(x)) {
        return false;
    }
    if ((ru.flags & RAW) != 0u) {
        return true;
    }
    let banned = bit(0u, t) || ((ru.flags & FIRST) != 0u && bit(1u, t)) || t < ru.text_end
        || (t >= p.timestamp_begin && t < ru.ts_from) || t >= ru.ts_end;
    return !banned;
}

// Tokens start .. end of chunk c.
fn chunk_range(c: u32) -> vec2<u32> {
    let tb = min(p.timestamp_begin, p.vocab);
    if (c < p.text_chunks) {
        return vec2<u32>(c * CHUNK, min((c + 1u) * CHUNK, tb));
    }
    let s = tb + (c - p.text_chunks) * CHUNK;
    return vec2<u32>(s, min(s + CHUNK, p.vocab));
}

fn part_words() -> u32 {
    return 4u + 2u * p.k;
}

// (v, i) comes before (w, j) among allowed tokens: logit descending, id
// ascending; index NONE is no token and comes last.
fn before(v: f32, i: u32, w: f32, j: u32) -> bool {
    if (i == NONE) {
        return false;
    }
    if (j == NONE) {
        return true;
    }
    if (v != w) {
        return v > w;
    }
    return i < j;
}

// Workgroup scratch of the kernels' reductions (WG threads).
var<workgroup> sv: array<f32, 256>;
var<workgroup> sw: array<f32, 256>;
var<workgroup> si: array<u32, 256>;

struct Best { v: f32, i: u32 }

// The workgroup's first (v, i) in `before`'s order; every thread gets it.
fn workgroup_best(lid: u32, v: f32, i: u32) -> Best {
    sv[lid] = v;
    si[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s && before(sv[lid + s], si[lid + s], sv[lid], si[lid])) {
            sv[lid] = sv[lid + s];
            si[lid] = si[lid + s];
        }
        workgroupBarrier();
    }
    let best = Best(sv[0], si[0]);
    workgroupBarrier();
    return best;
}

// The workgroup's sums of a and of b (a tree in a fixed order); every
// thread gets them.
fn workgroup_sums(lid: u32, a: f32, b: f32) -> vec2<f32> {
    sv[lid] = a;
    sw[lid] = b;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            sv[lid] += sv[lid + s];
            sw[lid] += sw[lid + s];
        }
        workgroupBarrier();
    }
    let sums = vec2<f32>(sv[0], sw[0]);
    workgroupBarrier();
    return sums;
}
