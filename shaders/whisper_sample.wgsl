// whisper_sample: a token drawn from softmax(logits / T) under Whisper's
// rules, for each draw (row, u) (CPU twin: cpu::whisper::whisper_sample,
// which walks the weights exp((x - max) / T) in f64 until u times their
// sum is spent). Here in f32: each chunk's weight (whisper_select_part's
// sum at temperature T, moved to the row's maximum that whisper_select
// wrote), the chunk where u times their total falls, then that chunk's
// tokens. The choice is flagged when u times the total lies within
// MARGIN x total of either edge of the chosen token's interval, or the
// row is damaged or allows nothing: the caller then draws on the CPU from
// the logits. MARGIN (2^-14) bounds the difference between these f32
// partial sums and the CPU's f64 ones: per weight, exp's and the
// division's error (Vulkan: 3 + 2|x| and 2.5 ulp; the weights' softmax
// mean of |x| is at most ln(vocab) + 1 ~ 12, ~3e-6 of the total in all),
// plus ~20 roundings of the sums (~1e-6): ~15x below it.
// bindings: 0-3 whisper_select_common.wgsl, 4 part: array<u32> (read,
//           written at temperature T), 5 picks: array<u32> [rows, 4 + 2k]
//           (read: whisper_select's words over the same rows), 6 draws:
//           array<u32> [draws, 2] (row, u bits), 7 out: array<u32>
//           [draws, 4] (read_write): token, its log probability bits,
//           flags (1: drawn on the CPU instead), 0
// dispatch: (draws, 1, 1) workgroups of 256 threads: chunk weights
// summed in blocks of 256 (an inclusive scan a block), then thread i
// takes tokens 2i and 2i + 1 of the chosen chunk (a scan over threads).

@group(0) @binding(4) var<storage, read> part: array<u32>;
@group(0) @binding(5) var<storage, read> picks: array<u32>;
@group(0) @binding(6) var<storage, read> draws: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<u32>;

const MARGIN: f32 = 6.103515625e-05;
const AMBIGUOUS: u32 = 1u;

var<workgroup> chosen: atomic<u32>;
var<workgroup> before_chunk: f32;

// Chunk c's weight: the sum of exp((x - top) / T) over its allowed tokens.
fn chunk_weight(row_at: u32, c: u32, first: u32, top: f32) -> f32 {
    let at = row_at + c * part_words();
    if (c < first || (part[at] & FOUND) == 0u) {
        return 0.0;
    }
    let m = bitcast<f32>(part[at + 1u]);
    return bitcast<f32>(part[at + 3u]) * exp((m - top) / p.temperature);
}

// Token t's weight exp((x - top) / T) when below end and left by the rules.
fn token_weight(r: u32, t: u32, end: u32, ru: Rule, ban_text: bool, top: f32) -> f32 {
    if (t >= end) {
        return 0.0;
    }
    let x = logits[r * p.vocab + t];
    if (!allowed(t, x, ru) || (ban_text && t < p.timestamp_begin)) {
        return 0.0;
    }
    return exp((x - top) / p.temperature);
}

// Inclusive scan of sv over the workgroup; returns this thread's total.
fn scan(lid: u32, x: f32) -> f32 {
    sv[lid] = x;
    workgroupBarrier();
    for (var off = 1u; off < WG; off <<= 1u) {
        var add = 0.0;
        if (lid >= off) {
            add = sv[lid - off];
        }
        workgroupBarrier();
        sv[lid] += add;
        workgroupBarrier();
    }
    return sv[lid];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let d = wid.x;
    let r = draws[2u * d];
    let u = bitcast<f32>(draws[2u * d + 1u]);
    let ru = rule(r);
    let o = r * (4u + 2u * p.k);
    let flags = picks[o + 1u];
    let ban_text = (flags & BAN_TEXT) != 0u;
    let lse = bitcast<f32>(picks[o + 2u]);
    let top_bits = picks[o + 3u];
    let top = bitcast<f32>(top_bits);
    // Damaged rows and rows that allow nothing go to the CPU; the sums
    // below then run on whatever is there, and are not used.
    let usable = (flags & DAMAGED) == 0u && top_bits != p.neg_inf_bits;
    var first = 0u;
    if (ban_text) {
        first = p.text_chunks;
    }
    let row_at = r * p.chunks * part_words();

    var total = 0.0;
    for (var c = lid; c < p.chunks; c += WG) {
        total += chunk_weight(row_at, c, first, top);
    }
    sv[lid] = total;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            sv[lid] += sv[lid + s];
        }
        workgroupBarrier();
    }
    total = sv[0];
    workgroupBarrier();
    let goal = u * total;
    let margin = MARGIN * total;

    // The first chunk whose running sum passes the goal.
    if (lid == 0u) {
        atomicStore(&chosen, NONE);
    }
    workgroupBarrier();
    var carry = 0.0;
    var my_c = NONE;
    var my_start = 0.0;
    for (var b = 0u; b < p.chunks; b += WG) {
        let c = b + lid;
        var w = 0.0;
        if (c < p.chunks) {
            w = chunk_weight(row_at, c, first, top);
        }
        let incl = carry + scan(lid, w);
        if (my_c == NONE && w > 0.0 && incl > goal && incl - w <= goal) {
            atomicMin(&chosen, c);
            my_c = c;
            my_start = incl - w;
        }
        carry += sv[WG - 1u];
        workgroupBarrier();
    }
    let c = atomicLoad(&chosen);
    if (c != NONE && my_c == c) {
        before_chunk = my_start;
    }
    workgroupBarrier();
    let start = before_chunk;
    workgroupBarrier();

    // That chunk's tokens, in order.
    if (lid == 0u) {
        atomicStore(&chosen, NONE);
    }
    var toks = vec2<u32>(0u, 0u);
    if (c != NONE) {
        toks = chunk_range(c);
    }
    let t0 = toks.x + 2u * lid;
    let v = vec2<f32>(token_weight(r, t0, toks.y, ru, ban_text, top),
                      token_weight(r, t0 + 1u, toks.y, ru, ban_text, top));
    let incl = scan(lid, v.x + v.y);
    var lo = start;
    if (lid > 0u) {
        lo = start + sv[lid - 1u];
    }
    let mid = lo + v.x;
    let hi = start + incl;
    var mine = NONE;
    var edge = vec2<f32>(0.0, 0.0);
    if (v.x > 0.0 && mid > goal) {
        mine = t0;
        edge = vec2<f32>(lo, mid);
    } else if (v.y > 0.0 && hi > goal) {
        mine = t0 + 1u;
        edge = vec2<f32>(mid, hi);
    }
    if (mine != NONE) {
        atomicMin(&chosen, mine);
    }
    workgroupBarrier();
    let t = atomicLoad(&chosen);
    if (lid == 0u && t == NONE) {
        out[4u * d] = 0u;
        out[4u * d + 1u] = p.neg_inf_bits;
        out[4u * d + 2u] = AMBIGUOUS;
        out[4u * d + 3u] = 0u;
    }
    if (t != NONE && mine == t) {
        var f = 0u;
        if (!usable || goal - edge.x <= margin || edge.y - goal <= margin) {
            f = AMBIGUOUS;
        }
        out[4u * d] = t;
        out[4u * d + 1u] = bitcast<u32>(logits[r * p.vocab + t] - lse);
        out[4u * d + 2u] = f;
        out[4u * d + 3u] = 0u;
    }
}
