// whisper_select: Whisper's choice of the next token for each row of logits
// (CPU twin: cpu::whisper::whisper_select), so a decoder step reads back a
// few words a row instead of the whole vocabulary:
//   banned(t) = !RAW && (mask0[t] || FIRST && mask1[t] || t < text_end
//               || timestamp_begin <= t < ts_from || t >= ts_end);
//   a NaN is never chosen either. With timestamps on and not RAW
//   (openai-whisper's last filter): when the timestamps' log-sum-exp beats
//   the best allowed text logit, every text token is banned too, and the
//   row's log-sum-exp is the timestamps'; else it is over every allowed
//   token. Picks: the k first tokens in the order (allowed first, logit
//   descending, id ascending); a banned pick has log probability -inf.
// bindings: 0 params {vocab, timestamp_begin, k, timestamps, words,
//           neg_inf_bits}, 1 logits: array<f32> [rows, vocab],
//           2 rules: array<u32> [rows, 8] {text_end, ts_from, ts_end, flags
//           (1 FIRST, 2 RAW), probe (0xffffffff: none), 3 unused},
//           3 masks: array<u32> [2, words] (bit t % 32 of word t / 32:
//           never sampled, not sampled first),
//           4 out: array<u32> [rows, 2 + 2k] (read_write): the probe's log
//           probability bits (-inf when banned or none), 1 when the row's
//           logits hold a NaN or an infinity (else 0), then k pairs (token,
//           log probability bits), best first
// dispatch: (rows, 1, 1) workgroups of 256 threads, workgroup r on row r:
// two strided passes (maxima, then sums of exponentials) and one a pick,
// each ended by a tree reduction in workgroup memory. Infinities are never
// computed with (drivers may assume values finite): a maximum carries a
// "found" flag, and -inf is written from its bits (params.neg_inf_bits).

struct Params {
    vocab: u32, timestamp_begin: u32, k: u32, timestamps: u32,
    words: u32, neg_inf_bits: u32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> rules: array<u32>;
@group(0) @binding(3) var<storage, read> masks: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
const EXPONENT: u32 = 0x7f800000u;
const MANTISSA: u32 = 0x007fffffu;
const FIRST: u32 = 1u;
const RAW: u32 = 2u;

var<workgroup> sf: array<u32, 256>;
var<workgroup> sv: array<f32, 256>;
var<workgroup> si: array<u32, 256>;

struct Rule { text_end: u32, ts_from: u32, ts_end: u32, flags: u32, probe: u32 }

// A value with a flag: found (1) or none (0).
struct Found { f: u32, v: f32 }

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

fn max_found(a: Found, b: Found) -> Found {
    if (b.f == 1u && (a.f == 0u || b.v > a.v)) {
        return b;
    }
    return a;
}

fn reduce_max(lid: u32, x: Found) -> Found {
    sf[lid] = x.f;
    sv[lid] = x.v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let m = max_found(Found(sf[lid], sv[lid]), Found(sf[lid + s], sv[lid + s]));
            sf[lid] = m.f;
            sv[lid] = m.v;
        }
        workgroupBarrier();
    }
    let r = Found(sf[0], sv[0]);
    workgroupBarrier();
    return r;
}

fn reduce_sum(lid: u32, x: f32) -> f32 {
    sv[lid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            sv[lid] += sv[lid + s];
        }
        workgroupBarrier();
    }
    let r = sv[0];
    workgroupBarrier();
    return r;
}

// (a, v, i) comes before (b, w, j) in the pick order; index NONE is no token.
fn before(a: u32, v: f32, i: u32, b: u32, w: f32, j: u32) -> bool {
    if (i == NONE) {
        return false;
    }
    if (j == NONE) {
        return true;
    }
    if (a != b) {
        return a > b;
    }
    if (a == 1u && v != w) {
        return v > w;
    }
    return i < j;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    let base = r * p.vocab;
    let tb = p.timestamp_begin;
    let ru = Rule(rules[8u * r], rules[8u * r + 1u], rules[8u * r + 2u], rules[8u * r + 3u],
                  rules[8u * r + 4u]);
    let raw = (ru.flags & RAW) != 0u;

    var all = Found(0u, 0.0);
    var text = Found(0u, 0.0);
    var ts = Found(0u, 0.0);
    var bad = 0u;
    for (var t = lid; t < p.vocab; t += WG) {
        let x = logits[base + t];
        if ((bitcast<u32>(x) & EXPONENT) == EXPONENT) {
            bad = 1u;
        }
        if (allowed(t, x, ru)) {
            let here = Found(1u, x);
            all = max_found(all, here);
            if (t < tb) {
                text = max_found(text, here);
            } else {
                ts = max_found(ts, here);
            }
        }
    }
    all = reduce_max(lid, all);
    text = reduce_max(lid, text);
    ts = reduce_max(lid, ts);
    sf[lid] = bad;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            sf[lid] = max(sf[lid], sf[lid + s]);
        }
        workgroupBarrier();
    }
    bad = sf[0];
    workgroupBarrier();

    var s_all = 0.0;
    var s_ts = 0.0;
    for (var t = lid; t < p.vocab; t += WG) {
        let x = logits[base + t];
        if (allowed(t, x, ru)) {
            s_all += exp(x - all.v);
            if (t >= tb) {
                s_ts += exp(x - ts.v);
            }
        }
    }
    s_all = reduce_sum(lid, s_all);
    s_ts = reduce_sum(lid, s_ts);
    let ts_lse = ts.v + log(s_ts);
    let ban_text = p.timestamps == 1u && !raw && ts.f == 1u && (text.f == 0u || ts_lse > text.v);
    var lse = all.v + log(s_all);
    if (ban_text) {
        lse = ts_lse;
    }

    let words = 2u + 2u * p.k;
    if (lid == 0u) {
        var probe = p.neg_inf_bits;
        if (ru.probe < p.vocab) {
            let x = logits[base + ru.probe];
            if (allowed(ru.probe, x, ru) && !(ban_text && ru.probe < tb)) {
                probe = bitcast<u32>(x - lse);
            }
        }
        out[r * words] = probe;
        out[r * words + 1u] = bad;
    }

    // Pick after pick: the best token after the previous pick in the order.
    var pa = 0u;
    var pv = 0.0;
    var pi = NONE;
    for (var n = 0u; n < p.k; n++) {
        var ba = 0u;
        var bv = 0.0;
        var bi = NONE;
        for (var t = lid; t < p.vocab; t += WG) {
            let x = logits[base + t];
            var a = 0u;
            if (allowed(t, x, ru) && !(ban_text && t < tb)) {
                a = 1u;
            }
            let after = n == 0u || before(pa, pv, pi, a, x, t);
            if (after && before(a, x, t, ba, bv, bi)) {
                ba = a;
                bv = x;
                bi = t;
            }
        }
        sf[lid] = ba;
        sv[lid] = bv;
        si[lid] = bi;
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (lid < s && before(sf[lid + s], sv[lid + s], si[lid + s], sf[lid], sv[lid], si[lid])) {
                sf[lid] = sf[lid + s];
                sv[lid] = sv[lid + s];
                si[lid] = si[lid + s];
            }
            workgroupBarrier();
        }
        pa = sf[0];
        pv = sv[0];
        pi = si[0];
        workgroupBarrier();
        if (lid == 0u) {
            var lp = p.neg_inf_bits;
            if (pa == 1u) {
                lp = bitcast<u32>(pv - lse);
            }
            out[r * words + 2u + 2u * n] = pi;
            out[r * words + 3u + 2u * n] = lp;
        }
    }
}
