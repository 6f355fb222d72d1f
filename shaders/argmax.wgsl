// argmax: out[0] = the index of the largest of x[0..n], the first one on
// ties (torch.argmax, cpu::argmax); NaNs are never chosen over a number.
// bindings: 0 params {n}, 1 x: [n], 2 out: array<u32> (read_write)
// dispatch: one workgroup of 256 threads

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;

const NONE: u32 = 0xffffffffu;

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
fn main(@builtin(local_invocation_index) lid: u32) {
    var v = 0.0;
    var i = NONE;
    for (var j = lid; j < p.n; j += 256u) {
        let xj = x[j];
        if (xj == xj && better(xj, j, v, i)) {
            v = xj;
            i = j;
        }
    }
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
        out[0] = select(bi[0], 0u, bi[0] == NONE);
    }
}
