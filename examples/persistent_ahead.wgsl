// persistent_ahead: the second design of examples/persistent_decode.rs.
// The same step list, bindings and grid barrier as persistent_decode.wgsl,
// but each warp-sized team owns a fixed range of a step's rows, and every
// thread loads its weights of the NEXT step into registers before it waits
// at the barrier: weights do not depend on the step before, so their DRAM
// latency overlaps the barrier instead of following it.
//
// Partition of a step (parts P, rows R, k = 32 B, NB = ceil(B / 32)): team
// g of G = nwg * TEAMS owns rows [g R / G, (g + 1) R / G). Its units are
// (local row, block column j, part) with the part fastest; lane l of unit
// (r, j, p) reads block l + 32 j of row r of part p (16 bytes of nibbles
// and a scale), so a team reads a row's blocks side by side. A thread holds
// 8 units in registers: a chunk of whole rows (the host precomputes where
// each unit slot is, so no division sits on a step's critical path); the
// first chunk of the next step is the one loaded ahead, later chunks (the
// head's) as they come. A chunk's up to 8 row-part sums are reduced over
// the team together by one butterfly (slot_sums), not one reduction a row.
//
// Kinds 6 and 7 price a split-k accumulation into the residual stream (the
// "fused accumulation" design): every workgroup adds a vector with
// compare-and-swap loops on floats, or in fixed point with integer atomicAdd.
//
// Activations cross workgroups as in persistent_decode.wgsl: atomicStore
// into write-once regions, plain loads (here vec4) of regions no L1 can hold
// a stale copy of.
//
// AFTER: the same kernel loading the next step's weights after the barrier,
// as a plain persistent kernel would (the comparison that prices "ahead").

struct Params {
    first: u32,
    last: u32,
    nwg: u32,
    spin_limit: u32,
    base: u32,
    stage: u32, // 0: everything; 1: a step only reads x (and its norm); 2: also the products, no stores
    flags: u32, // 1: no storageBarrier after the wait; 2: none before the arrival
    _p2: u32,
}

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
    split: u32,
    _p2: u32,
    // Precomputed by the host, the same for every team (so no division on
    // a step's critical path): blocks B, units a row, units a chunk, chunks,
    // rows a chunk, and where unit slot i of a chunk is (local row in the
    // chunk | block column << 8 | part << 16 | used << 24).
    blocks: u32,
    pnb: u32,
    chunk: u32,
    chunks: u32,
    rpc: u32,
    _p3: u32,
    _p4: u32,
    _p5: u32,
    slots: array<u32, 8>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> steps: array<Step>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> act: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> sync: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> actv: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> w4: array<vec4<u32>>;

const WG: u32 = 256u;
const TEAM: u32 = 32u;
const TEAMS: u32 = 8u;
// Units a thread holds: named fields, not an array, so that they stay in
// registers (an array indexed in a loop the compiler does not unroll goes
// to local memory, and every load then waits for the one before).
const MAXU: u32 = 8u;

struct Unit {
    q: vec4<u32>, // the block's 32 nibbles
    d: u32,       // the word holding its f16 scale
}

struct Units {
    u0: Unit, u1: Unit, u2: Unit, u3: Unit, u4: Unit, u5: Unit, u6: Unit, u7: Unit,
}

// Block b of x: elements 0-15 in a0..a3, 16-31 in b0..b3.
struct XBlock { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
                b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32> }

#if !SUBGROUPS
var<workgroup> red: array<vec4<f32>, 256>;
#endif

#if SUBGROUPS
fn team_sum(v: vec4<f32>, lid: u32) -> vec4<f32> {
    return subgroupAdd(v);
}

fn xor4(v: vec4<f32>, mask: u32, lid: u32) -> vec4<f32> {
    return subgroupShuffleXor(v, mask);
}

fn from_lane(v: f32, src: u32, lid: u32) -> f32 {
    return subgroupShuffle(v, src);
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

fn xor4(v: vec4<f32>, mask: u32, lid: u32) -> vec4<f32> {
    red[lid] = v;
    workgroupBarrier();
    let r = red[lid ^ mask];
    workgroupBarrier();
    return r;
}

fn from_lane(v: f32, src: u32, lid: u32) -> f32 {
    return xor4(vec4<f32>(v, 0.0, 0.0, 0.0), (lid % TEAM) ^ src, lid).x;
}
#endif

// The rows a team owns.
struct Rows {
    r0: u32,
    nr: u32,
}

fn rows_of(s: Step, wid: u32, lid: u32) -> Rows {
    let g = wid * TEAMS + lid / TEAM;
    let teams = p.nwg * TEAMS;
    let r0 = g * s.rows / teams;
    return Rows(r0, (g + 1u) * s.rows / teams - r0);
}

// Where unit slot i of chunk c is: its local row, block column and part.
struct Place {
    lr: u32,
    j: u32,
    part: u32,
    used: bool, // the slot is part of the chunk
}

fn place(s: Step, c: u32, i: u32) -> Place {
    let e = s.slots[i];
    return Place(c * s.rpc + (e & 0xffu), (e >> 8u) & 0xffu, (e >> 16u) & 0xffu, ((e >> 24u) & 1u) == 1u);
}

fn block_of(s: Step, ro: Rows, pl: Place, lane: u32) -> u32 {
    return (pl.part * s.rows + ro.r0 + pl.lr) * s.blocks + lane + TEAM * pl.j;
}

fn present(s: Step, ro: Rows, pl: Place, lane: u32) -> bool {
    return pl.used && pl.lr < ro.nr && lane + TEAM * pl.j < s.blocks;
}

fn load_unit(s: Step, ro: Rows, c: u32, i: u32, lane: u32) -> Unit {
    let pl = place(s, c, i);
    var u = Unit(vec4<u32>(), 0u);
    if (present(s, ro, pl, lane)) {
        let blk = block_of(s, ro, pl, lane);
        u = Unit(w4[(s.w_off >> 2u) + blk], w[s.d_off + (blk >> 1u)]);
    }
    return u;
}

// Chunk c of the team's units (absent units load nothing).
fn load_chunk(s: Step, ro: Rows, c: u32, lane: u32) -> Units {
    return Units(load_unit(s, ro, c, 0u, lane), load_unit(s, ro, c, 1u, lane),
                 load_unit(s, ro, c, 2u, lane), load_unit(s, ro, c, 3u, lane),
                 load_unit(s, ro, c, 4u, lane), load_unit(s, ro, c, 5u, lane),
                 load_unit(s, ro, c, 6u, lane), load_unit(s, ro, c, 7u, lane));
}

fn bytes4(v: u32) -> vec4<f32> {
    return vec4<f32>(f32(v & 0xffu), f32((v >> 8u) & 0xffu), f32((v >> 16u) & 0xffu), f32(v >> 24u));
}

fn nibbles(v: u32, x: vec4<f32>, y: vec4<f32>) -> f32 {
    let lo = bytes4(v & 0x0f0f0f0fu) - 8.0;
    let hi = bytes4((v >> 4u) & 0x0f0f0f0fu) - 8.0;
    return dot(lo, x) + dot(hi, y);
}

fn unit_dot(u: Unit, blk: u32, x: XBlock) -> f32 {
    let acc = nibbles(u.q.x, x.a0, x.b0) + nibbles(u.q.y, x.a1, x.b1)
        + nibbles(u.q.z, x.a2, x.b2) + nibbles(u.q.w, x.a3, x.b3);
    let sc = unpack2x16float(u.d);
    return select(sc.x, sc.y, (blk & 1u) == 1u) * acc;
}

fn load_xb(s: Step, b: u32) -> XBlock {
    let i = (s.x_off >> 2u) + b * 8u;
    return XBlock(actv[i], actv[i + 1u], actv[i + 2u], actv[i + 3u],
                  actv[i + 4u], actv[i + 5u], actv[i + 6u], actv[i + 7u]);
}

fn store_f32(i: u32, v: f32) {
    atomicStore(&act[i], bitcast<u32>(v));
}

fn load_f32(i: u32) -> f32 {
    return actv[i >> 2u][i & 3u];
}

// What a team carries from unit to unit within a step.
// What a team carries from unit to unit within a chunk: each slot's sum
// (slot = row in the chunk x parts + part, at most 8) and the x block.
struct Acc {
    lo: vec4<f32>, // slots 0-3
    hi: vec4<f32>, // slots 4-7
    xj: u32,       // which block column x holds
    x: XBlock,
}

// Unit i of chunk c: its product, added to its slot.
fn unit_step(st: ptr<function, Acc>, s: Step, ro: Rows, c: u32, i: u32, u: Unit, lane: u32) {
    let pl = place(s, c, i);
    if (pl.used && present(s, ro, pl, lane)) {
        if (pl.j != (*st).xj) {
            (*st).x = load_xb(s, lane + TEAM * pl.j);
            (*st).xj = pl.j;
        }
        let v = unit_dot(u, block_of(s, ro, pl, lane), (*st).x);
        let slot = (pl.lr - c * s.rpc) * s.parts + pl.part;
        if (slot < 4u) {
            (*st).lo[slot] += v;
        } else {
            (*st).hi[slot - 4u] += v;
        }
    }
}

// The team's sums of all 8 slots at once: a butterfly that halves the
// values a lane holds at each of the first three levels (9 exchanges in 5
// dependent levels, not 8 separate reductions). Lane l ends with slot
// (l >> 2) & 7.
fn slot_sums(st: Acc, lid: u32) -> f32 {
    let lane = lid % TEAM;
    let b4 = ((lane >> 4u) & 1u) == 1u;
    let r4 = select(st.lo, st.hi, b4) + xor4(select(st.hi, st.lo, b4), 16u, lid);
    let b3 = ((lane >> 3u) & 1u) == 1u;
    let r2 = select(r4.xy, r4.zw, b3) + xor4(vec4<f32>(select(r4.zw, r4.xy, b3), 0.0, 0.0), 8u, lid).xy;
    let b2 = ((lane >> 2u) & 1u) == 1u;
    var r1 = select(r2.x, r2.y, b2) + xor4(vec4<f32>(select(r2.y, r2.x, b2), 0.0, 0.0, 0.0), 4u, lid).x;
    r1 += xor4(vec4<f32>(r1, 0.0, 0.0, 0.0), 2u, lid).x;
    r1 += xor4(vec4<f32>(r1, 0.0, 0.0, 0.0), 1u, lid).x;
    return r1;
}

// Chunk c's outputs from its slot sums: lane 4 q holds slot q; the lane of
// a row's part 0 takes the other parts from the lanes 4 and 8 after it.
fn chunk_out(s: Step, ro: Rows, c: u32, total: f32, inv: f32, lid: u32) {
    let lane = lid % TEAM;
    let t1 = from_lane(total, (lane + 4u) % TEAM, lid);
    let t2 = from_lane(total, (lane + 8u) % TEAM, lid);
    if (p.stage == 2u) {
        if (total + t1 + t2 == 0.5) {
            atomicStore(&sync[3], 1u);
        }
        return;
    }
    let slot = lane >> 2u;
    let lr = slot / s.parts;
    if ((lane & 3u) == 0u && slot % s.parts == 0u && lr < s.rpc && c * s.rpc + lr < ro.nr) {
        let r = ro.r0 + c * s.rpc + lr;
        var y = total * inv;
        if (s.kind == 1u) {
            y += load_f32(s.r_off + r);
        } else if (s.kind == 2u) {
            y = y / (1.0 + exp(-y)) * (t1 * inv);
        } else if (s.kind == 3u) {
            y = y * (t1 * inv) * (t2 * inv);
        }
        store_f32(s.y_off + r, y);
    }
}

fn gemv(s: Step, first: Units, wid: u32, lid: u32) {
    let lane = lid % TEAM;
    let ro = rows_of(s, wid, lid);
    // The norm's scale: every team reads all of x (its lanes cover every block).
    var inv = 1.0;
    if (s.norm == 1u) {
        var sq = vec4<f32>();
        for (var b = lane; b < s.blocks; b += TEAM) {
            let x = load_xb(s, b);
            sq += x.a0 * x.a0 + x.a1 * x.a1 + x.a2 * x.a2 + x.a3 * x.a3
                + x.b0 * x.b0 + x.b1 * x.b1 + x.b2 * x.b2 + x.b3 * x.b3;
        }
        let t = team_sum(sq, lid);
        inv = inverseSqrt((t.x + t.y + t.z + t.w) / f32(s.k) + 1e-5);
    }
    if (p.stage == 1u) {
        if (inv == 0.5) {
            atomicStore(&sync[3], 1u);
        }
        return;
    }
    var st: Acc;
    st.xj = 0xffffffffu;
    var us = first;
    for (var c = 0u; c < s.chunks; c++) {
        if (c > 0u) {
            us = load_chunk(s, ro, c, lane);
        }
        st.lo = vec4<f32>();
        st.hi = vec4<f32>();
        unit_step(&st, s, ro, c, 0u, us.u0, lane);
        unit_step(&st, s, ro, c, 1u, us.u1, lane);
        unit_step(&st, s, ro, c, 2u, us.u2, lane);
        unit_step(&st, s, ro, c, 3u, us.u3, lane);
        unit_step(&st, s, ro, c, 4u, us.u4, lane);
        unit_step(&st, s, ro, c, 5u, us.u5, lane);
        unit_step(&st, s, ro, c, 6u, us.u6, lane);
        unit_step(&st, s, ro, c, 7u, us.u7, lane);
        chunk_out(s, ro, c, slot_sums(st, lid), inv, lid);
    }
}

fn light(s: Step, wid: u32, lid: u32) {
    if (s.kind == 4u) {
        for (var i = wid * WG + lid; i < s.rows; i += p.nwg * WG) {
            store_f32(s.y_off + i, load_f32(s.x_off + i));
        }
    } else if (s.kind == 6u) {
        // What a split-k accumulation into the residual stream costs: every
        // workgroup adds its partial vector of s.rows floats with a
        // compare-and-swap loop a float (WGSL has no float atomics).
        let v = f32(wid + 1u) * 1e-3;
        for (var i = lid; i < s.rows; i += WG) {
            var old = atomicLoad(&act[s.y_off + i]);
            loop {
                let r = atomicCompareExchangeWeak(&act[s.y_off + i], old, bitcast<u32>(bitcast<f32>(old) + v));
                if (r.exchanged) {
                    break;
                }
                old = r.old_value;
            }
        }
    } else if (s.kind == 7u) {
        // The same in fixed point with integer atomicAdd (order-independent).
        let v = i32(wid + 1u) * 64;
        for (var i = lid; i < s.rows; i += WG) {
            atomicAdd(&act[s.y_off + i], bitcast<u32>(v));
        }
    }
}

fn arrive(lid: u32) {
    if ((p.flags & 2u) == 0u) {
        storageBarrier();
    }
    workgroupBarrier();
    if (lid == 0u) {
        atomicAdd(&sync[0], 1u);
    }
}

fn wait(passed: u32, lid: u32) {
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
    if ((p.flags & 1u) == 0u) {
        storageBarrier();
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let wid = wg.x;
    let lane = lid % TEAM;
    let s0 = steps[p.first];
    var next = Units();
    if (s0.kind < 4u) {
        next = load_chunk(s0, rows_of(s0, wid, lid), 0u, lane);
    }
    for (var i = p.first; i < p.last; i++) {
        let s = steps[i];
        if (s.kind < 4u) {
            gemv(s, next, wid, lid);
        } else {
            light(s, wid, lid);
        }
        if (i + 1u < p.last) {
            // Arrive (this step's stores are done), request the next step's
            // weights, then wait: their latency overlaps the barrier's.
            arrive(lid);
            let sn = steps[i + 1u];
#if AFTER
            wait(p.base + i - p.first + 1u, lid);
#endif
            if (sn.kind < 4u) {
                next = load_chunk(sn, rows_of(sn, wid, lid), 0u, lane);
            }
#if !AFTER
            wait(p.base + i - p.first + 1u, lid);
#endif
        }
    }
}
