// persistent_decode: the probe kernel of examples/persistent_decode.rs.
// A decode step's chain of Q4_0 GEMVs (and stand-ins for its light steps)
// read from a step list and run in order by one dispatch whose workgroups
// meet at a grid-wide barrier between steps ("persistent"), or one step per
// dispatch ("chain"): same code, same partition of rows, so the two give the
// same bits and their times differ only by how steps are separated.
//
// Data crossing workgroups: written with atomicStore (to the L2, not left in
// a workgroup's L1) into `act`, read with plain loads through `actf`, the same
// buffer bound a second time. Plain stores read back with plain loads after a
// barrier were stale in 97% of reads on an H200 (issue 18): a line already in
// an L1 is not refreshed. So every step writes a region of its own, aligned
// so that no line holds two regions, and no region is read before it is
// written within a dispatch (the residual stream too: each ADD writes a new
// copy): no L1 can hold a stale copy of it. The probe's check against the
// one-dispatch-per-step chain proves it on the adapter it runs on.
// Weights are read-only and read plainly.
//
// Grid barrier: thread 0 of every workgroup adds 1 to sync[0] and spins until
// it reaches (barriers passed so far) x workgroups. The spin is bounded by
// p.spin_limit: a workgroup that gives up counts a timeout in sync[1] and goes
// on, so a launch with more workgroups than the adapter holds at once ends
// (with wrong results, reported) instead of hanging the device.
//
// PREFETCH: at a barrier, once its workgroup has arrived, every thread but
// the one that waits loads a word of each weight block it reads first in the
// next step, so that step starts from the L2 while the barrier is still
// waited for (weights do not depend on the step before).
//
// Portable: with SUBGROUPS (a marker the example replaces) teams of 32
// threads reduce with subgroupAdd and must be one subgroup each; otherwise
// through workgroup memory.

struct Params {
    first: u32,      // first step
    last: u32,       // one past the last step
    nwg: u32,        // workgroups launched
    spin_limit: u32, // spins before a barrier gives up
    base: u32,       // barriers before this dispatch's first (sync[0] is cleared per submission)
    _p0: u32,        // (persistent_ahead.wgsl's stage and flags)
    _p1: u32,
    _p2: u32,
}

// kind: 0 STORE y = W n, 1 ADD y += W n, 2 SWIGLU y = silu(W0 n) (W1 n),
// 3 GATED3 y = (W0 n)(W1 n)(W2 n) (LFM2's short-conv block without its
// state), 4 COPY y[i] = x[i] for i < rows (a light step: attention at one
// position), 5 NOP. n = x, or rms_norm(x) when norm = 1 (unit weights).
// ADD reads the residual at r_off and writes the sum at y_off.
// Part j of a matrix is rows j*rows .. (j+1)*rows of its [parts*rows, k]
// Q4_0 blocks at word w_off (16 bytes each), f16 scales at word d_off.
struct Step {
    kind: u32,
    parts: u32,
    rows: u32,
    k: u32,
    w_off: u32,
    d_off: u32,
    x_off: u32,
    y_off: u32,
    norm: u32,
    r_off: u32,
    split: u32, // teams sharing a group of rows, each a slice of k (1, 2, 4 or 8)
    _p2: u32,
    ahead: array<u32, 16>, // persistent_ahead.wgsl's precomputed cut
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> steps: array<Step>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> act: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> sync: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> actf: array<f32>;

const WG: u32 = 256u;
const TEAM: u32 = 32u;
const TEAMS: u32 = 8u;
// Rows a team computes at once: their weight loads are in flight together
// and share each activation block read from workgroup memory.
const RT: u32 = 4u;
const MAXK: u32 = 4608u;

var<workgroup> xs: array<f32, 4752>; // MAXK + MAXK / 32
var<workgroup> red: array<vec4<f32>, 256>;
var<workgroup> ssq: array<f32, 256>;
// Per team and part, its slice's row sums (split > 1).
var<workgroup> partial: array<vec4<f32>, 24>;

fn bytes4(v: u32) -> vec4<f32> {
    return vec4<f32>(f32(v & 0xffu), f32((v >> 8u) & 0xffu), f32((v >> 16u) & 0xffu), f32(v >> 24u));
}

fn scale_of(d_off: u32, blk: u32) -> f32 {
    let v = unpack2x16float(w[d_off + (blk >> 1u)]);
    return select(v.x, v.y, (blk & 1u) == 1u);
}

// One block of activations: the 32 elements a lane multiplies with block b
// of each of its rows, read from workgroup memory once.
struct XBlock { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
                b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32> }

// Element e of x sits at xs[e + e / 32]: the lanes of a team read blocks 32
// elements apart, which unpadded would all fall in one memory bank.
fn x4(e: u32) -> vec4<f32> {
    let i = e + (e >> 5u);
    return vec4<f32>(xs[i], xs[i + 1u], xs[i + 2u], xs[i + 3u]);
}

fn x_block(b: u32) -> XBlock {
    let e = b * 32u;
    return XBlock(x4(e), x4(e + 4u), x4(e + 8u), x4(e + 12u),
                  x4(e + 16u), x4(e + 20u), x4(e + 24u), x4(e + 28u));
}

fn nibbles(v: u32, x: vec4<f32>, y: vec4<f32>) -> f32 {
    let lo = bytes4(v & 0x0f0f0f0fu) - 8.0;
    let hi = bytes4((v >> 4u) & 0x0f0f0f0fu) - 8.0;
    return dot(lo, x) + dot(hi, y);
}

// Block b of row `row` (k/32 blocks a row) times the block's activations.
fn block_dot(s: Step, row: u32, b: u32, xb: XBlock) -> f32 {
    let blk = row * (s.k >> 5u) + b;
    let base = s.w_off + blk * 4u;
    let acc = nibbles(w[base], xb.a0, xb.b0) + nibbles(w[base + 1u], xb.a1, xb.b1)
        + nibbles(w[base + 2u], xb.a2, xb.b2) + nibbles(w[base + 3u], xb.a3, xb.b3);
    return scale_of(s.d_off, blk) * acc;
}

fn rows4(s: Step, part: u32, r0: u32, b: u32, xb: XBlock) -> vec4<f32> {
    let last = s.rows - 1u;
    let base = part * s.rows;
    return vec4<f32>(block_dot(s, base + min(r0, last), b, xb), block_dot(s, base + min(r0 + 1u, last), b, xb),
                     block_dot(s, base + min(r0 + 2u, last), b, xb), block_dot(s, base + min(r0 + 3u, last), b, xb));
}

// The sum of v over the thread's team; every thread calls it.
#if SUBGROUPS
fn team_sum(v: vec4<f32>, lid: u32) -> vec4<f32> {
    return subgroupAdd(v);
}
#else
fn team_sum(v: vec4<f32>, lid: u32) -> vec4<f32> {
    red[lid] = v;
    workgroupBarrier();
    for (var stride = TEAM / 2u; stride > 0u; stride >>= 1u) {
        if (lid % TEAM < stride) {
            red[lid] += red[lid + stride];
        }
        workgroupBarrier();
    }
    let t = red[lid - lid % TEAM];
    workgroupBarrier();
    return t;
}
#endif

fn load_f32(i: u32) -> f32 {
    return actf[i];
}

fn store_f32(i: u32, v: f32) {
    atomicStore(&act[i], bitcast<u32>(v));
}

// Copies x into workgroup memory, normalised when the step asks.
fn load_x(s: Step, lid: u32) {
    var sq = 0.0;
    for (var i = lid; i < s.k; i += WG) {
        let v = load_f32(s.x_off + i);
        xs[i + (i >> 5u)] = v;
        sq += v * v;
    }
    if (s.norm == 1u) {
        ssq[lid] = sq;
        workgroupBarrier();
        for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
            if (lid < stride) {
                ssq[lid] += ssq[lid + stride];
            }
            workgroupBarrier();
        }
        let inv = inverseSqrt(ssq[0] / f32(s.k) + 1e-5);
        workgroupBarrier();
        for (var i = lid; i < s.k; i += WG) {
            xs[i + (i >> 5u)] *= inv;
        }
    }
    workgroupBarrier();
}

fn gemv(s: Step, wid: u32, lid: u32) {
    load_x(s, lid);
    let team = lid / TEAM;
    let lane = lid % TEAM;
    let split = s.split;
    let slice = team % split;
    let groups = TEAMS / split; // row groups a workgroup works on at once
    let chunks = (s.rows + RT - 1u) / RT;
    let stride = p.nwg * groups;
    let iters = (chunks + stride - 1u) / stride;
    let blocks = s.k >> 5u;
    for (var it = 0u; it < iters; it++) {
        let c = it * stride + wid * groups + team / split;
        let r0 = min(c, chunks - 1u) * RT;
        var a0 = vec4<f32>();
        var a1 = vec4<f32>();
        var a2 = vec4<f32>();
        // Teams past the last chunk only join the reductions.
        let my_blocks = select(0u, blocks, c < chunks);
        for (var b = slice * TEAM + lane; b < my_blocks; b += split * TEAM) {
            let xb = x_block(b);
            a0 += rows4(s, 0u, r0, b, xb);
            if (s.parts > 1u) {
                a1 += rows4(s, 1u, r0, b, xb);
            }
            if (s.parts > 2u) {
                a2 += rows4(s, 2u, r0, b, xb);
            }
        }
        a0 = team_sum(a0, lid);
        if (s.parts > 1u) {
            a1 = team_sum(a1, lid);
        }
        if (s.parts > 2u) {
            a2 = team_sum(a2, lid);
        }
        if (split > 1u) {
            if (lane == 0u) {
                partial[team * 3u] = a0;
                partial[team * 3u + 1u] = a1;
                partial[team * 3u + 2u] = a2;
            }
            workgroupBarrier();
            if (slice == 0u) {
                for (var t = 1u; t < split; t++) {
                    a0 += partial[(team + t) * 3u];
                    a1 += partial[(team + t) * 3u + 1u];
                    a2 += partial[(team + t) * 3u + 2u];
                }
            }
            workgroupBarrier();
        }
        if (slice == 0u && lane < RT && c < chunks) {
            let r = r0 + lane;
            if (r < s.rows) {
                var v = a0[lane];
                if (s.kind == 1u) {
                    v += load_f32(s.r_off + r);
                } else if (s.kind == 2u) {
                    v = v / (1.0 + exp(-v)) * a1[lane];
                } else if (s.kind == 3u) {
                    v = v * a1[lane] * a2[lane];
                }
                store_f32(s.y_off + r, v);
            }
        }
    }
}

fn light(s: Step, wid: u32, lid: u32) {
    if (s.kind == 4u) {
        for (var i = wid * WG + lid; i < s.rows; i += p.nwg * WG) {
            store_f32(s.y_off + i, load_f32(s.x_off + i));
        }
    }
}

#if PREFETCH
fn prefetch(s: Step, wid: u32, lid: u32) -> u32 {
    let team = lid / TEAM;
    let chunks = (s.rows + RT - 1u) / RT;
    let c = wid * (TEAMS / s.split) + team / s.split;
    if (s.kind >= 4u || c >= chunks) {
        return 0u;
    }
    let blocks = s.k >> 5u;
    var acc = 0u;
    for (var b = (team % s.split) * TEAM + lid % TEAM; b < blocks; b += s.split * TEAM) {
        for (var part = 0u; part < s.parts; part++) {
            for (var j = 0u; j < RT; j++) {
                let row = part * s.rows + min(c * RT + j, s.rows - 1u);
                acc ^= w[s.w_off + (row * blocks + b) * 4u];
            }
        }
    }
    return acc;
}
#endif

// Returns what PREFETCH loaded (to be kept alive), else 0.
fn grid_sync(passed: u32, lid: u32, wid: u32, next: u32) -> u32 {
    storageBarrier();
    workgroupBarrier();
    if (lid == 0u) {
        atomicAdd(&sync[0], 1u);
    }
    var got = 0u;
#if PREFETCH
    if (lid != 0u) {
        got = prefetch(steps[next], wid, lid);
    }
#endif
    if (lid == 0u) {
        let goal = passed * p.nwg;
        var spins = 0u;
        loop {
            if (atomicLoad(&sync[0]) >= goal) {
                break;
            }
            spins++;
            if (spins > p.spin_limit) {
                atomicAdd(&sync[1], 1u);
                break;
            }
        }
    }
    workgroupBarrier();
    storageBarrier();
    return got;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let wid = wg.x;
    var sink = 0u;
    for (var i = p.first; i < p.last; i++) {
        let s = steps[i];
        if (s.kind < 4u) {
            gemv(s, wid, lid);
        } else {
            light(s, wid, lid);
        }
        if (i + 1u < p.last) {
            sink ^= grid_sync(p.base + i - p.first + 1u, lid, wid, i + 1u);
        }
    }
    // Keeps PREFETCH's loads: a value the compiler cannot rule out.
    if (sink == p.spin_limit * 2654435761u) {
        atomicStore(&sync[3], sink);
    }
}
