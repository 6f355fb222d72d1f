// argmax in two kernels from this file, the first one on ties (torch.argmax,
// cpu::argmax); NaNs are never chosen over a number:
//   argmax_part (PARTIAL): workgroup g finds the best of x[g CHUNK ..
//       (g + 1) CHUNK) and writes (value bits, index) to part[2 g], part[2 g + 1]
//       (index NONE for an empty or all-NaN slice);
//   argmax: out[0] = the index of the best of the `groups` pairs in part.
// bindings: 0 params {n, groups}, PARTIAL: 1 x: [n], 2 part: array<u32> [2 groups];
//           otherwise 1 part, 2 out: array<u32> (read_write)
// dispatch: PARTIAL: `groups` = ceil(n / CHUNK) workgroups; argmax: one;
//           256 threads each

struct Params { n: u32, groups: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
#if PARTIAL
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> part: array<u32>;
#else
@group(0) @binding(1) var<storage, read> part: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
#endif

const CHUNK: u32 = 1024u;
const NONE: u32 = 0xffffffffu;

var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;

// (v, i) beats (w, j): strictly greater, or the same value earlier; an empty
// slot (index NONE) loses to anything.
fn better(v: f32, i: u32, w: f32, j: u32) -> bool {
    if (i == NONE) {
        return false;
    }
    if (j == NONE) {
        return true;
    }
    return v > w || (v == w && i < j);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    var v = 0.0;
    var i = NONE;
#if PARTIAL
    let end = min(p.n, (wid.x + 1u) * CHUNK);
    for (var j = wid.x * CHUNK + lid; j < end; j += 256u) {
        let xj = x[j];
        if (xj == xj && better(xj, j, v, i)) {
            v = xj;
            i = j;
        }
    }
#else
    for (var g = lid; g < p.groups; g += 256u) {
        let vg = bitcast<f32>(part[2u * g]);
        let ig = part[2u * g + 1u];
        if (better(vg, ig, v, i)) {
            v = vg;
            i = ig;
        }
    }
#endif
    bv[lid] = v;
    bi[lid] = i;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s && better(bv[lid + s], bi[lid + s], bv[lid], bi[lid])) {
            bv[lid] = bv[lid + s];
            bi[lid] = bi[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
#if PARTIAL
        part[2u * wid.x] = bitcast<u32>(bv[0]);
        part[2u * wid.x + 1u] = bi[0];
#else
        out[0] = select(bi[0], 0u, bi[0] == NONE);
#endif
    }
}
