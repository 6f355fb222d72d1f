// flash_attention: causal grouped-query attention of n_q new queries against
// the key/value caches, in one pass with an online softmax (running max m,
// running sum l). kv_len = step[2] positions are cached; query t sees the
// first kv_len - n_q + t + 1, or of those the last p.window when it is set. For decode the positions are split over
// `splits` = step[3] workgroups per head (flash-decode): with one split the
// result goes straight to out, otherwise each split writes its unnormalised
// sums and (m, l) to part and flash_attention_merge combines them.
// bindings: 0 params (attention_params.wgsl), 1 q: [n_q, heads * hd],
//           2 kc, 3 vc: [positions, kv_stride],
//           4 step: array<u32> [token, pos0, kv_len, splits],
//           5 out: [n_q, heads * hd], 6 part: [n_q, heads, splits, hd + 2]
//           (out, part read_write)
// dispatch: (splits, heads / GQ, n_q) workgroups of 64 threads; hd <= 256
// GQ (override): the query heads of one key head a workgroup computes
//   together, a divisor of heads / kv_heads of at most GMAX: each key and
//   value is loaded once for all of them (decode attention reads its cache
//   once per key head, not once per query head). Each head's sums are those
//   of a workgroup of its own.
// variants: SUBGROUPS reduces with subgroup ops, otherwise a shared-memory tree.
// K4 (hd a multiple of 4): the keys are read a vec4 at a time.
// ROWS (flash_attention_rows, batched decode): query t (n_q of them) is one
//   decode row of its own sequence, whose row record (step[8 t ..],
//   gpu::llm_ops::ROW_RECORD) gives its kv_len, its splits and where its
//   sequence's block table starts in step (paged_cache.wgsl); the dispatch has the most splits of any row (workgroups
//   past a row's own return at once) and part keeps p.part_splits (the most
//   any row may have) per head: [n_q, heads, part_splits, hd + 2]. Each row computes what the single
//   kernel computes for it alone.
// PREP (flash_attention_prep, decode of one token): qk_rope.wgsl's work done
//   here, so a token's attention is one dispatch (plus the merge) instead
//   of two. Binding 1 is the projections' row qkv ([q | k | v], as
//   qk_rope.wgsl reads it) instead of q; each workgroup makes its GQ query
//   heads and its key head from it (BIAS, QK_NORM, RoPE: qk_rope.wgsl's
//   arithmetic), and the one split that holds the new position
//   (kv_len - 1) writes key and value to the caches and reads them back
//   from there like every other position (a storage barrier between: the
//   only workgroup that reads that row is the one that wrote it). GQ must be all
//   the query heads of a key head, so that one workgroup a split writes
//   each cache row. Extra bindings: 7 prep = [q norm weights (hd) | k norm
//   weights (hd) | qkv bias (qkv_stride)], the parts the defines use, in
//   that order; 8 cs = [half, 2] cos/sin of the new position.

#if PREP
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
#if K4
@group(0) @binding(2) var<storage, read_write> kc: array<vec4<f32>>;
#else
@group(0) @binding(2) var<storage, read_write> kc: array<f32>;
#endif
@group(0) @binding(3) var<storage, read_write> vc: array<f32>;
#else
@group(0) @binding(1) var<storage, read> q: array<f32>;
#if K4
@group(0) @binding(2) var<storage, read> kc: array<vec4<f32>>;
#else
@group(0) @binding(2) var<storage, read> kc: array<f32>;
#endif
@group(0) @binding(3) var<storage, read> vc: array<f32>;
#endif
@group(0) @binding(4) var<storage, read> step: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> part: array<f32>;
#if PREP
@group(0) @binding(7) var<storage, read> prep: array<f32>;
@group(0) @binding(8) var<storage, read> cs: array<f32>;
#endif

const WG: u32 = 64u;
// A finite "minus infinity": exp(NEG - NEG) stays 1, never NaN.
const NEG: f32 = -1.0e30;
override GQ: u32 = 1u;
const GMAX: u32 = 8u;

// Head g's query at qs[g * hd ..], its probabilities at ps[g * WG ..].
// PREP: the new key after the queries, and its sum of squares in red.
#if PREP
var<workgroup> qs: array<f32, 256u * (GQ + 1u)>;
var<workgroup> red: array<f32, WG * (GQ + 1u)>;
#else
var<workgroup> qs: array<f32, 256u * GQ>;
var<workgroup> red: array<f32, WG * GQ>;
#endif
var<workgroup> ps: array<f32, WG * GQ>;
#if ROWS
// The cache row of each key of the block being summed.
var<workgroup> krow: array<u32, 64>;
#endif

// Dimensions d..d+3 of a key, at `at` in the key cache (K4: a multiple of 4).
fn key4(at: u32) -> vec4<f32> {
#if K4
    return kc[at / 4u];
#else
    return vec4<f32>(kc[at], kc[at + 1u], kc[at + 2u], kc[at + 3u]);
#endif
}

fn key1(at: u32) -> f32 {
#if K4
    return kc[at / 4u][at % 4u];
#else
    return kc[at];
#endif
}

// Four neighbouring query values (qs) and probabilities (ps) from `at`.
fn q4(at: u32) -> vec4<f32> {
    return vec4<f32>(qs[at], qs[at + 1u], qs[at + 2u], qs[at + 3u]);
}

fn p4(at: u32) -> vec4<f32> {
    return vec4<f32>(ps[at], ps[at + 1u], ps[at + 2u], ps[at + 3u]);
}

// Where dimension `vo` of the value of key j0 + jj is in the value cache.
fn value_at(j0: u32, jj: u32, vo: u32) -> u32 {
#if ROWS
    return krow[jj] * p.kv_stride + vo;
#else
    return (j0 + jj) * p.kv_stride + vo;
#endif
}

// Dimension `vo` of the values of keys j0 + jj .. j0 + jj + 3.
fn value4(j0: u32, jj: u32, vo: u32) -> vec4<f32> {
    return vec4<f32>(vc[value_at(j0, jj, vo)], vc[value_at(j0, jj + 1u, vo)],
                     vc[value_at(j0, jj + 2u, vo)], vc[value_at(j0, jj + 3u, vo)]);
}

// Each head's max (or sum) of v over the workgroup, in the same order for
// every head as for one.
fn wg_reduce(v: array<f32, GMAX>, lid: u32, is_max: bool
#if SUBGROUPS
             , sid: u32, ssize: u32
#endif
) -> array<f32, GMAX> {
    var r: array<f32, GMAX>;
#if SUBGROUPS
    for (var g = 0u; g < GQ; g++) {
        var s: f32;
        if (is_max) {
            s = subgroupMax(v[g]);
        } else {
            s = subgroupAdd(v[g]);
        }
        if (sid == 0u) {
            red[g * WG + lid / ssize] = s;
        }
    }
    workgroupBarrier();
    for (var g = 0u; g < GQ; g++) {
        var x = red[g * WG];
        for (var i = 1u; i < (WG + ssize - 1u) / ssize; i++) {
            if (is_max) {
                x = max(x, red[g * WG + i]);
            } else {
                x += red[g * WG + i];
            }
        }
        r[g] = x;
    }
#else
    for (var g = 0u; g < GQ; g++) {
        red[g * WG + lid] = v[g];
    }
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            for (var g = 0u; g < GQ; g++) {
                let at = g * WG + lid;
                if (is_max) {
                    red[at] = max(red[at], red[at + st]);
                } else {
                    red[at] += red[at + st];
                }
            }
        }
        workgroupBarrier();
    }
    for (var g = 0u; g < GQ; g++) {
        r[g] = red[g * WG];
    }
#endif
    workgroupBarrier();
    return r;
}

#if PREP
// Dimensions of a head a thread takes (lid + c WG, c < CHUNKS) and rotated
// pairs (c < PAIR_CHUNKS): constant trip counts, so that the loops unroll
// and each thread's loads are in flight together.
const CHUNKS: u32 = 256u / WG;
const PAIR_CHUNKS: u32 = 128u / WG;

// qk_rope.wgsl's work for the new token: query heads h0 .. h0 + GQ into qs,
// key head kh after them and, when `with_key`, that key and its value into
// cache row `pos`. Bias, norm and rotation as qk_rope.wgsl does them, each
// head's sum of squares in the same tree.
fn prepare(h0: u32, kh: u32, lid: u32, with_key: bool, pos: u32) {
    let hd = p.hd;
    let kvw = p.kv_heads * hd;
    var bias_at = 0u;
#if QK_NORM
    bias_at = 2u * hd;
#endif
    for (var g = 0u; g <= GQ; g++) {
        // Query head h0 + g, or (g = GQ) key head kh, in the qkv row.
        let col = select(p.heads * hd + kh * hd, (h0 + g) * hd, g < GQ);
        var ss = 0.0;
        for (var c = 0u; c < CHUNKS; c++) {
            let d = lid + c * WG;
            if (d < hd) {
                var v = qkv[col + d];
#if BIAS
                v += prep[bias_at + col + d];
#endif
                qs[g * hd + d] = v;
                ss += v * v;
            }
        }
        red[g * WG + lid] = ss;
    }
    // The value, read now so that its loads overlap the others.
    let vsrc = p.heads * hd + kvw + kh * hd;
    var val = vec4<f32>();
    for (var c = 0u; c < CHUNKS; c++) {
        let d = lid + c * WG;
        if (with_key && d < hd) {
            val[c] = qkv[vsrc + d];
#if BIAS
            val[c] += prep[bias_at + vsrc + d];
#endif
        }
    }
#if QK_NORM
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            for (var g = 0u; g <= GQ; g++) {
                red[g * WG + lid] += red[g * WG + lid + st];
            }
        }
        workgroupBarrier();
    }
    for (var g = 0u; g <= GQ; g++) {
        let scale = 1.0 / sqrt(red[g * WG] / f32(hd) + p.eps);
        // q's weights first in prep, k's after them.
        let nw = select(hd, 0u, g < GQ);
        for (var c = 0u; c < CHUNKS; c++) {
            let d = lid + c * WG;
            if (d < hd) {
                qs[g * hd + d] = prep[nw + d] * (qs[g * hd + d] * scale);
            }
        }
    }
#endif
    workgroupBarrier();
    for (var g = 0u; g <= GQ; g++) {
        for (var c = 0u; c < PAIR_CHUNKS; c++) {
            let i = lid + c * WG;
            if (i < p.half) {
                let cos_i = cs[2u * i];
                let sin_i = cs[2u * i + 1u];
                var a = g * hd + i;
                var b = a + p.half;
                if (p.interleaved != 0u) {
                    a = g * hd + 2u * i;
                    b = a + 1u;
                }
                let x0 = qs[a];
                let x1 = qs[b];
                qs[a] = x0 * cos_i - x1 * sin_i;
                qs[b] = x0 * sin_i + x1 * cos_i;
            }
        }
    }
    workgroupBarrier();
    if (with_key) {
        let dst = pos * kvw + kh * hd;
#if K4
        let d4 = 4u * lid;
        if (d4 < hd) {
            let k0 = GQ * hd + d4;
            kc[(dst + d4) / 4u] = vec4<f32>(qs[k0], qs[k0 + 1u], qs[k0 + 2u], qs[k0 + 3u]);
        }
#else
        for (var c = 0u; c < CHUNKS; c++) {
            let d = lid + c * WG;
            if (d < hd) {
                kc[dst + d] = qs[GQ * hd + d];
            }
        }
#endif
        for (var c = 0u; c < CHUNKS; c++) {
            let d = lid + c * WG;
            if (d < hd) {
                vc[dst + d] = val[c];
            }
        }
    }
    storageBarrier();
}
#endif

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32
#if SUBGROUPS
        , @builtin(subgroup_invocation_id) sid: u32, @builtin(subgroup_size) ssize: u32
#endif
) {
    let s = wid.x;
    let h0 = wid.y * GQ;
    let t = wid.z;
    let hd = p.hd;
#if ROWS
    let kv_len = step[8u * t + 2u];
    let splits = step[8u * t + 3u];
    if (s >= splits) {
        return;
    }
    let table = step[8u * t + 4u];
    let last = kv_len;
#else
    let kv_len = step[2];
    let splits = step[3];
    // Query t sees positions lo..last (its sliding window, or all).
    let last = kv_len - p.n_q + t + 1u;
#endif
    var lo = 0u;
    if (p.window > 0u && last > p.window) {
        lo = last - p.window;
    }
    let visible = last - lo;
    let chunk = (visible + splits - 1u) / splits;
    let start = lo + min(s * chunk, visible);
    let end = min(start + chunk, last);
    let kh = h0 / (p.heads / p.kv_heads);
    let kvo = kh * hd;
#if PREP
    prepare(h0, kh, lid, start < end && end == last, kv_len - 1u);
#else
    for (var g = 0u; g < GQ; g++) {
        for (var d = lid; d < hd; d += WG) {
            qs[g * hd + d] = q[(t * p.heads + h0 + g) * hd + d];
        }
    }
    workgroupBarrier();
#endif
    var m: array<f32, GMAX>;
    var l: array<f32, GMAX>;
    // acc[g][i]: head g's sum for dimension lid + i * WG.
    var acc: array<vec4<f32>, GMAX>;
    for (var g = 0u; g < GQ; g++) {
        m[g] = NEG;
    }
    for (var j0 = start; j0 < end; j0 += WG) {
        let j = j0 + lid;
        var sc: array<f32, GMAX>;
        for (var g = 0u; g < GQ; g++) {
            sc[g] = NEG;
        }
        if (j < end) {
#if ROWS
            let row = cache_row(table, j);
            krow[lid] = row;
#else
            let row = j;
#endif
            let kb = row * p.kv_stride + kvo;
            // Four independent sums a head, so the key loads are in flight
            // together.
            var sd: array<vec4<f32>, GMAX>;
            var d = 0u;
            // Sixteen dimensions a step, their loads issued before the sums
            // (a loop of a step of four, its trip count unknown to the
            // compiler, waited for each step's loads in turn); the sums in
            // the order of four at a time.
            for (; d + 16u <= hd; d += 16u) {
                let k0 = key4(kb + d);
                let k1 = key4(kb + d + 4u);
                let k2 = key4(kb + d + 8u);
                let k3 = key4(kb + d + 12u);
                for (var g = 0u; g < GQ; g++) {
                    let qd = g * hd + d;
                    sd[g] += q4(qd) * k0;
                    sd[g] += q4(qd + 4u) * k1;
                    sd[g] += q4(qd + 8u) * k2;
                    sd[g] += q4(qd + 12u) * k3;
                }
            }
            for (; d + 4u <= hd; d += 4u) {
                let kv4 = key4(kb + d);
                for (var g = 0u; g < GQ; g++) {
                    sd[g] += q4(g * hd + d) * kv4;
                }
            }
            for (; d < hd; d++) {
                let kd = key1(kb + d);
                for (var g = 0u; g < GQ; g++) {
                    sd[g].x += qs[g * hd + d] * kd;
                }
            }
            for (var g = 0u; g < GQ; g++) {
                sc[g] = (sd[g].x + sd[g].y + sd[g].z + sd[g].w) * p.scale;
            }
        }
#if SUBGROUPS
        let top = wg_reduce(sc, lid, true, sid, ssize);
#else
        let top = wg_reduce(sc, lid, true);
#endif
        var m_new: array<f32, GMAX>;
        var pj: array<f32, GMAX>;
        for (var g = 0u; g < GQ; g++) {
            m_new[g] = max(m[g], top[g]);
            pj[g] = select(0.0, exp(sc[g] - m_new[g]), j < end);
            ps[g * WG + lid] = pj[g];
        }
#if SUBGROUPS
        let tsum = wg_reduce(pj, lid, false, sid, ssize);
#else
        let tsum = wg_reduce(pj, lid, false);
#endif
        var corr: array<f32, GMAX>;
        for (var g = 0u; g < GQ; g++) {
            corr[g] = exp(m[g] - m_new[g]);
            l[g] = l[g] * corr[g] + tsum[g];
        }
        let cnt = min(WG, end - j0);
        for (var i = 0u; i < 4u; i++) {
            let d = lid + i * WG;
            if (d < hd) {
                // Four keys per step with independent sums (loads in flight together).
                let vo = kvo + d;
                var a4: array<vec4<f32>, GMAX>;
                var jj = 0u;
                // Sixteen keys a step, loads first (as for the keys above).
                for (; jj + 16u <= cnt; jj += 16u) {
                    let v0 = value4(j0, jj, vo);
                    let v1 = value4(j0, jj + 4u, vo);
                    let v2 = value4(j0, jj + 8u, vo);
                    let v3 = value4(j0, jj + 12u, vo);
                    for (var g = 0u; g < GQ; g++) {
                        let pb = g * WG + jj;
                        a4[g] += p4(pb) * v0;
                        a4[g] += p4(pb + 4u) * v1;
                        a4[g] += p4(pb + 8u) * v2;
                        a4[g] += p4(pb + 12u) * v3;
                    }
                }
                for (; jj + 4u <= cnt; jj += 4u) {
                    let v4 = value4(j0, jj, vo);
                    for (var g = 0u; g < GQ; g++) {
                        a4[g] += p4(g * WG + jj) * v4;
                    }
                }
                for (; jj < cnt; jj++) {
                    let vj = vc[value_at(j0, jj, vo)];
                    for (var g = 0u; g < GQ; g++) {
                        a4[g].x += ps[g * WG + jj] * vj;
                    }
                }
                for (var g = 0u; g < GQ; g++) {
                    acc[g][i] = acc[g][i] * corr[g] + ((a4[g].x + a4[g].y) + (a4[g].z + a4[g].w));
                }
            }
        }
        for (var g = 0u; g < GQ; g++) {
            m[g] = m_new[g];
        }
        workgroupBarrier();
    }
    for (var g = 0u; g < GQ; g++) {
        let h = h0 + g;
        if (splits == 1u) {
            for (var i = 0u; i < 4u; i++) {
                let d = lid + i * WG;
                if (d < hd) {
                    out[(t * p.heads + h) * hd + d] = acc[g][i] / l[g];
                }
            }
        } else {
#if ROWS
            let pb = ((t * p.heads + h) * p.part_splits + s) * (hd + 2u);
#else
            let pb = ((t * p.heads + h) * splits + s) * (hd + 2u);
#endif
            for (var i = 0u; i < 4u; i++) {
                let d = lid + i * WG;
                if (d < hd) {
                    part[pb + d] = acc[g][i];
                }
            }
            if (lid == 0u) {
                part[pb + hd] = m[g];
                part[pb + hd + 1u] = l[g];
            }
        }
    }
}
