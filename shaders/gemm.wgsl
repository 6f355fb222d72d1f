// gemm: one weight chunk (any format of quant_formats.wgsl) times n
// activation rows, for prefill: y[t, col(o)] (+)= W[o] . x[t] for o < rows,
// t < n, with one of the epilogues below (every kernel has ADD or NORM).
// Tiles of BN weight rows x BM tokens; each k-step dequantises a BN x BK
// weight tile into workgroup memory once for all BM tokens.
//   gemm_add   ADD: y += ...  (residual add)
//   gemm_norm  NORM: x[t] is RMS-normalised first (LLM prenorm, fused):
//              y[t, col(o)] = (W[o] . (x[t] * nw)) / sqrt(mean(x[t]^2) + eps),
//              the token's scale applied to the sums at the end
//   gemm_norm_swiglu  NORM + SWIGLU: W holds gate and up as its two parts;
//              each tile's BN rows are BN / 2 gate rows and the matching up
//              rows, and y[t, out_off + r] = silu(gate[t, r]) * up[t, r]
//   gemm_norm_geglu  NORM + SWIGLU + GELU: the same with gelu_tanh for silu
//              (dispatch x: ceil(part_rows / (BN / 2)) tiles; gate_act.wgsl)
// A chunk may hold several parts (gate and up; LFM2's B, C, x) of part_rows
// rows each: chunk row o lands in column
//   col(o) = (o / part_rows) * part_stride + out_off + o % part_rows,
// so the parts come out side by side in y's rows ([n, parts * part_stride]).
// bindings: 0 params, 1 w: array<u32> (chunk), 2 x: [n, x_stride] (first k
//           used), NORM: 3 nw: [k]; last: y: [n, y_stride] (read_write)
// dispatch: (ceil(rows / BN), ceil(n / BM), 1) workgroups of 256 threads
//
// SPLIT (gemm_*_split, for GEMMs of few tiles): workgroup z sums only k in
// [z k_span, (z + 1) k_span) and stores its sums as they are (no add, no
// norm scale, no gate) at y[(z n + t) y_stride + col(o)]; with NORM the
// first row tile (of each chunk: the same values) also stores each token's
// sum of squares over its k at y[splits n y_stride + z n + t]. gemm_split_sum.wgsl then adds the
// splits, in order, and finishes the epilogue. SWIGLU stores the gate and
// up sums as two parts. dispatch: (.., .., splits).
//
// COOP (with F16 and SUBGROUPS; the engine enables it where the adapter
// offers 16x16x16 cooperative matrices with f16 inputs and an f32
// accumulator, subgroups of 32, e.g. tensor cores on NVIDIA): the weight and
// activation tiles are rounded to f16 in workgroup memory and each of the 8
// subgroups multiplies a block of the output tile as cooperative matrices
// (one 16 x 16 matrix of a 64 x 32 tile; WIDE: 2 x 2 of a 128 x 64 tile;
// WIDE and BIG: 2 x 4 of a 128 x 128 tile),
// in k-steps of 64 (the portable kernel's are 32), summing in f32. Same
// sums as the portable kernel with every factor rounded to f16 (relative
// 2^-11; activations past f16's range, |x| > 65504, would overflow).
// X4 (COOP only, where k and x's row stride are multiples of 4): x is read
// a vec4 at a time (BENCHMARKS.md, thirty-fifth session). XH (COOP, the
// same rows): x holds the activations as f16 pairs (pack2x16float), read
// four at a time: half the bytes of the loads every row tile repeats (the
// residual stream's copy that gemm_split_sum's SHADOW writes). YH (COOP
// SWIGLU, unsplit; part_rows, out_off and y_stride even): y holds f16 pairs,
// two neighbouring outputs a thread (the down projection then reads them
// with XH).

struct Params {
    k: u32,
    rows: u32,        // rows in this chunk (all parts)
    n: u32,
    x_stride: u32,
    y_stride: u32,
    part_rows: u32,
    part_stride: u32,
    out_off: u32,
    d_off: u32,
    eps: f32,       // NORM
    k_span: u32,    // SPLIT: k per workgroup in z (a multiple of BK)
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
#if X4
@group(0) @binding(2) var<storage, read> x4: array<vec4<f32>>;
#else
#if XH
@group(0) @binding(2) var<storage, read> xh: array<vec2<u32>>;
#else
@group(0) @binding(2) var<storage, read> x: array<f32>;
#endif
#endif
#if NORM
@group(0) @binding(3) var<storage, read> nw: array<f32>;
#if YH
@group(0) @binding(4) var<storage, read_write> y: array<u32>;
#else
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#endif
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#endif

#if WIDE
// 2 x 2 cooperative matrices a subgroup (COOP only); BIG: 2 x 4
const FR: u32 = 2u;
#if BIG
const FT: u32 = 4u;
#else
const FT: u32 = 2u;
#endif
#else
const FR: u32 = 1u;
const FT: u32 = 1u;
#endif
const BN: u32 = 64u * FR;
const BM: u32 = 32u * FT;

// The k this workgroup sums (SPLIT: its span), and where its sums go:
// y's first element for its split.
fn k_begin(z: u32) -> u32 {
#if SPLIT
    return z * p.k_span;
#else
    return 0u;
#endif
}
fn k_end(z: u32) -> u32 {
#if SPLIT
    return min(p.k, (z + 1u) * p.k_span);
#else
    return p.k;
#endif
}
fn split_base(z: u32) -> u32 {
#if SPLIT
    return z * p.n * p.y_stride;
#else
    return 0u;
#endif
}

#if SPLIT
#if NORM
// SPLIT + NORM: the first row tile (of each chunk) stores its tokens' sums
// of squares (tscale holds them unscaled; call after token_scales).
fn store_sums_of_squares(wid: vec3<u32>, lid: u32, tok_base: u32) {
    let tok = tok_base + lid;
    if (wid.x == 0u && lid < BM && tok < p.n) {
        let splits = (p.k + p.k_span - 1u) / p.k_span;
        y[splits * p.n * p.y_stride + wid.z * p.n + tok] = tscale[lid];
    }
}
#endif

#if SWIGLU
// SPLIT + SWIGLU: gate row `row`'s sum and its up row's, as two parts.
fn store_gate_up(z: u32, tok: u32, row: u32, gate: f32, up: f32) {
    let at = split_base(z) + tok * p.y_stride + p.out_off + row;
    y[at] = gate;
    y[at + p.part_stride] = up;
}
#endif
#endif

// The chunk row that row `r` of weight tile `tile` reads (rows past the end
// repeat the last one; their sums are dropped). SWIGLU: BN / 2 gate rows,
// then the matching up rows.
fn weight_row(tile: u32, r: u32) -> u32 {
#if SWIGLU
    const HALF: u32 = BN / 2u;
    return min(tile * HALF + r % HALF, p.part_rows - 1u) + (r / HALF) * p.part_rows;
#else
    return min(tile * BN + r, p.rows - 1u);
#endif
}

#if NORM
// NORM: XL threads share each token's values, 4 of every k-step; their sums
// of squares give the tokens' scales 1 / sqrt(mean + eps).
var<workgroup> tscale: array<f32, BM>;

// NORM: the tokens' scales into tscale from their threads' sums of squares
// in cs[token * XL + i] (every thread calls it, in uniform control flow,
// after storing its sums).
fn token_scales(lid: u32) {
    workgroupBarrier();
    if (lid < BM) {
        var t = 0.0;
        for (var i = 0u; i < XL; i++) {
            t += cs[lid * XL + i];
        }
#if SPLIT
        tscale[lid] = t;
#else
        tscale[lid] = inverseSqrt(t / f32(p.k) + p.eps);
#endif
    }
    workgroupBarrier();
}

// NORM: norm weights e0..e0+3, zero past k.
fn nw4(e0: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (e0 + i < p.k) {
            v[i] = nw[e0 + i];
        }
    }
    return v;
}
#endif

#if COOP
// k per step (the portable kernel's is 32): a step's loads and barriers
// serve twice the multiplies (BENCHMARKS.md, thirty-third session: 32 and
// 128 measured slower). GemmKernel::k_step in llm_ops.rs says the same.
const BK: u32 = 64u;
// Row strides of the tiles in workgroup memory: the f16 tiles padded (the
// coop loads want 16-byte multiples; the padding spreads rows over banks)
// and held as vec4s (LDA / 4 a row). WIDE's f32 output tile is unpadded and
// holds half the tile's tokens at a time (CT; BIG: an eighth, one
// cooperative matrix's 16), as its tiles and output must fit in 48 KiB.
const LDA: u32 = BK + 8u;
const LDA4: u32 = LDA / 4u;
#if WIDE
const LDC: u32 = BN;
#if BIG
const CT: u32 = 16u;
#else
const CT: u32 = BM / 2u;
#endif
#else
const LDC: u32 = BN + 4u;
const CT: u32 = BM;
#endif
// How the 256 threads share a k-step's loads: WL threads a weight row (8
// values each), WP rows a pass, PW passes; XL threads a token (4 values
// each), XP tokens a pass, PX passes.
const WL: u32 = BK / 8u;
const WP: u32 = 256u / WL;
const PW: u32 = BN / WP;
const XL: u32 = BK / 4u;
const XP: u32 = 256u / XL;
const PX: u32 = BM / XP;

var<workgroup> ws: array<vec4<f16>, BN * LDA4>; // [BN][LDA4]: weights, row-major A
var<workgroup> xs: array<vec4<f16>, BM * LDA4>; // [BM][LDA4]: tokens, column-major B
var<workgroup> cs: array<f32, CT * LDC>; // [CT][LDC]: output, column-major C
// NORM's sums of squares pass through cs first (BIG's fill it).
const_assert BM * XL <= CT * LDC;

// The words elements e0..e0+7 of weight row `row` are made from (w8_raw),
// zeros from `end` on (k, or the end of a SPLIT's span).
fn w_tile(row: u32, e0: u32, end: u32) -> W8Raw {
    if (e0 < end) {
        return w8_raw(row, e0, p.k, p.d_off);
    }
    return W8Raw();
}

// Values e0..e0+3 of the activation row starting at `at`, zero from `end` on.
// X4, XH: at, e0 and end are multiples of 4, so the four are all in or all out.
fn x_tile(at: u32, e0: u32, end: u32) -> vec4<f32> {
#if X4
    if (e0 < end) {
        return x4[(at + e0) / 4u];
    }
    return vec4<f32>(0.0);
#else
#if XH
    if (e0 < end) {
        let h = xh[(at + e0) / 4u];
        return vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y));
    }
    return vec4<f32>(0.0);
#else
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (e0 + i < end) {
            v[i] = x[at + e0 + i];
        }
    }
    return v;
#endif
#endif
}

// A thread's share of one k-step: 8 weights of PW rows (r + WP i), 4 values
// of PX tokens (t + XP j), NORM: and the norm weights of those values.
// Neighbouring threads read neighbouring words. The weights are held as
// loaded (w8_raw) and decoded when stored: fewer registers held through the
// multiplies (on the H200, prefill 21% faster with F16 weights, 16% Q8_0).
struct Stage {
    w: array<W8Raw, PW>,
    x: array<vec4<f32>, PX>,
#if NORM
    g: vec4<f32>,
#endif
}

fn load_stage(wrow: array<u32, PW>, we: u32, xat: array<u32, PX>, xe: u32, end: u32) -> Stage {
    var s: Stage;
    for (var i = 0u; i < PW; i++) {
        s.w[i] = w_tile(wrow[i], we, end);
    }
    for (var j = 0u; j < PX; j++) {
        s.x[j] = x_tile(xat[j], xe, end);
    }
#if NORM
    s.g = nw4(xe);
#endif
    return s;
}

// 8 subgroups of 32 in 4 rows x 2 columns, each an FR x FT block of 16 x 16
// cooperative matrices of the output tile. The default (1 x 1) makes many
// small tiles, for GEMMs too small to fill a large GPU otherwise; WIDE
// (2 x 2) uses each fragment loaded from workgroup memory for two multiplies
// and each activation fetched from memory for 128 weight rows (the k-loop's
// global loads, not its multiplies, bound it); BIG (2 x 4) also each weight
// for 128 tokens, twice the multiplies a step. The next k-step's loads are
// issued before this step's multiplies, so their latency overlaps them.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) sg: u32) {
    let row_base = wid.x * BN;
    let tok_base = wid.y * BM;
    let sr = (sg & 3u) * 16u * FR;
    let st = (sg >> 2u) * 16u * FT;
    // This thread's rows and tokens of the tiles (see Stage); tokens past n
    // read token n - 1 (their sums are dropped).
    let wr = lid / WL;
    let wc = (lid % WL) * 8u;
    var wrow: array<u32, PW>;
    for (var i = 0u; i < PW; i++) {
        wrow[i] = weight_row(wid.x, wr + WP * i);
    }
    let xt = lid / XL;
    let xc = (lid % XL) * 4u;
    var xat: array<u32, PX>;
    for (var j = 0u; j < PX; j++) {
        xat[j] = min(tok_base + xt + XP * j, p.n - 1u) * p.x_stride;
    }
    var c00 = coop_mat16x16<f32, C>();
#if WIDE
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
#endif
#if BIG
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
#endif
#if NORM
    var ss: array<f32, PX>;
#endif
    let kb = k_begin(wid.z);
    let ke = k_end(wid.z);
    var v = load_stage(wrow, kb + wc, xat, kb + xc, ke);
    for (var k0 = kb; k0 < ke; k0 += BK) {
        for (var i = 0u; i < PW; i++) {
            let wa = (wr + WP * i) * LDA4 + wc / 4u;
            let wv = w8_unpack(v.w[i]);
            ws[wa] = vec4<f16>(wv.a);
            ws[wa + 1u] = vec4<f16>(wv.b);
        }
        for (var j = 0u; j < PX; j++) {
            var xv = v.x[j];
#if NORM
            ss[j] += dot(xv, xv);
            xv *= v.g;
#endif
            xs[(xt + XP * j) * LDA4 + xc / 4u] = vec4<f16>(xv);
        }
        workgroupBarrier();
        v = load_stage(wrow, k0 + BK + wc, xat, k0 + BK + xc, ke);
        // Every index and stride a `let` of its own.
        let lda = LDA4;
        for (var kk = 0u; kk < BK / 16u; kk++) {
            let ia = sr * LDA4 + kk * 4u;
            let ib = st * LDA4 + kk * 4u;
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&ws[ia], lda);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&xs[ib], lda);
            c00 = coopMultiplyAdd(a0, b0, c00);
#if WIDE
            let ia1 = ia + 16u * LDA4;
            let ib1 = ib + 16u * LDA4;
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&ws[ia1], lda);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&xs[ib1], lda);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
#endif
#if BIG
            let ib2 = ib + 32u * LDA4;
            let ib3 = ib + 48u * LDA4;
            let b2 = coopLoad<coop_mat16x16<f16, B>>(&xs[ib2], lda);
            let b3 = coopLoad<coop_mat16x16<f16, B>>(&xs[ib3], lda);
            c02 = coopMultiplyAdd(a0, b2, c02);
            c03 = coopMultiplyAdd(a0, b3, c03);
            c12 = coopMultiplyAdd(a1, b2, c12);
            c13 = coopMultiplyAdd(a1, b3, c13);
#endif
        }
        workgroupBarrier();
    }
#if NORM
    // The sums of squares go through cs before it holds the output.
    for (var j = 0u; j < PX; j++) {
        cs[(xt + XP * j) * XL + lid % XL] = ss[j];
    }
    token_scales(lid);
#if SPLIT
    store_sums_of_squares(wid, lid, tok_base);
#endif
#endif
    // C stored column-major (cs[t * LDC + r]), CT tokens at a time: the
    // subgroups holding those tokens store them, then the threads below read
    // consecutive rows from consecutive words.
    let ldc = LDC;
    for (var h = 0u; h < BM / CT; h++) {
#if BIG
        // Chunk h is one column of cooperative matrices: the subgroups
        // holding it store their two of it.
        if (h >= st / 16u && h < st / 16u + FT) {
            let j = h - st / 16u;
            let i1 = sr + 16u;
            if (j == 0u) {
                coopStore(c00, &cs[sr], ldc);
                coopStore(c10, &cs[i1], ldc);
            } else if (j == 1u) {
                coopStore(c01, &cs[sr], ldc);
                coopStore(c11, &cs[i1], ldc);
            } else if (j == 2u) {
                coopStore(c02, &cs[sr], ldc);
                coopStore(c12, &cs[i1], ldc);
            } else {
                coopStore(c03, &cs[sr], ldc);
                coopStore(c13, &cs[i1], ldc);
            }
        }
#else
        if (st / CT == h) {
            let i00 = (st - h * CT) * LDC + sr;
            coopStore(c00, &cs[i00], ldc);
#if WIDE
            let i01 = i00 + 16u * LDC;
            let i10 = i00 + 16u;
            let i11 = i01 + 16u;
            coopStore(c01, &cs[i01], ldc);
            coopStore(c10, &cs[i10], ldc);
            coopStore(c11, &cs[i11], ldc);
#endif
        }
#endif
        workgroupBarrier();
        epilogue(wid, lid, row_base, tok_base, h * CT);
        workgroupBarrier();
    }
}

// The output tile's tokens t0 .. t0 + CT, held in cs, into y.
fn epilogue(wid: vec3<u32>, lid: u32, row_base: u32, tok_base: u32, t0: u32) {
#if SWIGLU
    const HALF: u32 = BN / 2u;
#if YH
    // Two neighbouring rows a thread, stored as one f16 pair.
    for (var i = 0u; i < HALF * CT / 512u; i++) {
        let g = lid + 256u * i;
        let r = 2u * (g % (HALF / 2u));
        let t = g / (HALF / 2u);
        let row = wid.x * HALF + r;
        let tok = tok_base + t0 + t;
        if (row < p.part_rows && tok < p.n) {
            let s = tscale[t0 + t];
            let a = gate_act(cs[t * LDC + r] * s) * (cs[t * LDC + r + HALF] * s);
            let b = gate_act(cs[t * LDC + r + 1u] * s) * (cs[t * LDC + r + 1u + HALF] * s);
            y[(tok * p.y_stride + p.out_off + row) / 2u] = pack2x16float(vec2<f32>(a, b));
        }
    }
#else
    for (var i = 0u; i < HALF * CT / 256u; i++) {
        let g = lid + 256u * i;
        let r = g % HALF;
        let t = g / HALF;
        let row = wid.x * HALF + r;
        let tok = tok_base + t0 + t;
        if (row < p.part_rows && tok < p.n) {
#if SPLIT
            store_gate_up(wid.z, tok, row, cs[t * LDC + r], cs[t * LDC + r + HALF]);
#else
            let gate = cs[t * LDC + r] * tscale[t0 + t];
            let up = cs[t * LDC + r + HALF] * tscale[t0 + t];
            y[tok * p.y_stride + p.out_off + row] = gate_act(gate) * up;
#endif
        }
    }
#endif
#else
    for (var i = 0u; i < BN * CT / 256u; i++) {
        let g = lid + 256u * i;
        let r = g % BN;
        let t = g / BN;
        let row = row_base + r;
        let tok = tok_base + t0 + t;
        if (row < p.rows && tok < p.n) {
            let col = (row / p.part_rows) * p.part_stride + p.out_off + row % p.part_rows;
            let at = split_base(wid.z) + tok * p.y_stride + col;
#if SPLIT
            y[at] = cs[t * LDC + r];
#else
#if ADD
            y[at] = y[at] + cs[t * LDC + r];
#else
            y[at] = cs[t * LDC + r] * tscale[t0 + t]; // NORM
#endif
#endif
        }
    }
#endif
}
#else

const BK: u32 = 32u;
// Threads a token's values (and sums of squares) are spread over.
const XL: u32 = 8u;

var<workgroup> ws: array<f32, 2048>; // [BK][BN]
var<workgroup> xs: array<f32, 1024>; // [BM][BK]
#if NORM
// The threads' sums of squares (named as the COOP variant's output tile,
// which carries them there, for token_scales).
var<workgroup> cs: array<f32, 256>;
#endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row_base = wid.x * BN;
    let tok_base = wid.y * BM;
    let tx = lid & 15u;
    let ty = lid >> 4u;
    // This thread's share of the weight tile: 8 elements of one row.
    let wr = lid >> 2u;
    let wu = lid & 3u;
    let wrow = weight_row(wid.x, wr);
    // ... and of the activation tile: 4 elements of one token.
    let xt = lid >> 3u;
    let xc = (lid & 7u) * 4u;
    let xtok = min(tok_base + xt, p.n - 1u);
    var acc: array<f32, 8>; // [4 rows][2 tokens]
#if NORM
    var ss = 0.0;
#endif
    for (var k0 = k_begin(wid.z); k0 < k_end(wid.z); k0 += BK) {
        let e0 = k0 + wu * 8u;
        var wv = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (e0 < p.k) {
            // In two steps as the COOP variant does, so that the portable
            // parity cases check w8_raw and w8_unpack too.
            wv = w8_unpack(w8_raw(wrow, e0, p.k, p.d_off));
        }
        let wb = wu * 8u * BN + wr;
        ws[wb] = wv.a.x;
        ws[wb + BN] = wv.a.y;
        ws[wb + 2u * BN] = wv.a.z;
        ws[wb + 3u * BN] = wv.a.w;
        ws[wb + 4u * BN] = wv.b.x;
        ws[wb + 5u * BN] = wv.b.y;
        ws[wb + 6u * BN] = wv.b.z;
        ws[wb + 7u * BN] = wv.b.w;
        for (var i = 0u; i < 4u; i++) {
            let e = k0 + xc + i;
            var v = 0.0;
            if (e < p.k) {
                v = x[xtok * p.x_stride + e];
#if NORM
                ss += v * v;
                v *= nw[e];
#endif
            }
            xs[xt * BK + xc + i] = v;
        }
        workgroupBarrier();
        // Threads whose tokens are all past n (a short last tile) have no
        // sums to make: skipping them shortens short prefills, most on
        // lavapipe, where idle lanes cost as much as busy ones.
        if (tok_base + ty < p.n) {
            for (var kk = 0u; kk < BK; kk++) {
                let a0 = ws[kk * BN + tx];
                let a1 = ws[kk * BN + tx + 16u];
                let a2 = ws[kk * BN + tx + 32u];
                let a3 = ws[kk * BN + tx + 48u];
                let b0 = xs[ty * BK + kk];
                let b1 = xs[(ty + 16u) * BK + kk];
                acc[0] += a0 * b0;
                acc[1] += a0 * b1;
                acc[2] += a1 * b0;
                acc[3] += a1 * b1;
                acc[4] += a2 * b0;
                acc[5] += a2 * b1;
                acc[6] += a3 * b0;
                acc[7] += a3 * b1;
            }
        }
        workgroupBarrier();
    }
#if NORM
    cs[lid] = ss;
    token_scales(lid);
#if SPLIT
    store_sums_of_squares(wid, lid, tok_base);
#endif
#endif
#if SWIGLU
    // Tile rows tx + 16 i: gate for i < 2, the matching up row at i + 2.
    for (var i = 0u; i < 2u; i++) {
        let row = wid.x * 32u + tx + 16u * i;
        for (var j = 0u; j < 2u; j++) {
            let t = ty + 16u * j;
            let tok = tok_base + t;
            if (row < p.part_rows && tok < p.n) {
#if SPLIT
                store_gate_up(wid.z, tok, row, acc[i * 2u + j], acc[(i + 2u) * 2u + j]);
#else
                let gate = acc[i * 2u + j] * tscale[t];
                let up = acc[(i + 2u) * 2u + j] * tscale[t];
                y[tok * p.y_stride + p.out_off + row] = gate_act(gate) * up;
#endif
            }
        }
    }
#else
    for (var i = 0u; i < 4u; i++) {
        let row = row_base + tx + 16u * i;
        if (row >= p.rows) {
            continue;
        }
        let col = (row / p.part_rows) * p.part_stride + p.out_off + row % p.part_rows;
        for (var j = 0u; j < 2u; j++) {
            let tok = tok_base + ty + 16u * j;
            if (tok < p.n) {
                let at = split_base(wid.z) + tok * p.y_stride + col;
#if SPLIT
                y[at] = acc[i * 2u + j];
#else
#if ADD
                y[at] = y[at] + acc[i * 2u + j];
#else
                y[at] = acc[i * 2u + j] * tscale[ty + 16u * j]; // NORM
#endif
#endif
            }
        }
    }
#endif
}
#endif
