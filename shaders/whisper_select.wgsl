// whisper_select: Whisper's choice of the next token for each row of logits
// (CPU twin: cpu::whisper::whisper_select), so a decoder step reads back a
// few words a row instead of the whole vocabulary. The second half: it
// merges the parts whisper_select_part wrote for the row's chunks
// (whisper_select_common.wgsl says which tokens a row allows). With
// timestamps on and not RAW (openai-whisper's last filter): when the
// timestamps' log-sum-exp beats the best allowed text logit, every text
// token is banned too, and the row's log-sum-exp is the timestamps'; else
// it is over every allowed token. Picks: the k first tokens in the order
// (allowed first, logit descending, id ascending; then the others by id);
// a banned pick has log probability -inf.
// bindings: 0-3 whisper_select_common.wgsl, 4 part: array<u32> (read),
//           5 out: array<u32> [rows, 4 + 2k] (read_write): the probe's log
//           probability bits (-inf when banned or none), flags (1: the
//           row's logits hold a NaN or an infinity; 2: text banned by the
//           timestamp rule), the log-sum-exp and the maximum over the
//           tokens left (f32 bits; -inf when none is), then k pairs (token,
//           log probability bits), best first
// dispatch: (rows, 1, 1) workgroups of 256 threads, workgroup r on row r:
// thread i takes chunks i, i + 256, ...; tree reductions in workgroup
// memory (maxima, sums, one a pick: each thread offers the best entry of
// its chunks' sorted lists after the previous pick). Infinities are never
// computed with (drivers may assume values finite): a maximum carries a
// "found" flag, and -inf is written from its bits (params.neg_inf_bits).

@group(0) @binding(4) var<storage, read> part: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;

var<workgroup> sf: array<u32, 256>;
var<workgroup> sg: array<u32, 256>;

// A value with a flag: found (1) or none (0).
struct Found { f: u32, v: f32 }

fn max_found(a: Found, b: Found) -> Found {
    if (b.f == 1u && (a.f == 0u || b.v > a.v)) {
        return b;
    }
    return a;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    let ru = rule(r);
    let tb = p.timestamp_begin;
    let raw = (ru.flags & RAW) != 0u;
    let pw = part_words();
    let row_at = r * p.chunks * pw;

    var text = Found(0u, 0.0);
    var ts = Found(0u, 0.0);
    var bad = 0u;
    for (var c = lid; c < p.chunks; c += WG) {
        let at = row_at + c * pw;
        let f = part[at];
        bad |= f & NONFINITE;
        if ((f & FOUND) != 0u) {
            let here = Found(1u, bitcast<f32>(part[at + 1u]));
            if (c < p.text_chunks) {
                text = max_found(text, here);
            } else {
                ts = max_found(ts, here);
            }
        }
    }
    sf[lid] = text.f;
    sv[lid] = text.v;
    sg[lid] = ts.f;
    sw[lid] = ts.v;
    si[lid] = bad;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let a = max_found(Found(sf[lid], sv[lid]), Found(sf[lid + s], sv[lid + s]));
            sf[lid] = a.f;
            sv[lid] = a.v;
            let b = max_found(Found(sg[lid], sw[lid]), Found(sg[lid + s], sw[lid + s]));
            sg[lid] = b.f;
            sw[lid] = b.v;
            si[lid] |= si[lid + s];
        }
        workgroupBarrier();
    }
    text = Found(sf[0], sv[0]);
    ts = Found(sg[0], sw[0]);
    bad = si[0];
    let all = max_found(text, ts);
    workgroupBarrier();

    // Each chunk's sum, moved from its own maximum to the row's.
    var s_all = 0.0;
    var s_ts = 0.0;
    for (var c = lid; c < p.chunks; c += WG) {
        let at = row_at + c * pw;
        if ((part[at] & FOUND) != 0u) {
            let m = bitcast<f32>(part[at + 1u]);
            let sum = bitcast<f32>(part[at + 2u]);
            s_all += sum * exp(m - all.v);
            if (c >= p.text_chunks) {
                s_ts += sum * exp(m - ts.v);
            }
        }
    }
    let sums = workgroup_sums(lid, s_all, s_ts);
    s_all = sums.x;
    s_ts = sums.y;
    let ts_lse = ts.v + log(s_ts);
    let ban_text = p.timestamps == 1u && !raw && ts.f == 1u && (text.f == 0u || ts_lse > text.v);
    var lse = all.v + log(s_all);
    var top = all;
    if (ban_text) {
        lse = ts_lse;
        top = ts;
    }

    let words = 4u + 2u * p.k;
    let o = r * words;
    if (lid == 0u) {
        var probe = p.neg_inf_bits;
        if (ru.probe < p.vocab) {
            let x = logits[r * p.vocab + ru.probe];
            if (allowed(ru.probe, x, ru) && !(ban_text && ru.probe < tb)) {
                probe = bitcast<u32>(x - lse);
            }
        }
        var flags = 0u;
        if (bad != 0u) {
            flags |= DAMAGED;
        }
        if (ban_text) {
            flags |= BAN_TEXT;
        }
        out[o] = probe;
        out[o + 1u] = flags;
        if (top.f == 1u) {
            out[o + 2u] = bitcast<u32>(lse);
            out[o + 3u] = bitcast<u32>(top.v);
        } else {
            out[o + 2u] = p.neg_inf_bits;
            out[o + 3u] = p.neg_inf_bits;
        }
    }

    // Pick after pick among the chunks left: each chunk's list is sorted,
    // so its first entry after the previous pick is its best one left.
    var first = 0u;
    if (ban_text) {
        first = p.text_chunks;
    }
    var pv = 0.0;
    var pi = NONE;
    var taken = 0u;
    for (var n = 0u; n < p.k; n++) {
        var bv = 0.0;
        var bi = NONE;
        for (var c = first + lid; c < p.chunks; c += WG) {
            let at = row_at + c * pw + 4u;
            for (var j = 0u; j < p.k; j++) {
                let t = part[at + 2u * j];
                if (t == NONE) {
                    break;
                }
                let v = bitcast<f32>(part[at + 2u * j + 1u]);
                if (n == 0u || before(pv, pi, v, t)) {
                    if (before(v, t, bv, bi)) {
                        bv = v;
                        bi = t;
                    }
                    break;
                }
            }
        }
        let best = workgroup_best(lid, bv, bi);
        pv = best.v;
        pi = best.i;
        if (pi != NONE) {
            taken = n + 1u;
            if (lid == 0u) {
                out[o + 4u + 2u * n] = pi;
                out[o + 5u + 2u * n] = bitcast<u32>(pv - lse);
            }
        }
    }
    // Fewer than k tokens left: the others by id (at most k + taken ids
    // are looked at, since fewer than k are allowed).
    if (lid == 0u && taken < p.k) {
        var n = taken;
        var t = 0u;
        while (n < p.k && t < p.vocab) {
            let x = logits[r * p.vocab + t];
            if (!(allowed(t, x, ru) && !(ban_text && t < tb))) {
                out[o + 4u + 2u * n] = t;
                out[o + 5u + 2u * n] = p.neg_inf_bits;
                n++;
            }
            t++;
        }
    }
}
