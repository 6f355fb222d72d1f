// prefill_attention: causal grouped-query attention of n_q new queries
// against the key/value caches on cooperative matrices, for prefill (the
// decode kernel, flash_attention, runs one workgroup per query and group of
// query heads and reads every key once per query). kv_len = step[2] positions are cached;
// query t sees the first kv_len - n_q + t + 1, or of those the last p.window
// when it is set.
//
// One workgroup per 64 queries of one head; each of its 4 subgroups owns 16
// queries. Keys and values are staged in blocks of 32 as f16 in workgroup
// memory, shared by the 4 subgroups; each thread loads its share of the
// next block into registers before the multiplies of this one (BENCHMARKS.md,
// thirty-eighth session). Two passes over the visible blocks: the first
// finds each query's largest score m and l = sum exp(s - m); the second
// sums (exp(s - m) / l) * v, so the output sums are final as they accumulate
// (a one-pass online softmax would rescale them per block, which
// cooperative matrices cannot do in place). Scores Q K^T and the sums P V
// are 16x16x16 products with f16 inputs (q pre-scaled, k, v, p rounded to
// f16) and f32 sums; the softmax runs in f32.
//
// Needs COOP (with F16 and SUBGROUPS, subgroups of 32); head_dim 64.
// bindings: 0 params (attention_params.wgsl), 1 q: [n_q, heads * hd],
//           2 kc, 3 vc: [positions, kv_stride] (read as vec4s: kv_stride
//           and the head offsets are multiples of 64),
//           4 step: array<u32> [token, pos0, kv_len, splits],
//           5 out: [n_q, heads * hd] (read_write)
// dispatch: (ceil(n_q / 64), heads, 1) workgroups of 128 threads
// ROWS (prefill_attention_rows, batched prefill): the n_q queries are the
//   prompt chunks of several sequences one after another, each over its own
//   slot of the caches. Query t's record (step[8 t ..],
//   gpu::llm_ops::ROW_RECORD) gives its position (step[8 t + 1]), where
//   its sequence's block table starts in step (step[8 t + 4],
//   paged_cache.wgsl) and its sequence's past-last
//   query (step[8 t + 7]). Workgroup x takes the 64 queries (fewer at a
//   sequence's end) that start at query step[8 n_q + x] (0xffffffff: none),
//   a block never crossing sequences, so each query sees the blocks of keys
//   it sees when its sequence's chunk runs alone (keys a query does not see
//   are masked to exact zeros either way).

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> step: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const HD: u32 = 64u;
const QB: u32 = 64u; // queries per workgroup
const KB: u32 = 32u; // keys per block
// Row strides in workgroup memory, padded (16-byte multiples for the
// cooperative loads and stores; the padding spreads rows over banks).
const LD: u32 = 72u;  // f16 rows of HD
const LDS: u32 = 36u; // f32 score rows of KB
const LDP: u32 = 40u; // f16 probability rows of KB
// A finite "minus infinity": exp(NEG - m) is 0, never NaN.
const NEG: f32 = -1.0e30;

// Q of the workgroup's 64 queries first; then keys in rows 0..KB-1 and
// values in rows KB..2KB-1.
var<workgroup> kvs: array<f16, 4608>;  // [QB][LD]
var<workgroup> ss: array<f32, 2304>;   // per subgroup [16][LDS]: scores, then output blocks
var<workgroup> ps: array<f16, 2560>;   // per subgroup [16][LDP]: probabilities

// Whether key position j is visible to a query whose last position is vis
// (causal, and inside the sliding window when p.window is set).
fn visible(j: u32, vis: u32) -> bool {
    return j <= vis && (p.window == 0u || j + p.window > vis);
}

// A thread's share of one block of keys or values: 4 of its rows (lid / 16
// + 8 i), 4 values each (from (lid % 16) 4), loaded together so their
// latencies overlap, and for the next block while this one is multiplied.
struct Rows {
    a: vec4<f32>,
    b: vec4<f32>,
    c: vec4<f32>,
    d: vec4<f32>,
}

// Row j of a cache (keys: cache 0) at value c of kv head `kvo`, zeros past
// kv_len. `table`: where the sequence's block table starts in step (ROWS).
fn cache4(cache: u32, j: u32, kv_len: u32, table: u32, kvo: u32, c: u32) -> vec4<f32> {
    if (j >= kv_len) {
        return vec4<f32>();
    }
#if ROWS
    let b = cache_row(table, j) * p.kv_stride + kvo + c;
#else
    let b = j * p.kv_stride + kvo + c;
#endif
    if (cache == 0u) {
        return kc[b / 4u];
    }
    return vc[b / 4u];
}

// This thread's share of the KB rows (keys or values) from position j0.
fn load_rows(cache: u32, j0: u32, kv_len: u32, table: u32, kvo: u32, lid: u32) -> Rows {
    // 128 threads, 16 per row of 64 (four values each), 8 rows a round.
    let c = (lid & 15u) * 4u;
    let j = j0 + (lid >> 4u);
    return Rows(cache4(cache, j, kv_len, table, kvo, c),
                cache4(cache, j + 8u, kv_len, table, kvo, c),
                cache4(cache, j + 16u, kv_len, table, kvo, c),
                cache4(cache, j + 24u, kv_len, table, kvo, c));
}

fn store4(o: u32, v: vec4<f32>) {
    kvs[o] = f16(v.x);
    kvs[o + 1u] = f16(v.y);
    kvs[o + 2u] = f16(v.z);
    kvs[o + 3u] = f16(v.w);
}

// Stages a thread's share (load_rows) into kvs from row `at`, as f16.
fn store_rows(rows: Rows, at: u32, lid: u32) {
    let o = (at + (lid >> 4u)) * LD + (lid & 15u) * 4u;
    store4(o, rows.a);
    store4(o + 8u * LD, rows.b);
    store4(o + 16u * LD, rows.c);
    store4(o + 24u * LD, rows.d);
}

// Scores of the subgroup's 16 queries (qa0..qa3: 16 dimensions each)
// against the 32 staged keys, into its rows of ss from `is0`.
fn scores(qa0: coop_mat16x16<f16, A>, qa1: coop_mat16x16<f16, A>,
          qa2: coop_mat16x16<f16, A>, qa3: coop_mat16x16<f16, A>, is0: u32) {
    // Every index and stride a `let` of its own (naga's SPIR-V writer
    // wants the cooperative operations' pointers built from named values).
    let ld = LD;
    let lds = LDS;
    for (var n0 = 0u; n0 < KB; n0 += 16u) {
        let ik0 = n0 * LD;
        let ik1 = ik0 + 16u;
        let ik2 = ik0 + 32u;
        let ik3 = ik0 + 48u;
        let is = is0 + n0;
        var s = coop_mat16x16<f32, C>();
        s = coopMultiplyAdd(qa0, coopLoad<coop_mat16x16<f16, B>>(&kvs[ik0], ld), s);
        s = coopMultiplyAdd(qa1, coopLoad<coop_mat16x16<f16, B>>(&kvs[ik1], ld), s);
        s = coopMultiplyAdd(qa2, coopLoad<coop_mat16x16<f16, B>>(&kvs[ik2], ld), s);
        s = coopMultiplyAdd(qa3, coopLoad<coop_mat16x16<f16, B>>(&kvs[ik3], ld), s);
        coopStoreT(s, &ss[is], lds);
    }
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let h = wid.y;
    let kvo = (h / (p.heads / p.kv_heads)) * HD;
#if ROWS
    let q0 = step[8u * p.n_q + wid.x];
    if (q0 == 0xffffffffu) {
        return;
    }
    let q_end = min(q0 + QB, step[8u * q0 + 7u]);
    let table = step[8u * q0 + 4u];
    // The position of the workgroup's first query.
    let base = step[8u * q0 + 1u];
    let kv_len = base + q_end - q0;
#else
    let kv_len = step[2];
    let q0 = wid.x * QB;
    let q_end = min(q0 + QB, p.n_q);
    let table = 0u;
    let base = kv_len - p.n_q + q0;
#endif
    // Blocks any query of the workgroup sees. Cooperative operations need
    // workgroup-uniform control flow, so every subgroup runs every block
    // (keys past a row's last position are masked) and subgroups past the
    // workgroup's queries compute rows that are never written.
    let blocks = (base + q_end - q0 + KB - 1u) / KB;
    let t0 = q0 + sg * 16u;

    // Q, scaled, rounded to f16; rows past n_q are zeros.
    let qc = (lid & 15u) * 4u;
    for (var r = lid >> 4u; r < QB; r += 8u) {
        let t = q0 + r;
        var v = vec4<f32>();
        if (t < q_end) {
            let b = (t * p.heads + h) * HD + qc;
            v = vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]) * p.scale;
        }
        let o = r * LD + qc;
        kvs[o] = f16(v.x);
        kvs[o + 1u] = f16(v.y);
        kvs[o + 2u] = f16(v.z);
        kvs[o + 3u] = f16(v.w);
    }
    workgroupBarrier();
    let ld = LD;
    let lds = LDS;
    let ldp = LDP;
    let iq0 = sg * 16u * LD;
    let iq1 = iq0 + 16u;
    let iq2 = iq0 + 32u;
    let iq3 = iq0 + 48u;
    let qa0 = coopLoadT<coop_mat16x16<f16, A>>(&kvs[iq0], ld);
    let qa1 = coopLoadT<coop_mat16x16<f16, A>>(&kvs[iq1], ld);
    let qa2 = coopLoadT<coop_mat16x16<f16, A>>(&kvs[iq2], ld);
    let qa3 = coopLoadT<coop_mat16x16<f16, A>>(&kvs[iq3], ld);
    workgroupBarrier();

    // This lane's query row within the subgroup, and which half of a block's
    // 32 keys it reads.
    let r = lane >> 1u;
    let half = (lane & 1u) * 16u;
    let vis = base + t0 - q0 + r; // last position row r sees
    let is0 = sg * 16u * LDS;
    let ip0 = sg * 16u * LDP;

    // Pass 1: m and l of every row.
    var m = NEG;
    var l = 0.0;
    var keys = load_rows(0u, 0u, kv_len, table, kvo, lid);
    for (var b = 0u; b < blocks; b++) {
        let j0 = b * KB;
        store_rows(keys, 0u, lid);
        workgroupBarrier();
        keys = load_rows(0u, j0 + KB, kv_len, table, kvo, lid);
        scores(qa0, qa1, qa2, qa3, is0);
        workgroupBarrier();
        var bm = NEG;
        for (var i = 0u; i < 16u; i++) {
            let j = j0 + half + i;
            bm = max(bm, select(NEG, ss[is0 + r * LDS + half + i], visible(j, vis)));
        }
        bm = max(bm, subgroupShuffleXor(bm, 1u));
        let m_new = max(m, bm);
        var bl = 0.0;
        for (var i = 0u; i < 16u; i++) {
            let j = j0 + half + i;
            bl += select(0.0, exp(ss[is0 + r * LDS + half + i] - m_new), visible(j, vis));
        }
        bl += subgroupShuffleXor(bl, 1u);
        l = l * exp(m - m_new) + bl;
        m = m_new;
    }
    let inv_l = 1.0 / l;

    // Pass 2: the output sums.
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    // Values: keys 0..15 and 16..31 of the block, 16 dimensions at a time.
    let iv00 = KB * LD;
    let iv01 = iv00 + 16u;
    let iv02 = iv00 + 32u;
    let iv03 = iv00 + 48u;
    let iv10 = (KB + 16u) * LD;
    let iv11 = iv10 + 16u;
    let iv12 = iv10 + 32u;
    let iv13 = iv10 + 48u;
    let ip1 = ip0 + 16u;
    keys = load_rows(0u, 0u, kv_len, table, kvo, lid);
    var values = load_rows(1u, 0u, kv_len, table, kvo, lid);
    for (var b = 0u; b < blocks; b++) {
        let j0 = b * KB;
        workgroupBarrier(); // the last block's values are read
        store_rows(keys, 0u, lid);
        store_rows(values, KB, lid);
        workgroupBarrier();
        keys = load_rows(0u, j0 + KB, kv_len, table, kvo, lid);
        values = load_rows(1u, j0 + KB, kv_len, table, kvo, lid);
        scores(qa0, qa1, qa2, qa3, is0);
        workgroupBarrier();
        for (var i = 0u; i < 16u; i++) {
            let j = j0 + half + i;
            let pr = select(0.0, exp(ss[is0 + r * LDS + half + i] - m) * inv_l, visible(j, vis));
            ps[ip0 + r * LDP + half + i] = f16(pr);
        }
        workgroupBarrier();
        let pa0 = coopLoadT<coop_mat16x16<f16, A>>(&ps[ip0], ldp);
        let pa1 = coopLoadT<coop_mat16x16<f16, A>>(&ps[ip1], ldp);
        o0 = coopMultiplyAdd(pa0, coopLoadT<coop_mat16x16<f16, B>>(&kvs[iv00], ld), o0);
        o0 = coopMultiplyAdd(pa1, coopLoadT<coop_mat16x16<f16, B>>(&kvs[iv10], ld), o0);
        o1 = coopMultiplyAdd(pa0, coopLoadT<coop_mat16x16<f16, B>>(&kvs[iv01], ld), o1);
        o1 = coopMultiplyAdd(pa1, coopLoadT<coop_mat16x16<f16, B>>(&kvs[iv11], ld), o1);
        o2 = coopMultiplyAdd(pa0, coopLoadT<coop_mat16x16<f16, B>>(&kvs[iv02], ld), o2);
        o2 = coopMultiplyAdd(pa1, coopLoadT<coop_mat16x16<f16, B>>(&kvs[iv12], ld), o2);
        o3 = coopMultiplyAdd(pa0, coopLoadT<coop_mat16x16<f16, B>>(&kvs[iv03], ld), o3);
        o3 = coopMultiplyAdd(pa1, coopLoadT<coop_mat16x16<f16, B>>(&kvs[iv13], ld), o3);
    }

    // Each 16 x 16 output block through the subgroup's score rows to out:
    // 8 values a lane, row lane / 2, columns (lane & 1) * 8 + i.
    let t = t0 + r;
    let ob = (t * p.heads + h) * HD + (lane & 1u) * 8u;
    let sb = is0 + r * LDS + (lane & 1u) * 8u;
    for (var c = 0u; c < 4u; c++) {
        workgroupBarrier();
        switch c {
            case 0u: { coopStoreT(o0, &ss[is0], lds); }
            case 1u: { coopStoreT(o1, &ss[is0], lds); }
            case 2u: { coopStoreT(o2, &ss[is0], lds); }
            default: { coopStoreT(o3, &ss[is0], lds); }
        }
        workgroupBarrier();
        if (t < q_end) {
            for (var i = 0u; i < 8u; i++) {
                out[ob + c * 16u + i] = ss[sb + i];
            }
        }
    }
}
