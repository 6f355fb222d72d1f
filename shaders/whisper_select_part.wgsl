// whisper_select_part: the first half of whisper_select (CPU twin:
// cpu::whisper::whisper_select, through whisper_select's merge): each
// workgroup takes one chunk of one row (whisper_select_common.wgsl) and
// writes its part: the maximum and the sums of exponentials over the
// chunk's allowed tokens, and its k best allowed tokens.
// bindings: 0-3 whisper_select_common.wgsl, 4 part: array<u32> (read_write)
// dispatch: (chunks, rows, 1) workgroups of 256 threads; thread i takes
// tokens 2i and 2i + 1 of the chunk; tree reductions in workgroup memory,
// one for the maximum, one for the sums, one a pick.

@group(0) @binding(4) var<storage, read_write> part: array<u32>;

var<workgroup> sb: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.x;
    let r = wid.y;
    let range = chunk_range(c);
    let ru = rule(r);
    let base = r * p.vocab;

    // This thread's two tokens, the better first; NONE where there is
    // none or it is not allowed.
    var v0 = 0.0;
    var i0 = NONE;
    var v1 = 0.0;
    var i1 = NONE;
    var bad = 0u;
    for (var e = 0u; e < 2u; e++) {
        let t = range.x + 2u * lid + e;
        if (t < range.y) {
            let x = logits[base + t];
            if ((bitcast<u32>(x) & EXPONENT) == EXPONENT) {
                bad = NONFINITE;
            }
            if (allowed(t, x, ru)) {
                if (before(x, t, v0, i0)) {
                    v1 = v0;
                    i1 = i0;
                    v0 = x;
                    i0 = t;
                } else {
                    v1 = x;
                    i1 = t;
                }
            }
        }
    }

    // The chunk's best (the maximum) and whether anything was non-finite.
    sv[lid] = v0;
    si[lid] = i0;
    sb[lid] = bad;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            if (before(sv[lid + s], si[lid + s], sv[lid], si[lid])) {
                sv[lid] = sv[lid + s];
                si[lid] = si[lid + s];
            }
            sb[lid] |= sb[lid + s];
        }
        workgroupBarrier();
    }
    let found = si[0] != NONE;
    let m = sv[0];
    bad = sb[0];
    workgroupBarrier();

    var s1 = 0.0;
    var st = 0.0;
    let sampling = p.temperature > 0.0;
    if (i0 != NONE) {
        s1 += exp(v0 - m);
        if (sampling) {
            st += exp((v0 - m) / p.temperature);
        }
    }
    if (i1 != NONE) {
        s1 += exp(v1 - m);
        if (sampling) {
            st += exp((v1 - m) / p.temperature);
        }
    }
    let sums = workgroup_sums(lid, s1, st);
    let at = (r * p.chunks + c) * part_words();
    if (lid == 0u) {
        var flags = bad;
        if (found) {
            flags |= FOUND;
        }
        part[at] = flags;
        part[at + 1u] = bitcast<u32>(m);
        part[at + 2u] = bitcast<u32>(sums.x);
        part[at + 3u] = bitcast<u32>(sums.y);
    }

    // Pick after pick: each thread offers its best token not yet taken.
    for (var n = 0u; n < p.k; n++) {
        let best = workgroup_best(lid, v0, i0);
        let pick = best.i;
        if (lid == 0u) {
            part[at + 4u + 2u * n] = pick;
            part[at + 5u + 2u * n] = bitcast<u32>(best.v);
        }
        if (pick != NONE && pick == i0) {
            v0 = v1;
            i0 = i1;
            i1 = NONE;
        }
    }
}
