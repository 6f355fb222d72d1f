// gemv: one weight chunk (any format of quant_formats.wgsl, dequantised here)
// times activation vectors, for decode. The epilogue is chosen by defines,
// one kernel per combination (gpu::llm_ops):
//   gemv         y[out_off + o] = W[o] . x
//   gemv_add     ADD:           y[out_off + o] += W[o] . x   (residual add)
//   gemv_norm    NORM:          y[out_off + o] = W[o] . n,  n = rms_norm(x) * nw
//   gemv_swiglu  NORM + SWIGLU: y[out_off + o] = silu(W[o] . n) * (W[rows + o] . n)
//   gemv_geglu   NORM + SWIGLU + GELU: the same with gelu_tanh for silu
//   gemv_conv    NORM + CONV:   LFM2's short-conv block for channel c = out_off + o
//                at position pos = step[1]: B, C, X = rows o, rows + o, 2 rows + o
//                of W times n; bx = B X; y[c] = C * (sum_j<L-1 conv[c, j]
//                bx(pos - L + 1 + j) + conv[c, L-1] bx). The state is a ring of
//                `ring` rows [ring, hidden] (ring >= L): bx of position q in
//                row q % ring. L - 1 rows are read, bx(pos) is written over
//                the oldest; the spare rows let steps be undone by moving pos
//                back (models::llm::REWIND_DEPTH).
// The norm is folded in: sum_i W[o, i] x[i] nw[i] is accumulated alongside
// sum_i x[i]^2, and the result scaled by 1 / sqrt(mean + eps) at the end.
//
// The order of summation every kernel here follows, the params and the
// epilogue are in gemv_common.wgsl.
//
// bindings: 0 params, 1 w: array<u32> (chunk), 2 x: array<f32> (k from x_off),
//           NORM: 3 nw (k); CONV: 4 conv [hidden, L], 5 state [ring, hidden],
//           6 step: array<u32> [token, pos, ...];
//           then y (read_write); COLS: last, part (read_write, p.split's sums)
// dispatch (single): ceil(rows / R) workgroups (gpu::ops::groups_1d over x
//           and y); each thread is one lane of k for the workgroup's R rows.
//           WALK (single-part epilogues): any number of workgroups, each
//           taking every nwg-th quad of R rows (gpu::llm_ops::GemvLayout).
// COLS (the gemv_cols_* kernels, batched decode): the same products for
//   p.cols activation columns, x column j at x_off + j x_stride, y column j at
//   j y_stride (+ out_off). A tile of BR rows (of every part) x BC columns a
//   workgroup; each step takes unit j of BK / 8 neighbouring lanes
//   (gemv_common.wgsl: neighbouring units of k), dequantises that slice of
//   the weight tile into workgroup memory once for all the columns, and
//   each thread keeps its 4 rows x 2 columns' sums of each of those lanes,
//   of the group and the total in registers. CONV
//   reads column j's position and its state's first ring row from a row
//   record, step[8 j + 1] and step[8 j + 5] (models::llm_gpu::batch).
//   With p.split a workgroup takes p.split lane groups of k and writes each
//   group's sums to `part` (gemv_common's part_at), for gemv_sum.wgsl to add
//   up and finish: more workgroups when rows x columns make few tiles.
// dispatch (COLS): (ceil(cols / BC) x (p.split: ceil(groups / p.split),
//   else 1), then the row tiles over y and z).

@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
#if NORM
@group(0) @binding(3) var<storage, read> nw: array<f32>;
#if CONV
@group(0) @binding(4) var<storage, read> conv: array<f32>;
@group(0) @binding(5) var<storage, read_write> state: array<f32>;
@group(0) @binding(6) var<storage, read> step: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;
#if COLS
@group(0) @binding(8) var<storage, read_write> part: array<f32>;
#endif
#else
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#if COLS
@group(0) @binding(5) var<storage, read_write> part: array<f32>;
#endif
#endif
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#if COLS
@group(0) @binding(4) var<storage, read_write> part: array<f32>;
#endif
#endif

fn load8(off: u32, e0: u32) -> W8 {
    let b = off + e0;
    if (e0 + 8u <= p.k) {
        return W8(vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]),
                  vec4<f32>(x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]));
    }
    var v = array<f32, 8>();
    for (var i = 0u; i < 8u; i++) {
        if (e0 + i < p.k) {
            v[i] = x[b + i];
        }
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

#if NORM
fn norm8(e0: u32) -> W8 {
    if (e0 + 8u <= p.k) {
        return W8(vec4<f32>(nw[e0], nw[e0 + 1u], nw[e0 + 2u], nw[e0 + 3u]),
                  vec4<f32>(nw[e0 + 4u], nw[e0 + 5u], nw[e0 + 6u], nw[e0 + 7u]));
    }
    var v = array<f32, 8>();
    for (var i = 0u; i < 8u; i++) {
        if (e0 + i < p.k) {
            v[i] = nw[e0 + i];
        }
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

// The unit's sum of squares: an fma chain from 0.
fn sq8(v: W8) -> f32 {
    var s = fma(v.a.x, v.a.x, 0.0);
    s = fma(v.a.y, v.a.y, s);
    s = fma(v.a.z, v.a.z, s);
    s = fma(v.a.w, v.a.w, s);
    s = fma(v.b.x, v.b.x, s);
    s = fma(v.b.y, v.b.y, s);
    s = fma(v.b.z, v.b.z, s);
    return fma(v.b.w, v.b.w, s);
}

// The activations times the norm weights (the same products in both layouts).
fn scaled8(v: W8, e0: u32) -> W8 {
    let g = norm8(e0);
    return W8(v.a * g.a, v.b * g.b);
}

#endif

// acc + the unit's eight products, in order.
fn fma8(wv: W8, xv: W8, acc: f32) -> f32 {
    var a = fma(wv.a.x, xv.a.x, acc);
    a = fma(wv.a.y, xv.a.y, a);
    a = fma(wv.a.z, xv.a.z, a);
    a = fma(wv.a.w, xv.a.w, a);
    a = fma(wv.b.x, xv.b.x, a);
    a = fma(wv.b.y, xv.b.y, a);
    a = fma(wv.b.z, xv.b.z, a);
    return fma(wv.b.w, xv.b.w, a);
}

#if COLS
// Weight rows (of each part) and columns a workgroup, and k per step.
const BR: u32 = 64u;
const BC: u32 = 32u;
const BK: u32 = 16u;
// Units of 8 a step, and weight units each thread loads a step.
const UNITS: u32 = BK / 8u;
const LOADS: u32 = (PARTS * BR * UNITS + 255u) / 256u;

// [part][kk][BR / 4] row quads of the dequantised weight slice.
var<workgroup> ws: array<vec4<f32>, 768>; // PARTS (<= 3) * BK * BR / 4
// [kk][BC / 2] column pairs of the (NORM: scaled) activation slice.
var<workgroup> xs: array<vec2<f32>, 256>; // BK * BC / 2
#if NORM
// [col][unit]: each column's unit sums of squares of the slice.
var<workgroup> uss: array<f32, 64>; // BC * UNITS
// Each column's 1 / rms at the end.
var<workgroup> cscale: array<f32, 32>; // BC
#endif

// Raw words of weight unit q of the slice: (part, row, unit of the step),
// a row's UNITS side by side, the unit's elements from e0; zero past k and
// past the slice.
fn slice_raw(q: u32, e0: u32, row0: u32, last_row: u32) -> W8Raw {
    let part = q / (BR * UNITS);
    let r = (q / UNITS) % BR;
    if (q >= PARTS * BR * UNITS || e0 >= p.k) {
        return W8Raw();
    }
    return w8_raw(part * p.rows + min(row0 + r, last_row), e0, p.k, p.d_off);
}

// Unit q's values into the weight slice (no-op past the slice).
fn slice_store(q: u32, raw: W8Raw) {
    if (q >= PARTS * BR * UNITS) {
        return;
    }
    let wv = w8_unpack(raw);
    let part = q / (BR * UNITS);
    let r = (q / UNITS) % BR;
    let u = q % UNITS;
    let at = (part * BK + u * 8u) * (BR / 4u) + r / 4u;
    let lane = r & 3u;
    ws[at][lane] = wv.a.x;
    ws[at + (BR / 4u)][lane] = wv.a.y;
    ws[at + 2u * (BR / 4u)][lane] = wv.a.z;
    ws[at + 3u * (BR / 4u)][lane] = wv.a.w;
    ws[at + 4u * (BR / 4u)][lane] = wv.b.x;
    ws[at + 5u * (BR / 4u)][lane] = wv.b.y;
    ws[at + 6u * (BR / 4u)][lane] = wv.b.z;
    ws[at + 7u * (BR / 4u)][lane] = wv.b.w;
}

// Activation unit `lid` of the slice (column lid / UNITS, unit lid % UNITS
// of the step, its elements from e0); zero past k and for threads past
// UNITS BC.
fn slice_x(lid: u32, e0: u32, col0: u32, last_col: u32) -> W8 {
    if (lid >= BC * UNITS || e0 >= p.k) {
        return W8(vec4<f32>(), vec4<f32>());
    }
    return load8(p.x_off + min(col0 + lid / UNITS, last_col) * p.x_stride, e0);
}

// Whether lane UNITS blk + u is one of this workgroup's (below lane_end)
// and holds a unit j.
fn block_holds(blk: u32, j: u32, u: u32, lane_end: u32) -> bool {
    let l = UNITS * blk + u;
    return l < lane_end && j < lane_len(l);
}

// The first element of unit j of lane UNITS blk + u when it holds one;
// else past k, so its loads give zeros.
fn block_e0(blk: u32, j: u32, u: u32, lane_end: u32) -> u32 {
    if (block_holds(blk, j, u, lane_end)) {
        return 8u * (UNITS * blk + u + LANES * j);
    }
    return 8u * unit_count();
}

// Whether lane l is the last of its group (of `lanes` lanes in all).
fn ends_group(l: u32, lanes: u32) -> bool {
    return (l + 1u) % GROUP == 0u || l + 1u == lanes;
}

// A split's sums of group `g` for column `col` (if there), rows r .. r + 3
// (those there), of each part.
fn store_group(g: u32, col: u32, r: u32, v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>) {
    if (col >= p.cols) {
        return;
    }
    for (var i = 0u; i < 4u; i++) {
        if (r + i < p.rows) {
            part[part_at(g, 0u, col, r + i)] = v0[i];
            if (PARTS > 1u) {
                part[part_at(g, 1u, col, r + i)] = v1[i];
            }
            if (PARTS > 2u) {
                part[part_at(g, 2u, col, r + i)] = v2[i];
            }
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.z * nwg.y + wid.y) * BR;
    let col_tiles = (p.cols + BC - 1u) / BC;
    let col0 = (wid.x % col_tiles) * BC;
    let last_col = p.cols - 1u;
    let last_row = p.rows - 1u;
    // The lanes this workgroup sums: all, or (p.split) the p.split lane
    // groups from gz p.split, as blocks of UNITS lanes.
    let gz = wid.x / col_tiles;
    let lanes = lane_count();
    var lane_end = lanes;
    var blk = 0u;
    if (p.split != 0u) {
        blk = gz * p.split * (GROUP / UNITS);
        lane_end = min(UNITS * blk + p.split * GROUP, lanes);
    }
    let blk_end = (lane_end + UNITS - 1u) / UNITS;
    // This thread's outputs: rows row0 + 4 tr .. + 3, columns col0 + 2 tc, + 1.
    // Columns fastest: a warp's threads share 2 row quads (broadcast reads of
    // the weight slice) and read 16 column pairs of the activations. A tile
    // of at most BC / 2 columns (a small batch) takes rows fastest instead,
    // so that the threads of the columns past the last are mostly whole
    // subgroups, which skip the products; which thread computes a sum does
    // not change its order.
    let few = p.cols - col0 <= BC / 2u;
    let tc = select(lid & 15u, lid >> 4u, few);
    let tr = select(lid >> 4u, lid & 15u, few);
    let idle = col0 + 2u * tc > last_col;
    // Sums per part and column (vec4: the 4 rows): per lane of the block
    // (la[u][2 part + column]), group, total.
    var la = array<array<vec4<f32>, 6>, UNITS>();
    var g00 = vec4<f32>(); var t00 = vec4<f32>();
    var g01 = vec4<f32>(); var t01 = vec4<f32>();
    var g10 = vec4<f32>(); var t10 = vec4<f32>();
    var g11 = vec4<f32>(); var t11 = vec4<f32>();
    var g20 = vec4<f32>(); var t20 = vec4<f32>();
    var g21 = vec4<f32>(); var t21 = vec4<f32>();
#if NORM
    // Threads lid < BC: column lid's sums of squares.
    var sl = array<f32, UNITS>();
    var sg = 0.0;
    var st = 0.0;
#endif
    // A step takes unit j of each lane of block blk. Each step's slices
    // are loaded into registers during the step before (raw weight words,
    // activations), so their latency hides behind its products: thread lid
    // loads weight units lid + 256 i (i < LOADS) and, below UNITS BC, one
    // activation unit, all of unit lid % UNITS of the step.
    let mine = lid % UNITS;
    var j = 0u;
    var e0 = block_e0(blk, j, mine, lane_end);
    var wr0 = slice_raw(lid, e0, row0, last_row);
    var wr1 = W8Raw();
    var wr2 = W8Raw();
    if (LOADS > 1u) {
        wr1 = slice_raw(lid + 256u, e0, row0, last_row);
    }
    if (LOADS > 2u) {
        wr2 = slice_raw(lid + 512u, e0, row0, last_row);
    }
    var xr = slice_x(lid, e0, col0, last_col);
    while (blk < blk_end) {
        slice_store(lid, wr0);
        if (LOADS > 1u) {
            slice_store(lid + 256u, wr1);
        }
        if (LOADS > 2u) {
            slice_store(lid + 512u, wr2);
        }
        if (lid < BC * UNITS) {
            let c = lid / UNITS;
            let u = mine;
            var xv = xr;
#if NORM
            uss[c * UNITS + u] = sq8(xv);
            if (e0 < p.k) {
                xv = scaled8(xv, e0);
            }
#endif
            let at = u * 8u * (BC / 2u) + c / 2u;
            let h = c & 1u;
            xs[at][h] = xv.a.x;
            xs[at + (BC / 2u)][h] = xv.a.y;
            xs[at + 2u * (BC / 2u)][h] = xv.a.z;
            xs[at + 3u * (BC / 2u)][h] = xv.a.w;
            xs[at + 4u * (BC / 2u)][h] = xv.b.x;
            xs[at + 5u * (BC / 2u)][h] = xv.b.y;
            xs[at + 6u * (BC / 2u)][h] = xv.b.z;
            xs[at + 7u * (BC / 2u)][h] = xv.b.w;
        }
        workgroupBarrier();
        // The block's first lane is its longest.
        let block_ends = j + 1u >= lane_len(UNITS * blk);
        let next_blk = select(blk, blk + 1u, block_ends);
        let next_j = select(j + 1u, 0u, block_ends);
        if (next_blk < blk_end) {
            e0 = block_e0(next_blk, next_j, mine, lane_end);
            wr0 = slice_raw(lid, e0, row0, last_row);
            if (LOADS > 1u) {
                wr1 = slice_raw(lid + 256u, e0, row0, last_row);
            }
            if (LOADS > 2u) {
                wr2 = slice_raw(lid + 512u, e0, row0, last_row);
            }
            xr = slice_x(lid, e0, col0, last_col);
        }
#if NORM
        if (lid < BC) {
            for (var u = 0u; u < UNITS; u++) {
                if (block_holds(blk, j, u, lane_end)) {
                    sl[u] += uss[lid * UNITS + u];
                }
            }
            if (block_ends) {
                for (var u = 0u; u < UNITS; u++) {
                    let l = UNITS * blk + u;
                    if (l < lane_end) {
                        sg += sl[u];
                        sl[u] = 0.0;
                        if (ends_group(l, lanes)) {
                            if (p.split == 0u) {
                                st += sg;
                            } else if (row0 == 0u && col0 + lid <= last_col) {
                                part[part_ss_at(l / GROUP, col0 + lid)] = sg;
                            }
                            sg = 0.0;
                        }
                    }
                }
            }
        }
#endif
        // A unit a lane does not hold adds zero products: its sum is not
        // changed (a sum from +0 is never -0). Threads of columns past the
        // last have none to make. The loop's bound stays a constant: one
        // that is not keeps the compiler from unrolling it, and `la` then
        // lives in local memory (5-7x slower batched decode on the H100).
        if (!idle) {
            for (var u = 0u; u < UNITS; u++) {
                for (var i = 0u; i < 8u; i++) {
                    let kk = u * 8u + i;
                    let xv = xs[kk * (BC / 2u) + tc];
                    let x0 = vec4<f32>(xv.x);
                    let x1 = vec4<f32>(xv.y);
                    let w0 = ws[kk * (BR / 4u) + tr];
                    la[u][0] = fma(w0, x0, la[u][0]);
                    la[u][1] = fma(w0, x1, la[u][1]);
                    if (PARTS > 1u) {
                        let w1 = ws[(BK + kk) * (BR / 4u) + tr];
                        la[u][2] = fma(w1, x0, la[u][2]);
                        la[u][3] = fma(w1, x1, la[u][3]);
                    }
                    if (PARTS > 2u) {
                        let w2 = ws[(2u * BK + kk) * (BR / 4u) + tr];
                        la[u][4] = fma(w2, x0, la[u][4]);
                        la[u][5] = fma(w2, x1, la[u][5]);
                    }
                }
            }
        }
        if (block_ends) {
            for (var u = 0u; u < UNITS; u++) {
                let l = UNITS * blk + u;
                if (l >= lane_end) {
                    break;
                }
                g00 += la[u][0];
                g01 += la[u][1];
                g10 += la[u][2];
                g11 += la[u][3];
                g20 += la[u][4];
                g21 += la[u][5];
                la[u] = array<vec4<f32>, 6>();
                if (ends_group(l, lanes)) {
                    if (p.split != 0u) {
                        let c = col0 + 2u * tc;
                        let r = row0 + 4u * tr;
                        store_group(l / GROUP, c, r, g00, g10, g20);
                        store_group(l / GROUP, c + 1u, r, g01, g11, g21);
                    }
                    t00 += g00; g00 = vec4<f32>();
                    t01 += g01; g01 = vec4<f32>();
                    t10 += g10; g10 = vec4<f32>();
                    t11 += g11; g11 = vec4<f32>();
                    t20 += g20; g20 = vec4<f32>();
                    t21 += g21; g21 = vec4<f32>();
                }
            }
        }
        workgroupBarrier();
        blk = next_blk;
        j = next_j;
    }
    if (p.split != 0u) {
        return;
    }
#if NORM
    if (lid < BC) {
        cscale[lid] = st;
    }
    workgroupBarrier();
#endif
    for (var j = 0u; j < 2u; j++) {
        let col = col0 + 2u * tc + j;
        if (col > last_col) {
            break;
        }
        var ss = 0.0;
#if NORM
        ss = cscale[2u * tc + j];
#endif
        var place = vec2<u32>();
#if CONV
        place = conv_place(col);
#endif
        let a0 = select(t00, t01, j == 1u);
        let a1 = select(t10, t11, j == 1u);
        let a2 = select(t20, t21, j == 1u);
        for (var i = 0u; i < 4u; i++) {
            let row = row0 + 4u * tr + i;
            if (row < p.rows) {
                finish(row, col, a0[i], a1[i], a2[i], ss, place.x, place.y);
            }
        }
    }
}
#else
// Output rows per workgroup, all of them in each of its LANES threads: a
// thread loads its lane of x once for the R rows.
const R: u32 = 4u;

// Lane sums [part][row][lane] (NORM: sums of squares after them), then
// group sums [part][row][group] (and of squares), four floats a word so
// that a run of them is read in a few wide loads: the adds that follow are
// the one order of summation, but the loads no longer wait for each other.
var<workgroup> lsum: array<vec4<f32>, 416>; // ((PARTS <= 3) * R + 1) * LANES / 4
var<workgroup> gsum: array<vec4<f32>, 52>; // ((PARTS <= 3) * R + 1) * GROUPS / 4

fn lsum_set(i: u32, v: f32) {
    lsum[i / 4u][i % 4u] = v;
}

// The first n (<= 4) floats of v added to t in order.
fn add4(t0: f32, v: vec4<f32>, n: u32) -> f32 {
    var t = select(t0, t0 + v.x, n > 0u);
    t = select(t, t + v.y, n > 1u);
    t = select(t, t + v.z, n > 2u);
    return select(t, t + v.w, n > 3u);
}

// The sum from 0, in order, of the n (<= GROUP) lane sums from float i (a
// multiple of GROUP).
fn lane_run(i: u32, n: u32) -> f32 {
    let a = lsum[i / 4u];
    let b = lsum[i / 4u + 1u];
    return add4(add4(0.0, a, n), b, max(n, 4u) - 4u);
}

// The sum from 0, in order, of the n (<= GROUPS) group sums from float j
// (a multiple of GROUPS).
fn group_run(j: u32, n: u32) -> f32 {
    let b = j / 4u;
    let v0 = gsum[b];
    let v1 = gsum[b + 1u];
    let v2 = gsum[b + 2u];
    let v3 = gsum[b + 3u];
    var t = add4(0.0, v0, n);
    t = add4(t, v1, max(n, 4u) - 4u);
    t = add4(t, v2, max(n, 8u) - 8u);
    return add4(t, v3, max(n, 12u) - 12u);
}

// Rows r .. r + 3 of the matrix (clamped to `last`) times xv, each added to
// its own lane sum in acc.
fn fma8x4(r: u32, last: u32, e0: u32, xv: W8, acc: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(fma8(w8(min(r, last), e0, p.k, p.d_off), xv, acc.x),
                     fma8(w8(min(r + 1u, last), e0, p.k, p.d_off), xv, acc.y),
                     fma8(w8(min(r + 2u, last), e0, p.k, p.d_off), xv, acc.z),
                     fma8(w8(min(r + 3u, last), e0, p.k, p.d_off), xv, acc.w));
}

#if WALK
// Single-part GEMVs of many rows: a few resident workgroups walk the row
// quads (workgroup w takes quads w, w + nwg, ...), so x, its norm and the
// sum of squares are read and reduced once a workgroup instead of once a
// quad. The same sums in the same order as the kernel below.
@compute @workgroup_size(LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let last = p.rows - 1u;
    let units = unit_count();
    let lanes = lane_count();
    let groups = group_count();
    let quads = (p.rows + R - 1u) / R;
    // The lane's first two units of x (NORM: scaled) stay in registers;
    // later ones are read again for each quad.
    var x0 = W8();
    var x1 = W8();
    var ss = 0.0;
    for (var u = lane; u < units; u += LANES) {
        let e0 = 8u * u;
        var xv = load8(p.x_off, e0);
#if NORM
        ss += sq8(xv);
        xv = scaled8(xv, e0);
#endif
        if (u == lane) {
            x0 = xv;
        } else if (u == lane + LANES) {
            x1 = xv;
        }
    }
    var sq = 0.0;
#if NORM
    lsum_set(R * LANES + lane, ss);
    workgroupBarrier();
    if (lane < groups) {
        let i = lane * GROUP;
        gsum[(R * GROUPS + lane) / 4u][lane % 4u] = lane_run(R * LANES + i, min(GROUP, lanes - i));
    }
    workgroupBarrier();
    sq = group_run(R * GROUPS, groups);
#endif
    for (var quad = wid.y * nwg.x + wid.x; quad < quads; quad += nwg.x * nwg.y) {
        let first = quad * R;
        var a0 = vec4<f32>();
        if (lane < units) {
            a0 = fma8x4(first, last, 8u * lane, x0, a0);
        }
        if (lane + LANES < units) {
            a0 = fma8x4(first, last, 8u * (lane + LANES), x1, a0);
        }
        for (var u = lane + 2u * LANES; u < units; u += LANES) {
            let e0 = 8u * u;
            var xv = load8(p.x_off, e0);
#if NORM
            xv = scaled8(xv, e0);
#endif
            a0 = fma8x4(first, last, e0, xv, a0);
        }
        for (var r = 0u; r < R; r++) {
            lsum_set(r * LANES + lane, a0[r]);
        }
        workgroupBarrier();
        // Group sums of the R rows; then each of the first R threads adds
        // its row's. The next quad writes these only after its first
        // barrier, which every thread reaches after reading them.
        for (var task = lane; task < R * GROUPS; task += LANES) {
            let row = task / GROUPS;
            let g = task % GROUPS;
            if (g < groups) {
                let i = g * GROUP;
                gsum[task / 4u][g % 4u] = lane_run(row * LANES + i, min(GROUP, lanes - i));
            }
        }
        workgroupBarrier();
        if (lane < R && first + lane < p.rows) {
            finish(first + lane, 0u, group_run(lane * GROUPS, groups), 0.0, 0.0, sq, 0u, 0u);
        }
    }
}
#else
@compute @workgroup_size(LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let first = (wid.y * nwg.x + wid.x) * R;
    // Rows past the end repeat the last one; their sums are dropped.
    let last = p.rows - 1u;
    let units = unit_count();
    let lanes = lane_count();
    let groups = group_count();
    var a0 = vec4<f32>();
    var a1 = vec4<f32>();
    var a2 = vec4<f32>();
    var ss = 0.0;
    for (var u = lane; u < units; u += LANES) {
        let e0 = 8u * u;
        var xv = load8(p.x_off, e0);
#if NORM
        ss += sq8(xv);
        xv = scaled8(xv, e0);
#endif
        a0 = fma8x4(first, last, e0, xv, a0);
        if (PARTS > 1u) {
            a1 = fma8x4(p.rows + first, p.rows + last, e0, xv, a1);
        }
        if (PARTS > 2u) {
            a2 = fma8x4(2u * p.rows + first, 2u * p.rows + last, e0, xv, a2);
        }
    }
    for (var r = 0u; r < R; r++) {
        lsum_set(r * LANES + lane, a0[r]);
        if (PARTS > 1u) {
            lsum_set((R + r) * LANES + lane, a1[r]);
        }
        if (PARTS > 2u) {
            lsum_set((2u * R + r) * LANES + lane, a2[r]);
        }
    }
#if NORM
    lsum_set(PARTS * R * LANES + lane, ss);
#endif
    workgroupBarrier();
    // Group sums: task (set, g) for set = part * R + row (NORM: the last
    // set is the squares).
    var sets = PARTS * R;
#if NORM
    sets += 1u;
#endif
    for (var task = lane; task < sets * GROUPS; task += LANES) {
        let row_set = task / GROUPS;
        let g = task % GROUPS;
        if (g < groups) {
            let i = g * GROUP;
            let t = lane_run(row_set * LANES + i, min(GROUP, lanes - i));
            gsum[(row_set * GROUPS + g) / 4u][g % 4u] = t;
        }
    }
    workgroupBarrier();
    if (lane >= R || first + lane >= p.rows) {
        return;
    }
    let r = lane;
    var v = vec3<f32>();
    for (var q = 0u; q < PARTS; q++) {
        v[q] = group_run((q * R + r) * GROUPS, groups);
    }
    var sq = 0.0;
#if NORM
    sq = group_run(PARTS * R * GROUPS, groups);
#endif
    var pos = 0u;
#if CONV
    pos = step[1];
#endif
    finish(first + r, 0u, v.x, v.y, v.z, sq, pos, 0u);
}
#endif
#endif
